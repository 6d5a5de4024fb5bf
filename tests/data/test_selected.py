"""SelectedPromptBatches: prompts picked by a selector (HeaPA, DARE, the curriculum), rewards
fed back, exact resume."""

import json

import numpy as np
import pytest

from rljax.data import AdditionTask, prompt_dataset
from rljax.data.samplers.curriculum import CurriculumSettings
from rljax.data.samplers.dare import DARESettings
from rljax.data.selected import (
    CurriculumSelector,
    DAREPromptSelector,
    HeaPASelector,
    SelectedPromptBatches,
)
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
        it.feedback(batch, rewards_for(batch["position"]), {})
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
    it.feedback(batch, np.ones((K, G)), {})  # all correct: the EMA (decay 0) reaches 1 >= 0.5
    assert it.metrics() == {"selection/frontier": 1.0, "selection/frontier_accuracy": 0.0}
    picked = np.concatenate([next(it)["position"] for _ in range(50)])
    share = np.bincount(levels[picked], minlength=levels.max() + 1) / len(picked)
    np.testing.assert_allclose(share[:2], [0.25, 0.75], atol=0.08)  # review share, frontier
    state = json.loads(json.dumps(it.get_state()))
    want = next(it)["position"]
    fresh = SelectedPromptBatches(DATASET, CurriculumSelector(difficulty, 0, settings), K)
    fresh.set_state(state)
    np.testing.assert_array_equal(next(fresh)["position"], want)


class FakePolicy:
    """log pi(y_t) = -theta * (1 + y_t % 3) on real completion tokens: a policy whose sequence
    log-probs move with theta, computed in numpy (the rescored values are checked by hand)."""

    def __init__(self, theta):
        self.theta = theta
        self.calls = []

    def __call__(self, prompt_tokens, prompt_mask, completion_tokens, completion_mask):
        self.calls.append(completion_tokens.shape[0])
        y = np.asarray(completion_tokens)
        return np.where(np.asarray(completion_mask), -self.theta * (1 + y % 3), 0.0)


def fake_rollouts(positions, rng, t=3):
    n = len(positions) * G
    return {
        "prompt_tokens": np.zeros((n, 2), np.int32),
        "prompt_mask": np.ones((n, 2), bool),
        "completion_tokens": rng.integers(0, 9, (n, t)).astype(np.int32),
        "completion_mask": rng.random((n, t)) < 0.8,
    }


def test_dare_rates_are_the_self_normalised_is_estimate_under_the_current_policy():
    settings = DARESettings(capacity=64, clip=5.0, ess_threshold=1.0)
    policy = FakePolicy(theta=1.0)
    it = SelectedPromptBatches(DATASET, DAREPromptSelector(POOL, 0, settings, chunk_rows=5), K)
    it.set_policy(policy)
    rng = np.random.default_rng(0)
    log = []  # (prompt, completion tokens, mask, reward) of every rollout fed back
    for _ in range(3):
        batch = next(it)
        rollouts = fake_rollouts(batch["position"], rng)
        rewards = rng.integers(0, 2, (K, G)).astype(np.float64)
        it.feedback(batch, rewards, rollouts)
        for j, p in enumerate(np.repeat(batch["position"], G)):
            tokens, mask = rollouts["completion_tokens"][j], rollouts["completion_mask"][j]
            log.append((p, tokens, mask, rewards.reshape(-1)[j]))
    assert set(policy.calls) == {5}  # every rescoring call has the fixed chunk shape
    policy.theta = 1.3  # the policy moves; the next select re-estimates under it
    next(it)
    # Independent estimate: w = exp(clip(sum_t (log pi_cur - log pi_beh))) per rollout.
    num, den = np.zeros(POOL), np.zeros(POOL)
    for p, tokens, mask, r in log:
        base = (mask * (1 + tokens % 3)).sum()
        w = np.exp(np.clip(-1.3 * base + 1.0 * base, -5.0, 5.0))
        num[p] += w * (r > 0)
        den[p] += w
    want = np.where(den > 0, num / np.where(den > 0, den, 1.0), settings.default_rate)
    np.testing.assert_allclose(it.selector.rates, want, rtol=1e-10)
    m = it.metrics()
    assert m["selection/replay"] == 3 * K * G
    assert m["selection/seen_frac"] == len({p for p, *_ in log}) / POOL


def test_dare_scores_fed_back_rollouts_with_the_sampler_policy():
    """Bounded staleness: rollouts sampled by an older policy get weight pi_cur / pi_sampler."""
    settings = DARESettings(capacity=64, clip=5.0, ess_threshold=1.0)
    it = SelectedPromptBatches(DATASET, DAREPromptSelector(POOL, 0, settings, chunk_rows=5), K)
    it.set_policy(FakePolicy(theta=1.2), behaviour=FakePolicy(theta=1.0))
    rng = np.random.default_rng(3)
    batch = next(it)
    rollouts = fake_rollouts(batch["position"], rng)
    rewards = rng.integers(0, 2, (K, G)).astype(np.float64)
    it.feedback(batch, rewards, rollouts)
    next(it)  # re-estimates under the current policy (theta 1.2)
    num, den, hits, count = (np.zeros(POOL) for _ in range(4))
    for j, p in enumerate(np.repeat(batch["position"], G)):
        mask, tokens = rollouts["completion_mask"][j], rollouts["completion_tokens"][j]
        base = (mask * (1 + tokens % 3)).sum()
        w = np.exp(np.clip(-1.2 * base + 1.0 * base, -5.0, 5.0))
        num[p] += w * (rewards.reshape(-1)[j] > 0)
        den[p] += w
        hits[p] += rewards.reshape(-1)[j] > 0
        count[p] += 1
    seen = den > 0
    want = np.where(seen, num / np.where(seen, den, 1.0), settings.default_rate)
    np.testing.assert_allclose(it.selector.rates, want, rtol=1e-10)
    # Scored with the current policy at feedback, every weight would be 1: the plain rate.
    assert not np.allclose(want[seen], hits[seen] / count[seen])


def test_dare_state_is_json_and_resumes_exactly():
    settings = DARESettings(capacity=20)  # smaller than the 3 x 8 rollouts: the FIFO drops

    def run(it, steps, rng):
        picked = []
        for _ in range(steps):
            batch = next(it)
            picked.append(batch["position"].tolist())
            it.feedback(
                batch,
                rng.integers(0, 2, (K, G)).astype(float),
                fake_rollouts(batch["position"], rng),
            )
        return picked

    def fresh():
        it = SelectedPromptBatches(DATASET, DAREPromptSelector(POOL, 7, settings, 8), K)
        it.set_policy(FakePolicy(0.5))
        return it

    straight = fresh()
    run(straight, 3, np.random.default_rng(1))
    state = json.loads(json.dumps(straight.get_state()))
    want = run(straight, 3, np.random.default_rng(2))
    resumed = fresh()
    resumed.set_state(state)
    assert run(resumed, 3, np.random.default_rng(2)) == want
