"""Tests for rljax.advantages.kernel_baseline against a float64 loop reference and its limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.kernel_baseline import kernel_baseline, kernel_baseline_advantages
from rljax.advantages.rloo import rloo_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
RNG = np.random.default_rng(0)
REWARDS = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 2.0, -1.0], np.float32)
EMB = RNG.normal(size=(8, 3)).astype(np.float32)
MASK = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]] * 2, bool)


def reference(rewards, emb, h):
    """Nadaraya-Watson leave-one-out baseline with the kernel written out, in float64."""
    b = len(rewards)
    out = np.zeros(b)
    for i in range(b):
        num = den = 0.0
        for j in range(b):
            if j == i:
                continue
            d2 = sum((float(emb[i, k]) - float(emb[j, k])) ** 2 for k in range(emb.shape[1]))
            k_ij = np.exp(-d2 / (2 * h * h))
            num += k_ij * float(rewards[j])
            den += k_ij
        out[i] = num / den
    return out


def grouped_embeddings(n_groups, g, d=4, spread=3.0):
    """Identical embeddings within a group, distinct (distance >= ~1) across groups."""
    centers = np.eye(n_groups, d) * spread * 3 + np.arange(n_groups)[:, None] * 0.1
    return np.repeat(centers, g, axis=0).astype(np.float32)


def make(rewards, mask, emb, key="prompt_embedding"):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // 4,
        rewards=rewards,
        extras={key: emb},
    )


BASELINE = jax.jit(kernel_baseline, static_argnums=(2,))
APPLY = jax.jit(kernel_baseline_advantages(1.0).apply)


@pytest.mark.parametrize("h", [0.5, 1.0, 3.0])
def test_matches_reference(h):
    out = BASELINE(jnp.array(REWARDS), jnp.array(EMB), h)
    np.testing.assert_allclose(out, reference(REWARDS, EMB, h), rtol=1e-5, atol=1e-6)


def test_hand_value():
    # Three points on a line at 0, 1, 3 with h = 1: K(0,1) = e^-0.5, K(0,3) = e^-4.5,
    # K(1,3) = e^-2. V_0 = (e^-0.5 * 2 + e^-4.5 * 4) / (e^-0.5 + e^-4.5), etc.
    r = jnp.array([0.0, 2.0, 4.0])
    e = jnp.array([[0.0], [1.0], [3.0]])
    a, b, c = np.exp(-0.5), np.exp(-4.5), np.exp(-2.0)
    expected = [(2 * a + 4 * b) / (a + b), (0 * a + 4 * c) / (a + c), (0 * b + 2 * c) / (b + c)]
    np.testing.assert_allclose(kernel_baseline(r, e, 1.0), expected, rtol=1e-5)


@pytest.mark.parametrize("g", [2, 4])
def test_small_bandwidth_is_rloo(g):
    emb = grouped_embeddings(8 // g, g)
    for h in (1e-2, 1e-6, 1e-30):
        adv = REWARDS - np.asarray(BASELINE(jnp.array(REWARDS), jnp.array(emb), h))
        np.testing.assert_allclose(adv, rloo_advantages(jnp.array(REWARDS), g), atol=1e-5)


def test_large_bandwidth_is_leave_one_out_batch_mean():
    loo_mean = (REWARDS.sum() - REWARDS) / (len(REWARDS) - 1)
    for h in (1e4, 1e20):
        out = BASELINE(jnp.array(REWARDS), jnp.array(EMB), h)
        np.testing.assert_allclose(out, loo_mean, rtol=1e-5, atol=1e-6)


def test_fallbacks_stay_finite():
    # B = 1: no other sample, V = fallback.
    out = kernel_baseline(jnp.array([0.7]), jnp.ones((1, 3)), 1.0)
    np.testing.assert_array_equal(out, [0.0])
    out = kernel_baseline(jnp.array([0.7]), jnp.ones((1, 3)), 1.0, fallback_baseline=0.5)
    np.testing.assert_array_equal(out, [0.5])
    # Far apart points and tiny h: every kernel value underflows, yet the nearest neighbour
    # keeps the weight (the h -> 0 limit), no 0/0.
    e = jnp.array([[0.0], [10.0], [25.0]])
    out = kernel_baseline(jnp.array([1.0, 2.0, 3.0]), e, 1e-3)
    np.testing.assert_allclose(out, [2.0, 1.0, 2.0])
    # A non-finite embedding has no neighbour and is nobody's neighbour.
    e = jnp.array([[0.0], [np.nan], [1.0]])
    out = kernel_baseline(jnp.array([1.0, 2.0, 3.0]), e, 1.0)
    np.testing.assert_allclose(out, [3.0, 0.0, 1.0])


def test_errors():
    with pytest.raises(ValueError, match="bandwidth=0.0 must be > 0"):
        kernel_baseline_advantages(0.0)
    with pytest.raises(ValueError, match="bandwidth=-1 must be > 0"):
        kernel_baseline(jnp.zeros(2), jnp.zeros((2, 3)), -1)
    t = kernel_baseline_advantages(1.0)
    with pytest.raises(ValueError, match=r"needs batch.extras\['prompt_embedding'\]"):
        t.apply(make(REWARDS, MASK, EMB, key="emb"), (), CTX)
    with pytest.raises(ValueError, match=r"has shape \(8,\), expected \[B, D\]"):
        t.apply(make(REWARDS, MASK, np.zeros(8, np.float32)), (), CTX)
    with pytest.raises(ValueError, match="expected a float dtype"):
        t.apply(make(REWARDS, MASK, np.zeros((8, 2), np.int32)), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(make(REWARDS, MASK, EMB).replace(rewards=jnp.zeros((8, 2))), (), CTX)


def test_transform_writes_token_advantages_and_metrics():
    t = kernel_baseline_advantages(0.5, embedding_key="emb")
    batch, state, m = jax.jit(t.apply)(make(REWARDS, MASK, EMB, key="emb"), (), CTX)
    base = reference(REWARDS, EMB, 0.5)
    seq = REWARDS - base
    np.testing.assert_allclose(batch.advantages, seq[:, None] * MASK, rtol=1e-5, atol=1e-6)
    assert state == ()
    valid = (seq[:, None] * np.ones(MASK.shape))[MASK]
    np.testing.assert_allclose(m["kernel_baseline/advantages/mean"], valid.mean(), atol=1e-6)
    np.testing.assert_allclose(m["kernel_baseline/baseline_mean"], base.mean(), rtol=1e-5)
    ess = m["kernel_baseline/effective_neighbours"]
    assert 1.0 <= float(ess) <= 7.0
    # Grouped embeddings and small h: each sample pools its G - 1 = 3 group mates.
    _, _, m = APPLY(make(REWARDS, MASK, grouped_embeddings(2, 4)), (), CTX)
    np.testing.assert_allclose(m["kernel_baseline/effective_neighbours"], 3.0, rtol=1e-5)


VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(VALUES, min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=24, max_size=24),
    st.permutations(range(8)),
    st.integers(0, 2**31 - 1),
)
def test_permuting_the_batch_permutes_advantages(rewards, mask, perm, seed):
    rewards, perm = np.array(rewards, np.float32), np.array(perm)
    mask = np.array(mask).reshape(8, 3)
    emb = np.random.default_rng(seed).normal(size=(8, 3)).astype(np.float32)
    adv = np.asarray(APPLY(make(rewards, mask, emb), (), CTX)[0].advantages)
    adv_p = np.asarray(APPLY(make(rewards[perm], mask[perm], emb[perm]), (), CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)


@settings(max_examples=25, deadline=None)
@given(VALUES, st.lists(st.booleans(), min_size=8, max_size=8), st.integers(0, 2**31 - 1))
def test_all_equal_rewards_and_length_one_rows(value, mask, seed):
    # T = 1: every row is a length-1 response or fully masked; all-equal rewards give exactly 0.
    mask = np.array(mask).reshape(8, 1)
    emb = np.random.default_rng(seed).normal(size=(8, 3)).astype(np.float32) * 10
    batch, _, m = APPLY(make(np.full(8, value, np.float32), mask, emb), (), CTX)
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in m.values())
