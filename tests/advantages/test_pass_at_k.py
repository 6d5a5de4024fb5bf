"""Tests for rljax.advantages.pass_at_k against brute-force enumeration of k-subsets."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.group import grpo_advantages
from rljax.advantages.pass_at_k import (
    pass_at_k_advantages,
    pass_at_k_group_advantages,
    pass_at_k_values,
)
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
REWARDS = np.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], np.float32)
MASK = np.ones((16, 2), bool)
MASK[3] = False
MASK[5, 1] = False
# Jitted once per (G, k): eager dispatch of the many small ops is slow on a shared CPU.
ADV = jax.jit(pass_at_k_advantages, static_argnums=(1, 2))
VALUES = jax.jit(pass_at_k_values, static_argnums=(1, 2))


def enumerate_group(group, k):
    """Pass@k value and advantages of one group by listing every k-subset.

    A subset's reward is the max reward in it. The value is the mean over all
    subsets; sample i's advantage is the mean over the subsets containing i minus
    that value, over the population std of the subset rewards (0 if that std is 0).
    """
    n = len(group)
    subsets = list(itertools.combinations(range(n), k))
    subset_reward = {s: max(group[i] for i in s) for s in subsets}
    value = sum(subset_reward.values()) / len(subsets)
    std = (sum((v - value) ** 2 for v in subset_reward.values()) / len(subsets)) ** 0.5
    adv = []
    for i in range(n):
        with_i = [subset_reward[s] for s in subsets if i in s]
        adv.append((sum(with_i) / len(with_i) - value) / std if std > 0 else 0.0)
    return value, adv


def enumerate_batch(rewards, n, k):
    values, adv = [], []
    for start in range(0, len(rewards), n):
        v, a = enumerate_group([float(x) for x in rewards[start : start + n]], k)
        values.append(v)
        adv.extend(a)
    return np.array(values), np.array(adv)


def paper_formula(group, k):
    """The closed form as the paper writes it, with math.comb (float64)."""
    n, c = len(group), int(sum(group))
    value = 1 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(value * (1 - value))
    if sigma == 0:
        return [0.0] * n
    pos = (1 - value) / sigma
    neg = (1 - value - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / sigma
    return [pos if r == 1 else neg for r in group]


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


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_matches_enumeration_for_every_pattern(n):
    # Every binary group of size n (all 2^n arrangements, so every c and every position).
    patterns = np.array(list(itertools.product([0.0, 1.0], repeat=n)), np.float32)
    rewards = patterns.reshape(-1)
    for k in range(1, n + 1):
        values, adv = enumerate_batch(rewards, n, k)
        out = ADV(jnp.array(rewards), n, k)
        np.testing.assert_allclose(out, adv, rtol=1e-5, atol=1e-5, err_msg=f"n={n} k={k}")
        np.testing.assert_allclose(VALUES(jnp.array(rewards), n, k), values, rtol=1e-6)
        formula = [a for p in patterns for a in paper_formula([int(x) for x in p], k)]
        np.testing.assert_allclose(formula, adv, rtol=1e-9, atol=1e-12, err_msg=f"n={n} k={k}")


def test_hand_value():
    # n = 4, c = 1, k = 2: 1 - R = C(3,2)/C(4,2) = 1/2, sigma = 1/2; a wrong sample's subsets
    # fail with probability C(2,1)/C(3,1) = 2/3, so A = (1/2 - 2/3) / (1/2) = -1/3.
    out = ADV(jnp.array([1.0, 0.0, 0.0, 0.0]), 4, 2)
    np.testing.assert_allclose(out, [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)


def test_k1_is_grpo_with_population_std():
    out = ADV(jnp.array(REWARDS), 4, 1)
    expected = grpo_advantages(jnp.array(REWARDS), 4, unbiased_std=False)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_fewer_than_k_wrong_gives_zero():
    # n = 8, k = 4, 5 correct: every 4-subset holds a correct sample, so R = 1 and sigma = 0.
    rewards = jnp.array([1, 1, 1, 1, 1, 0, 0, 0], jnp.float32)
    np.testing.assert_array_equal(ADV(rewards, 8, 4), 0.0)
    assert float(VALUES(rewards, 8, 4)[0]) == 1.0


def test_large_group_matches_float64_formula():
    rng = np.random.default_rng(0)
    n = 32
    rewards = (rng.random(4 * n) < np.repeat([0.05, 0.2, 0.5, 0.9], n)).astype(np.float32)
    for k in (1, 4, 16):
        out = np.asarray(ADV(jnp.array(rewards), n, k))
        expected = [
            a for s in range(0, 4 * n, n) for a in paper_formula(list(rewards[s : s + n]), k)
        ]
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5, err_msg=f"k={k}")


def test_errors():
    with pytest.raises(ValueError, match=r"binary rewards.*sample 1 has reward 0.5"):
        pass_at_k_advantages(jnp.array([1.0, 0.5, 0.0, 0.0]), 2, 1)
    with pytest.raises(ValueError, match="k=0 must satisfy"):
        pass_at_k_advantages(jnp.zeros(4), 2, 0)
    with pytest.raises(ValueError, match="k=3 must satisfy"):
        pass_at_k_group_advantages(2, 3)
    with pytest.raises(ValueError, match="group_size=1"):
        pass_at_k_advantages(jnp.zeros(4), 1, 1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        pass_at_k_advantages(jnp.zeros(4), 3, 1)
    t = pass_at_k_group_advantages(4, 2)
    batch = make(REWARDS, MASK, 4)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.arange(16) % 4), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((16, 2))), (), CTX)
    with pytest.raises(ValueError, match="binary rewards"):
        t.apply(batch.replace(rewards=batch.rewards * 0.5), (), CTX)


def test_jit_and_nonbinary_metric():
    fn = jax.jit(pass_at_k_advantages, static_argnums=(1, 2))
    np.testing.assert_allclose(
        fn(jnp.array(REWARDS), 4, 2), enumerate_batch(REWARDS, 4, 2)[1], atol=1e-5
    )
    # Under jit the value check cannot run; the metric shows the non-binary rewards.
    t = pass_at_k_group_advantages(4, 2)
    _, _, metrics = jax.jit(t.apply)(make(REWARDS * 0.5, MASK, 4), (), CTX)
    np.testing.assert_allclose(metrics["pass_at_k/nonbinary_frac"], 7 / 16)


def test_transform_writes_token_advantages_and_metrics():
    t = pass_at_k_group_advantages(4, 2)
    batch, state, metrics = jax.jit(t.apply)(make(REWARDS, MASK, 4), t.init(), CTX)
    values, seq = enumerate_batch(REWARDS, 4, 2)
    expected = np.zeros(MASK.shape)
    valid = []
    for i in range(MASK.shape[0]):
        for j in range(MASK.shape[1]):
            if MASK[i, j]:
                expected[i, j] = seq[i]
                valid.append(seq[i])
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    assert state == ()
    np.testing.assert_allclose(metrics["pass_at_k/advantages/mean"], np.mean(valid), atol=1e-6)
    np.testing.assert_allclose(metrics["pass_at_k/advantages/std"], np.std(valid), rtol=1e-5)
    np.testing.assert_allclose(metrics["pass_at_k/pass_at_k"], values.mean(), rtol=1e-6)
    # Groups: c = 1, 2 (signal), c = 4 and c = 0 (no signal).
    np.testing.assert_allclose(metrics["pass_at_k/zero_signal_frac"], 0.5)
    assert metrics["pass_at_k/nonbinary_frac"] == 0.0
    assert not any(k.startswith("advantages/") for k in metrics)


APPLY = {k: jax.jit(pass_at_k_group_advantages(4, k).apply) for k in (1, 2, 3, 4)}
BINARY = st.sampled_from([0.0, 1.0])


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([1, 2, 3, 4]),
    st.lists(BINARY, min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=24, max_size=24),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(k, rewards, mask, p0, p1):
    rewards = np.array(rewards, np.float32)
    mask = np.array(mask).reshape(8, 3)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv = np.asarray(APPLY[k](make(rewards, mask, 4), (), CTX)[0].advantages)
    adv_p = np.asarray(APPLY[k](make(rewards[perm], mask[perm], 4), (), CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-6)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)
    seq = np.asarray(ADV(jnp.array(rewards), 4, k))
    np.testing.assert_allclose(seq.reshape(2, 4).sum(axis=1), 0.0, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 3, 4]), BINARY, st.lists(st.booleans(), min_size=8, max_size=8))
def test_all_equal_rewards_and_length_one_rows(k, value, mask):
    mask = np.array(mask).reshape(8, 1)
    batch, _, metrics = APPLY[k](make(np.full(8, value, np.float32), mask, 4), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["pass_at_k/zero_signal_frac"] == 1.0
