"""UEC-RL's selection rules and the host-advantage transform."""

import jax
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.entropy.uec import (
    UECSettings,
    hard_prompts,
    host_advantages,
    keep_samples,
    truncated_rows,
)


def test_hard_prompts_are_groups_without_any_reward():
    rewards = np.array([0, 0, 0, 1, 0, 0.005, 1, 1], np.float32)
    np.testing.assert_array_equal(hard_prompts(rewards, 2, 0.01), [True, False, True, False])
    with pytest.raises(ValueError, match="group_size=3"):
        hard_prompts(rewards, 3, 0.01)


def test_truncated_rows_filled_the_budget_without_eos():
    eos = 9
    tokens = np.array([[1, 9, 0], [1, 2, 3], [1, 2, 9], [4, 0, 0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]], bool)
    np.testing.assert_array_equal(truncated_rows(tokens, mask, eos), [False, True, False, False])


def test_keep_samples_thresholds_and_truncated_positives():
    adv = np.array([0.04, -0.06, 0.5, 0.5, -2.0, 0.0])
    truncated = np.array([False, False, False, True, True, False])
    np.testing.assert_array_equal(
        keep_samples(adv, truncated, 0.05), [False, True, True, False, True, False]
    )
    np.testing.assert_array_equal(
        keep_samples(adv, truncated, 0.05, drop_truncated_positive=False),
        [False, True, True, True, True, False],
    )
    np.testing.assert_array_equal(
        keep_samples(adv, truncated, 1.0), [False, False, False, False, True, False]
    )


def test_settings_validation():
    UECSettings()
    with pytest.raises(ValueError, match="explore_samples=1"):
        UECSettings(explore_samples=1)
    with pytest.raises(ValueError, match="replay_every=0"):
        UECSettings(replay_every=0)
    with pytest.raises(ValueError, match="replay_capacity=0.5"):
        UECSettings(replay_capacity=0.5)
    with pytest.raises(ValueError, match="keep_threshold=-1"):
        UECSettings(keep_threshold=-1)


def test_host_advantages_broadcast_over_valid_tokens():
    mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    batch = make_batch(
        np.zeros((2, 1)),
        np.ones((2, 1)),
        np.zeros((2, 3)),
        mask,
        np.arange(2),
        np.zeros(2),
        extras={"sequence_advantage": np.array([1.5, -2.0], np.float32)},
    )
    transform = host_advantages()
    ctx = Context(step=np.int32(0), rng=jax.random.PRNGKey(0))
    out, _, metrics = jax.jit(transform.apply)(batch, transform.init(), ctx)
    np.testing.assert_allclose(out.advantages, [[1.5, 1.5, 0], [-2.0, 0, 0]])
    np.testing.assert_allclose(metrics["advantages/max"], 1.5)
    with pytest.raises(ValueError, match="sequence_advantage"):
        transform.apply(batch.replace(extras={}), (), ctx)
