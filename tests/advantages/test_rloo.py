"""Tests for rljax.advantages.rloo against a loop-based numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.rloo import leave_one_out_advantages, rloo_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, -1.0], np.float32)
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)


def reference(rewards, g):
    """A_i = r_i - mean of the other G - 1 rewards of i's group, by explicit loops."""
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), g):
        for i in range(start, start + g):
            others = [float(rewards[j]) for j in range(start, start + g) if j != i]
            out[i] = float(rewards[i]) - sum(others) / len(others)
    return out


def make(rewards, mask, g):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
    )


@pytest.mark.parametrize("g", [2, 4, 8])
def test_matches_reference(g):
    out = rloo_advantages(jnp.array(REWARDS), g)
    np.testing.assert_allclose(out, reference(REWARDS, g), rtol=1e-5, atol=1e-6)


def test_hand_value():
    # Group [1, 0, 0, 1]: a correct sample's baseline is 1/3, an incorrect one's 2/3.
    out = rloo_advantages(jnp.array([1.0, 0.0, 0.0, 1.0]), 4)
    np.testing.assert_allclose(out, [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)


def test_all_equal_group_gives_exact_zero():
    rewards = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 0.0], jnp.float32)
    out = np.asarray(rloo_advantages(rewards, 3))
    np.testing.assert_array_equal(out[:6], 0.0)
    np.testing.assert_allclose(out[6:], [-0.5, 1.0, -0.5], rtol=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="group_size=1.*at least 2"):
        rloo_advantages(jnp.zeros(4), 1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        rloo_advantages(jnp.zeros(4), 3)
    with pytest.raises(ValueError, match="group_size=1"):
        leave_one_out_advantages(1)
    t = leave_one_out_advantages(2)
    batch = make(REWARDS, MASK, 2)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.array([0, 1, 0, 1, 2, 3, 2, 3])), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((8, 2))), (), CTX)


def test_jit():
    out = jax.jit(rloo_advantages, static_argnums=(1,))(jnp.array(REWARDS), 4)
    np.testing.assert_allclose(out, reference(REWARDS, 4), rtol=1e-5, atol=1e-6)


def test_transform_writes_token_advantages_and_metrics():
    rewards = REWARDS.copy()
    rewards[4:] = 3.0  # second group has zero reward variance
    t = leave_one_out_advantages(4)
    batch, state, metrics = jax.jit(t.apply)(make(rewards, MASK, 4), t.init(), CTX)
    seq = reference(rewards, 4)
    expected = np.zeros(MASK.shape)
    valid = []
    for i in range(MASK.shape[0]):
        for j in range(MASK.shape[1]):
            if MASK[i, j]:
                expected[i, j] = seq[i]
                valid.append(seq[i])
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    assert state == ()
    np.testing.assert_allclose(metrics["rloo/advantages/mean"], np.mean(valid), atol=1e-6)
    np.testing.assert_allclose(metrics["rloo/advantages/std"], np.std(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["rloo/advantages/min"], min(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["rloo/advantages/max"], max(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["rloo/zero_std_frac"], 0.5)
    assert not any(k.startswith("advantages/") for k in metrics)


APPLY = jax.jit(leave_one_out_advantages(4).apply)
REWARD_VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=24, max_size=24),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(rewards, mask, p0, p1):
    rewards = np.array(rewards, np.float32)
    mask = np.array(mask).reshape(8, 3)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv = np.asarray(APPLY(make(rewards, mask, 4), (), CTX)[0].advantages)
    adv_p = np.asarray(APPLY(make(rewards[perm], mask[perm], 4), (), CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)
    np.testing.assert_allclose(
        np.asarray(rloo_advantages(jnp.array(rewards), 4)).reshape(2, 4).sum(axis=1), 0, atol=1e-5
    )


@settings(max_examples=25, deadline=None)
@given(REWARD_VALUES, st.lists(st.booleans(), min_size=8, max_size=8))
def test_all_equal_rewards_and_length_one_rows(value, mask):
    # T = 1: every row is a length-1 response or fully masked.
    mask = np.array(mask).reshape(8, 1)
    batch, _, metrics = APPLY(make(np.full(8, value, np.float32), mask, 4), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["rloo/zero_std_frac"] == 1.0
