"""SelectedPromptBatches: prompts picked by a selector (HeaPA, the curriculum), rewards fed
back, exact resume."""

import json

import numpy as np
import pytest

from rljax.data import AdditionTask, prompt_dataset
from rljax.data.samplers.curriculum import CurriculumSettings
from rljax.data.selected import CurriculumSelector, HeaPASelector, SelectedPromptBatches
from rljax.models.tokenizer import ByteTokenizer

POOL, K, G = 16, 4, 2
DATASET = prompt_dataset(
    AdditionTask(),
    "train",
    ByteTokenizer(),
    10,
    seed=None,
    num_examples=POOL,
    shard_index=0,
    shard_count=1,
)


def batches(seed=0):
    return SelectedPromptBatches(DATASET, HeaPASelector(POOL, seed), K)


def rewards_for(positions):
    """A fixed difficulty per prompt: mean reward = position / POOL (both samples equal)."""
    r = np.asarray(positions, np.float64) / POOL
    return np.stack([r] * G, axis=1)


def drive(it, steps):
    picked = []
    for _ in range(steps):
        batch = next(it)
        picked.append(batch["position"].tolist())
        it.feedback(batch, rewards_for(batch["position"]))
    return picked


def test_every_prompt_is_scored_once_then_batches_come_from_the_median_boundary():
    it = batches()
    first = drive(it, POOL // K)
    assert sorted(sum(first, [])) == list(range(POOL))  # cold prompts first, FIFO
    batch = next(it)
    np.testing.assert_array_equal(batch["index"], batch["position"])  # unshuffled pool
    for key in ("prompt_tokens", "prompt_mask", "answer"):
        want = np.stack([DATASET[int(i)][key] for i in batch["position"]])
        np.testing.assert_array_equal(batch[key], want)
    # Rewards i / 16: the 2K = 8 prompts nearest the median are positions 4..11.
    assert set(batch["position"].tolist()) <= set(range(4, 12))
    m = it.metrics()
    assert m["selection/cold"] == 0
    assert 4 / POOL <= m["selection/boundary"] <= 11 / POOL


def test_state_is_json_and_resumes_exactly():
    straight = batches(seed=3)
    drive(straight, 6)
    state = json.loads(json.dumps(straight.get_state()))
    want = drive(straight, 5)
    resumed = batches(seed=3)
    resumed.set_state(state)
    assert drive(resumed, 5) == want


def test_a_pool_smaller_than_a_batch_is_named():
    it = SelectedPromptBatches(DATASET, HeaPASelector(3, 0), K)
    with pytest.raises(ValueError, match="raise prompt_selection.pool_size"):
        next(it)


def test_curriculum_selects_the_frontier_level_and_advances_on_accuracy():
    difficulty = np.array([AdditionTask().difficulty(i, "train") for i in range(POOL)])
    levels = np.searchsorted(np.unique(difficulty), difficulty)
    settings = CurriculumSettings(threshold=0.5, decay=0.0, review=0.25, min_updates=1)
    it = SelectedPromptBatches(DATASET, CurriculumSelector(difficulty, 0, settings), K)
    batch = next(it)
    assert (levels[batch["position"]] == 0).all()  # frontier 0, nothing below it to review
    assert it.metrics()["selection/frontier"] == 0
    it.feedback(batch, np.ones((K, G)))  # all correct: the EMA (decay 0) reaches 1 >= 0.5
    assert it.metrics() == {"selection/frontier": 1.0, "selection/frontier_accuracy": 0.0}
    picked = np.concatenate([next(it)["position"] for _ in range(50)])
    share = np.bincount(levels[picked], minlength=levels.max() + 1) / len(picked)
    np.testing.assert_allclose(share[:2], [0.25, 0.75], atol=0.08)  # review share, frontier
    state = json.loads(json.dumps(it.get_state()))
    want = next(it)["position"]
    fresh = SelectedPromptBatches(DATASET, CurriculumSelector(difficulty, 0, settings), K)
    fresh.set_state(state)
    np.testing.assert_array_equal(next(fresh)["position"], want)
