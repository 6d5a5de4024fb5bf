"""The UEC-RL collector: exploration of hard prompts, the batch buffer, replay, its state."""

import numpy as np
import pytest

from rljax.entropy.uec import UECSettings
from rljax.models.tokenizer import ByteTokenizer
from rljax.rollout.sampler import Rollout
from rljax.train.uec import UECCollector

TOKENIZER = ByteTokenizer()
EOS = TOKENIZER.eos_id
A, B = 97, 98  # "a" (correct) and "b"


class StartsWithA:
    def reward(self, completion: str, answer: str) -> float:
        return float(completion.startswith(answer))


def prompts(indices):
    n = len(indices)
    return {
        "prompt_tokens": np.asarray(indices, np.int32)[:, None] + np.zeros((n, 2), np.int32),
        "prompt_mask": np.ones((n, 2), bool),
        "answer": np.tile(np.frombuffer(b"a\0", np.uint8), (n, 1)),
        "answer_len": np.ones(n, np.int32),
        "index": np.asarray(indices, np.int64),
    }


def fake_rollout(samples, completion, calls):
    """Row j of the prompt whose index is i gets `completion(i, j)` (two tokens)."""

    def run(state, tokens, mask, attempt=0):
        ids = np.asarray(tokens)[:, 0]
        calls.append(len(ids))
        comp = np.array([completion(int(i), j) for i in ids for j in range(samples)], np.int32)
        n = len(comp)
        return Rollout(
            prompt_tokens=np.repeat(np.asarray(tokens), samples, 0),
            prompt_mask=np.repeat(np.asarray(mask), samples, 0),
            completion_tokens=comp,
            completion_mask=np.ones((n, 2), bool),
            sampling_logprobs=np.full((n, 2), -0.5, np.float32),
            policy_logprobs=np.full((n, 2), -0.5, np.float32),
            group_id=np.arange(n) // samples,
        )

    return run


def base_completion(i, j):
    # prompt 0: one success (A = +-0.707); 1: all succeed (dropped); 2, 3: hard (all fail);
    # prompt 4: one truncated success ("aa" without EOS, A > 0: dropped) and one failure.
    if i == 0:
        return [A, EOS] if j == 0 else [B, EOS]
    if i == 1:
        return [A, EOS]
    if i == 4:
        return [A, A] if j == 0 else [B, EOS]
    return [B, EOS]


def explore_completion(i, j):
    return [A, EOS] if (i == 2 and j == 0) else [B, EOS]  # prompt 2: 1 success in 4


def make_driver(
    data=(), base_calls=None, explore_calls=None, batch_rows=8, prompt_multiple=1, **settings
):
    """A collector over `data` with the fake base (2 samples) and exploration (4) samplers."""
    settings = UECSettings(explore_samples=4, **settings)
    return UECCollector(
        settings,
        iter(data),
        fake_rollout(2, base_completion, [] if base_calls is None else base_calls),
        fake_rollout(4, explore_completion, [] if explore_calls is None else explore_calls),
        StartsWithA(),
        TOKENIZER,
        2,
        batch_rows,
        seed=0,
        prompt_multiple=prompt_multiple,
    )


def collect(driver, step=1):
    """(fresh device batches, metrics) of one round."""
    fresh, _, metrics = driver.collect(None, step)
    return [b.to_batch() for b in fresh], metrics


