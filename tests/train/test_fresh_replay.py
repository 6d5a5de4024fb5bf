"""FreshReplay: informative groups stored, drawn by freshness-decayed priority, PER weights in
the replay batch, exact resume."""

import numpy as np
import pytest

from rljax.data.samplers.fresh_per import FreshPERSettings
from rljax.train.fresh_replay import FreshReplay
from rljax.train.host_batch import HostBatch

G, T = 2, 3


def fresh_batch(group_rewards, first_id):
    """A batch of len(group_rewards) groups; group i's tokens are all first_id + i."""
    n = len(group_rewards)
    ids = np.repeat(first_id + np.arange(n), G)
    rows = {
        "prompt_tokens": np.repeat(ids[:, None], 2, axis=1).astype(np.int32),
        "prompt_mask": np.ones((n * G, 2), bool),
        "completion_tokens": np.repeat(ids[:, None], T, axis=1).astype(np.int32),
        "completion_mask": np.ones((n * G, T), bool),
        "rollout_logprobs": -np.ones((n * G, T), np.float32),
        "rewards": np.asarray(group_rewards, np.float32).reshape(-1),
        "prompt_id": ids,
    }
    return HostBatch(rows, G)


def test_only_informative_groups_are_stored_with_mean_abs_reward_priority():
    replay = FreshReplay(FreshPERSettings(capacity=10), G, groups=2, every=1, seed=0)
    replay.add(1, fresh_batch([[1, 0], [1, 1], [0, 0], [-1, 0.5]], first_id=10))
    assert len(replay) == 2  # the all-equal groups (11, 12) carry no signal
    np.testing.assert_array_equal(replay.buffer.item_ids, [10, 13])
    np.testing.assert_allclose(replay.buffer.rewards, [0.5, 0.75])
    np.testing.assert_array_equal(replay.buffer.stored_steps, [1, 1])


def test_replay_draws_by_the_fresh_priority_and_weights_rows_by_per_is_weights():
    s = FreshPERSettings(
        capacity=10, tau=2.0, alpha=0.6, beta_start=0.5, beta_end=1.0, beta_steps=10
    )
    replay = FreshReplay(s, G, groups=400, every=1, seed=0)
    replay.add(0, fresh_batch([[1, 0]], first_id=0))  # priority 0.5, age 4 at step 4
    replay.add(3, fresh_batch([[1, 0], [1, 0.5]], first_id=1))  # 0.5 and 0.75, age 1
    rows, metrics = replay.batch(4)
    batch = rows.to_batch()
    # The paper's formula by hand: p = (|r| + eps) exp(-age / tau), P = p^alpha / sum.
    p = (np.array([0.5, 0.5, 0.75]) + 1e-6) * np.exp(-np.array([4, 1, 1]) / 2.0)
    probs = p**0.6 / (p**0.6).sum()
    groups = np.asarray(batch.completion_tokens)[::G, 0]  # which stored group each row pair is
    share = np.bincount(groups, minlength=3) / len(groups)
    np.testing.assert_allclose(share, probs, atol=0.07)
    beta = 0.5 + 0.5 * 4 / 10
    w = (3 * probs) ** -beta
    w = w / w[np.unique(groups)].max()  # normalised by the largest weight drawn
    want = np.repeat(w[groups], G)[:, None] * np.ones((1, T))
    np.testing.assert_allclose(np.asarray(batch.extras["is_weight"]), want, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(batch.group_id), np.repeat(np.arange(400), G))
    np.testing.assert_array_equal(np.asarray(batch.rollout_logprobs), -np.ones((400 * G, T)))
    assert metrics["replay/buffer"] == 3
    np.testing.assert_allclose(metrics["replay/age_mean"], np.where(groups == 0, 4, 1).mean())


def test_replay_follows_its_schedule_and_waits_for_data():
    replay = FreshReplay(FreshPERSettings(capacity=4), G, groups=2, every=2, seed=0)
    assert replay.batch(2)[0] is None  # empty
    replay.add(1, fresh_batch([[1, 0]], first_id=0))
    assert replay.batch(3)[0] is None  # off schedule
    assert replay.batch(4)[0].rows["rewards"].shape == (2 * G,)
    with pytest.raises(ValueError, match="groups=0"):
        FreshReplay(FreshPERSettings(), G, groups=0, every=1, seed=0)


def test_state_resumes_exactly_and_the_fifo_keeps_the_newest_groups():
    def filled():
        replay = FreshReplay(FreshPERSettings(capacity=3), G, groups=5, every=1, seed=3)
        for step in range(4):
            replay.add(step, fresh_batch([[1, 0], [0, 0.5]], first_id=2 * step))
        return replay

    straight = filled()
    np.testing.assert_array_equal(straight.buffer.item_ids, [5, 6, 7])
    resumed = FreshReplay(FreshPERSettings(capacity=3), G, groups=5, every=1, seed=3)
    resumed.load(filled().state())
    a, b = (replay.batch(9)[0].to_batch() for replay in (straight, resumed))
    np.testing.assert_array_equal(np.asarray(a.completion_tokens), np.asarray(b.completion_tokens))
    np.testing.assert_array_equal(
        np.asarray(a.extras["is_weight"]), np.asarray(b.extras["is_weight"])
    )
