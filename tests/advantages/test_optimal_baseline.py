"""Tests for rljax.advantages.optimal_baseline against a loop-based numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.group import grpo_advantages
from rljax.advantages.optimal_baseline import length_weighted_baseline_advantages, opo_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, -1.0], np.float32)
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)
LENGTHS = MASK.sum(axis=1)


def reference(rewards, lengths, g):
    """b = sum L r / sum L per group (0 advantage if sum L = 0), by explicit loops."""
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), g):
        num = sum(float(lengths[i]) * float(rewards[i]) for i in range(start, start + g))
        den = sum(float(lengths[i]) for i in range(start, start + g))
        for i in range(start, start + g):
            out[i] = float(rewards[i]) - num / den if den > 0 else 0.0
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
    out = opo_advantages(jnp.array(REWARDS), jnp.array(LENGTHS), g)
    np.testing.assert_allclose(out, reference(REWARDS, LENGTHS, g), rtol=1e-5, atol=1e-6)


def test_hand_value():
    # Rewards [1, 0], lengths [3, 1]: b = 3/4.
    out = opo_advantages(jnp.array([1.0, 0.0]), jnp.array([3, 1]), 2)
    np.testing.assert_allclose(out, [0.25, -0.75], rtol=1e-6)


def test_equal_lengths_is_dr_grpo():
    lengths = jnp.full(8, 5)
    out = opo_advantages(jnp.array(REWARDS), lengths, 4)
    expected = grpo_advantages(jnp.array(REWARDS), 4, normalize_std=False)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_zero_lengths_and_all_equal_give_exact_zero():
    rewards = jnp.array([1.0, 0.0, 0.1, 0.1, 1.0, 0.0], jnp.float32)
    lengths = jnp.array([0, 0, 3, 1, 0, 2])
    out = np.asarray(opo_advantages(rewards, lengths, 2))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:4], 0.0)
    # A zero-length sample has no weight in the baseline: b = 0, so A = r.
    np.testing.assert_allclose(out[4:], [1.0, 0.0])


def test_errors():
    with pytest.raises(ValueError, match="group_size=1.*at least 2"):
        opo_advantages(jnp.zeros(4), jnp.ones(4), 1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        opo_advantages(jnp.zeros(4), jnp.ones(4), 3)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        opo_advantages(jnp.zeros(4), jnp.array([1, -1, 2, 2]), 2)
    with pytest.raises(ValueError, match="group_size=1"):
        length_weighted_baseline_advantages(1)
    t = length_weighted_baseline_advantages(2)
    batch = make(REWARDS, MASK, 2)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.array([0, 1, 0, 1, 2, 3, 2, 3])), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((8, 2))), (), CTX)


def test_jit():
    out = jax.jit(opo_advantages, static_argnums=(2,))(jnp.array(REWARDS), jnp.array(LENGTHS), 4)
    np.testing.assert_allclose(out, reference(REWARDS, LENGTHS, 4), rtol=1e-5, atol=1e-6)


def test_transform_writes_token_advantages_and_metrics():
    t = length_weighted_baseline_advantages(4)
    batch, state, metrics = jax.jit(t.apply)(make(REWARDS, MASK, 4), t.init(), CTX)
    seq = reference(REWARDS, LENGTHS, 4)
    expected = np.zeros(MASK.shape)
    valid = []
    for i in range(MASK.shape[0]):
        for j in range(MASK.shape[1]):
            if MASK[i, j]:
                expected[i, j] = seq[i]
                valid.append(seq[i])
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    assert state == ()
    np.testing.assert_allclose(metrics["opo/advantages/mean"], np.mean(valid), atol=1e-6)
    np.testing.assert_allclose(metrics["opo/advantages/std"], np.std(valid), rtol=1e-5)
    # Baselines: group 0 (lengths 2, 1, 3, 0) -> 2/6; group 1 (1, 2, 3, 1) -> 3.5/7.
    np.testing.assert_allclose(metrics["opo/baseline_mean"], (1 / 3 + 1 / 2) / 2, rtol=1e-6)
    assert metrics["opo/zero_std_frac"] == 0.0
    assert not any(k.startswith("advantages/") for k in metrics)


APPLY = jax.jit(length_weighted_baseline_advantages(4).apply)
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
    # The length-weighted advantages sum to 0 in each group: sum_i L_i A_i = 0.
    seq = np.asarray(opo_advantages(jnp.array(rewards), jnp.array(mask.sum(1)), 4))
    np.testing.assert_allclose((seq * mask.sum(1)).reshape(2, 4).sum(axis=1), 0, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(REWARD_VALUES, st.lists(st.booleans(), min_size=8, max_size=8))
def test_all_equal_rewards_and_length_one_rows(value, mask):
    mask = np.array(mask).reshape(8, 1)
    batch, _, metrics = APPLY(make(np.full(8, value, np.float32), mask, 4), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["opo/zero_std_frac"] == 1.0


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8), st.lists(st.booleans(), min_size=8, max_size=8)
)
def test_length_one_and_masked_rows_match_reference(rewards, mask):
    rewards = np.array(rewards, np.float32)
    mask = np.array(mask).reshape(8, 1)
    batch, _, metrics = APPLY(make(rewards, mask, 4), (), CTX)
    adv = np.asarray(batch.advantages)
    assert np.all(np.isfinite(adv)) and all(np.isfinite(v) for v in metrics.values())
    np.testing.assert_allclose(
        adv[:, 0], reference(rewards, mask.sum(1), 4) * mask[:, 0], atol=1e-5
    )