def test_one_round_selects_what_efframe_keeps():
    base_calls, explore_calls = [], []
    driver = make_driver([prompts([0, 1, 2, 3, 4])], base_calls, explore_calls)
    batches, metrics = collect(driver)
    assert batches == [] and metrics["uec/updates"] == 0
    assert metrics["uec/hard_frac"] == pytest.approx(2 / 5)
    # The two hard prompts are explored (padded to a power of two: 2 prompts).
    assert explore_calls == [2]
    kept = driver.batch_buffer.rows
    # Prompt 0's two samples (|A| = 0.707 > 0.05), prompt 4's failure (A = -0.707), and
    # prompt 2's one exploration success (A = (1 - 0.25) / 0.5 = 1.5 > 1).
    np.testing.assert_array_equal(kept["prompt_id"], [0, 0, 4, 2])
    np.testing.assert_allclose(
        kept["sequence_advantage"], [0.7071, -0.7071, -0.7071, 1.5], atol=1e-3
    )
    assert metrics["uec/truncated_positive_dropped"] == 1
    assert metrics["uec/explore_kept"] == 1
    assert metrics["accuracy"] == pytest.approx(4 / 10)  # ordinary samples only


def test_batches_fill_up_across_rounds_and_feed_replay():
    data = [prompts([0, 1, 2, 3, 4]), prompts([0, 2]), prompts([0, 2])]
    driver = make_driver(data, batch_rows=6)
    run = lambda: collect(driver)  # noqa: E731
    assert run()[0] == []  # 4 kept
    batches, metrics = run()  # +3 = 7 >= 6: one batch, one row left
    assert len(batches) == 1 and batches[0].rewards.shape == (6,)
    assert metrics["uec/batch_buffer"] == 1
    np.testing.assert_array_equal(batches[0].extras["prompt_id"], [0, 0, 4, 2, 0, 0])
    # Only |A| > 1 samples are replayed: the exploration success of prompt 2.
    assert len(driver.replay_buffer) == 1
    assert driver.replay_buffer.rows["sequence_advantage"][0] == pytest.approx(0.75 / (0.5 + 1e-6))


def test_replay_fires_every_replay_every_steps_with_whole_batches():
    driver = make_driver(batch_rows=2, replay_every=5, replay_capacity=2.0)
    rows = lambda n: {
        "prompt_tokens": np.zeros((n, 2), np.int32),
        "prompt_mask": np.ones((n, 2), bool),
        "completion_tokens": np.zeros((n, 2), np.int32),
        "completion_mask": np.ones((n, 2), bool),
        "rollout_logprobs": np.zeros((n, 2), np.float32),
        "rewards": np.ones(n, np.float32),
        "sequence_advantage": np.arange(n, dtype=np.float32) + 2,
        "prompt_id": np.arange(n, dtype=np.int32),
    }
    driver.replay_buffer.add(rows(1))
    assert driver.replay_batches(5) == []  # fewer rows than a batch
    driver.replay_buffer.add(rows(2))  # 3 rows: one whole batch, sampled
    assert [driver.replay_batches(s) for s in (1, 2, 3, 4)] == [[], [], [], []]
    got = driver.replay_batches(5)
    assert len(got) == 1 and got[0].rows["rewards"].shape == (2,)
    driver.replay_buffer.add(rows(2))  # 5 rows, capacity 4: the oldest falls out
    got = driver.replay_batches(10)  # full: replayed whole, oldest first
    assert len(got) == 2
    np.testing.assert_array_equal(got[0].rows["sequence_advantage"], [2, 3])
    np.testing.assert_array_equal(got[1].rows["sequence_advantage"], [2, 3])


def test_state_round_trip():
    driver = make_driver([prompts([0, 1, 2, 3, 4])])
    collect(driver)
    other = make_driver()
    other.load(driver.state())
    for key, value in driver.batch_buffer.rows.items():
        np.testing.assert_array_equal(other.batch_buffer.rows[key], value)
    assert len(other.replay_buffer) == 0


def test_explored_prompts_are_padded_to_the_device_multiple():
    calls = []
    data = [prompts([2, 0, 1, 5, 6, 7, 8, 9])]  # 6 hard prompts -> 8 explored
    driver = make_driver(data, explore_calls=calls, prompt_multiple=4)
    collect(driver)
    assert calls == [8]
    assert driver.batch_buffer.rows["prompt_id"].tolist().count(2) == 1
