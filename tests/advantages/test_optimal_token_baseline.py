"""Tests for rljax.advantages.optimal_token_baseline against loop-based numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.optimal_token_baseline import (
    logit_gradient_proxy,
    optimal_token_baseline,
    optimal_token_baseline_advantages,
)
from rljax.core.batch import make_batch
from rljax.core.transform import Context

V = 6
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, -1.0], np.float32)
# Right-padded responses of lengths 2, 1, 4, 0 | 3, 2, 4, 1.
LENGTHS = np.array([2, 1, 4, 0, 3, 2, 4, 1])
MASK = np.arange(4)[None, :] < LENGTHS[:, None]


def logsumexp(z):
    zmax = z.max(axis=-1, keepdims=True)
    return (zmax + np.log(np.exp(z - zmax).sum(axis=-1, keepdims=True)))[..., 0]


def sum_sq_prob_lse(z):
    """sum_v pi_v^2 from logits in logsumexp form: exp(lse(2z) - 2 lse(z))."""
    return np.exp(logsumexp(2.0 * z) - 2.0 * logsumexp(z))


def policy_stats(seed, shape=(8, 4)):
    """Sampled-token log-probs and sum pi^2 of random logits, in numpy."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=2.0, size=(*shape, V))
    tokens = rng.integers(0, V, size=shape)
    logp = z - logsumexp(z)[..., None]
    old_logprobs = np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    return old_logprobs.astype(np.float32), sum_sq_prob_lse(z).astype(np.float32)


def reference(returns, w, mask, g, zero_tail=False):
    """A = (G - B) m with B_t = sum_i G W m / (sum_i W m + 1e-8) per group, by loops."""
    b, t = mask.shape
    cum = np.zeros((b, t))
    for i in range(b):
        acc = 0.0
        for u in range(t):
            acc += w[i, u] * mask[i, u]
            cum[i, u] = acc
    out = np.zeros((b, t))
    for start in range(0, b, g):
        rows = range(start, start + g)
        if g == 1:
            out[start] = returns[start] * mask[start]
            continue
        lengths = [int(mask[i].sum()) for i in rows]
        srt = sorted(lengths)
        unique = lengths.count(srt[-1]) == 1 and srt[-1] > srt[-2]
        for u in range(t):
            num = sum(returns[i, u] * cum[i, u] * mask[i, u] for i in rows)
            den = sum(cum[i, u] * mask[i, u] for i in rows) + 1e-8
            for i in rows:
                base = num / den
                if zero_tail and unique and lengths[i - start] == srt[-1] and u >= srt[-2]:
                    base = 0.0
                out[i, u] = (returns[i, u] - base) * mask[i, u]
    return out


def make(rewards, mask, g, old_logprobs, sum_sq, rollout_logprobs=None, extras=None):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        old_logprobs=old_logprobs,
        rollout_logprobs=rollout_logprobs,
        extras={"old_sum_sq_prob": sum_sq, **(extras or {})},
    )


OTB = jax.jit(optimal_token_baseline, static_argnums=(3, 4))
PROXY = jax.jit(logit_gradient_proxy)


def test_sum_sq_prob_logsumexp_form_matches_explicit_sum():
    z = np.random.default_rng(0).normal(scale=3.0, size=(5, 3, V))
    p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(sum_sq_prob_lse(z), (p**2).sum(axis=-1), rtol=1e-12)


def test_proxy_is_squared_logit_gradient_norm():
    z = np.random.default_rng(1).normal(scale=2.0, size=(4, 3, V))
    tokens = np.random.default_rng(2).integers(0, V, size=(4, 3))
    p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    onehot = np.eye(V)[tokens]
    expected = ((onehot - p) ** 2).sum(axis=-1)  # |grad_z log softmax(z)_y|^2
    logp = np.log(np.take_along_axis(p, tokens[..., None], axis=-1)[..., 0])
    out = PROXY(jnp.array(logp, jnp.float32), jnp.array(sum_sq_prob_lse(z), jnp.float32))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 30.0))
def test_proxy_in_zero_two(seed, scale):
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=scale, size=(2, 8, V))
    tokens = rng.integers(0, V, size=(2, 8))
    logp = np.take_along_axis(z - logsumexp(z)[..., None], tokens[..., None], axis=-1)[..., 0]
    w = np.asarray(PROXY(jnp.array(logp, jnp.float32), jnp.array(sum_sq_prob_lse(z), jnp.float32)))
    assert np.all((w >= 0.0) & (w <= 2.0))


def test_hand_values():
    # w = 1 everywhere: W = [1, 2] in both rows, B_t = 0.5.
    ones = jnp.ones((2, 2))
    returns = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    out = optimal_token_baseline(returns, ones, ones > 0, 2)
    np.testing.assert_allclose(out, [[0.5, 0.5], [-0.5, -0.5]], rtol=1e-6)
    # Row 1 has w_0 = 0: W = [1, 2] and [0, 1]; B_0 = 1, B_1 = 2/3.
    out = optimal_token_baseline(returns, jnp.array([[1.0, 1.0], [0.0, 1.0]]), ones > 0, 2)
    np.testing.assert_allclose(out, [[0.0, 1 / 3], [-1.0, -2 / 3]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("zero_tail", [False, True])
def test_matches_reference(g, zero_tail):
    rng = np.random.default_rng(3)
    returns = rng.normal(size=MASK.shape).astype(np.float32)
    w = rng.uniform(0.0, 2.0, size=MASK.shape).astype(np.float32)
    out = OTB(jnp.array(returns), jnp.array(w), jnp.array(MASK), g, zero_tail)
    np.testing.assert_allclose(out, reference(returns, w, MASK, g, zero_tail), atol=1e-5)


def test_equal_weights_give_group_mean_of_valid_samples():
    returns = np.where(MASK, REWARDS[:, None], 0.0).astype(np.float32)
    out = np.asarray(OTB(jnp.array(returns), jnp.ones(MASK.shape), jnp.array(MASK), 4, False))
    for start in (0, 4):
        for u in range(4):
            valid = [i for i in range(start, start + 4) if MASK[i, u]]
            if not valid:
                continue
            mean = np.mean([REWARDS[i] for i in valid])
            for i in valid:
                np.testing.assert_allclose(out[i, u], REWARDS[i] - mean, atol=1e-6)


def test_zero_tail_only_for_unique_longest():
    returns = jnp.ones((4, 4))
    mask = jnp.array(np.arange(4)[None, :] < np.array([[4], [2], [4], [1]]))
    # Two responses share the longest length 4: no tail handling, same as the default.
    np.testing.assert_array_equal(
        OTB(returns, jnp.ones((4, 4)), mask, 4, True),
        OTB(returns, jnp.ones((4, 4)), mask, 4, False),
    )
    mask = jnp.array(np.arange(4)[None, :] < np.array([[4], [2], [3], [1]]))
    out = np.asarray(OTB(returns, jnp.ones((4, 4)), mask, 4, True))
    np.testing.assert_allclose(out[0], [0.0, 0.0, 0.0, 1.0], atol=1e-6)  # t >= 3: baseline 0


def test_group_size_one_gives_returns():
    returns = np.random.default_rng(4).normal(size=MASK.shape).astype(np.float32)
    w = np.random.default_rng(5).uniform(0, 2, size=MASK.shape).astype(np.float32)
    out = OTB(jnp.array(returns), jnp.array(w), jnp.array(MASK), 1, True)
    np.testing.assert_array_equal(out, returns * MASK)


def test_errors():
    z = jnp.zeros((4, 2))
    with pytest.raises(ValueError, match="group_size=0"):
        optimal_token_baseline(z, z, z > 0, 0)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        optimal_token_baseline(z, z, z > 0, 3)
    with pytest.raises(ValueError, match="is_cap=0.0"):
        optimal_token_baseline_advantages(2, use_is_weight=True, is_cap=0.0)
    t = optimal_token_baseline_advantages(4)
    lp, sq = policy_stats(0)
    batch = make(REWARDS, MASK, 4, lp, sq)
    with pytest.raises(ValueError, match=r"needs batch.extras\['old_sum_sq_prob'\]"):
        t.apply(batch.replace(extras={}), (), CTX)
    with pytest.raises(ValueError, match=r"extras\['old_sum_sq_prob'\] has shape"):
        t.apply(batch.replace(extras={"old_sum_sq_prob": jnp.zeros((8, 2))}), (), CTX)
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        t.apply(batch.replace(rewards=jnp.zeros((8, 2))), (), CTX)
    with pytest.raises(ValueError, match="mixes group ids"):
        t.apply(batch.replace(group_id=jnp.arange(8) % 2), (), CTX)


def test_transform_sequence_rewards():
    lp, sq = policy_stats(6)
    t = optimal_token_baseline_advantages(4)
    batch, _, metrics = jax.jit(t.apply)(make(REWARDS, MASK, 4, lp, sq), (), CTX)
    w = 1.0 - 2.0 * np.exp(lp.astype(np.float64)) + sq
    returns = REWARDS[:, None] * MASK
    expected = reference(returns, w, MASK, 4)
    np.testing.assert_allclose(batch.advantages, expected, atol=1e-5)
    np.testing.assert_allclose(metrics["otb/advantages/mean"], expected[MASK].mean(), atol=1e-6)
    np.testing.assert_allclose(metrics["otb/advantages/max"], expected[MASK].max(), atol=1e-5)
    np.testing.assert_allclose(metrics["otb/token_weight_mean"], w[MASK].mean(), rtol=1e-5)


def test_transform_token_rewards_and_is_weights():
    lp, sq = policy_stats(7)
    rng = np.random.default_rng(8)
    rollout = (lp + rng.normal(scale=0.5, size=lp.shape)).astype(np.float32)
    token_rewards = rng.normal(size=MASK.shape).astype(np.float32)
    t = optimal_token_baseline_advantages(4, use_is_weight=True, handle_zero_tail=True, is_cap=1.5)
    batch = make(REWARDS, MASK, 4, lp, sq, rollout, extras={"token_rewards": token_rewards})
    out = jax.jit(t.apply)(batch, (), CTX)[0].advantages
    returns = np.zeros(MASK.shape)
    for i in range(8):
        for u in range(4):
            returns[i, u] = sum(token_rewards[i, v] * MASK[i, v] for v in range(u, 4))
    rho = np.minimum(np.exp(lp.astype(np.float64) - rollout), 1.5)
    w = (1.0 - 2.0 * np.exp(lp.astype(np.float64)) + sq) * rho**2
    np.testing.assert_allclose(out, reference(returns, w, MASK, 4, True), atol=1e-5)


APPLY = jax.jit(optimal_token_baseline_advantages(4).apply)
REWARD_VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])
LP, SQ = policy_stats(9)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8),
    st.lists(st.integers(0, 4), min_size=8, max_size=8),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(rewards, lengths, p0, p1):
    rewards = np.array(rewards, np.float32)
    mask = np.arange(4)[None, :] < np.array(lengths)[:, None]
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    adv = np.asarray(APPLY(make(rewards, mask, 4, LP, SQ), (), CTX)[0].advantages)
    batch_p = make(rewards[perm], mask[perm], 4, LP[perm], SQ[perm])
    adv_p = np.asarray(APPLY(batch_p, (), CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)


@settings(max_examples=25, deadline=None)
@given(REWARD_VALUES, st.lists(st.integers(0, 4), min_size=8, max_size=8), st.integers(1, 4))
def test_all_equal_rewards_give_zero_and_masked_rows_stay_finite(value, lengths, t):
    # Every sampled token has w > 0 here, so equal returns give B_t = G_t up to the 1e-8.
    mask = np.arange(t)[None, :] < np.array(lengths)[:, None]
    batch = make(np.full(8, value, np.float32), mask, 4, LP[:, :t], SQ[:, :t])
    out, _, metrics = APPLY(batch, (), CTX)  # retraced once per T
    np.testing.assert_allclose(out.advantages, 0.0, atol=1e-5)
    assert all(np.isfinite(v) for v in metrics.values())


def test_policy_token_alignment_skips_environment_gaps():
    # Two samples whose policy tokens are [r r r] but the second has a 2-token observation
    # after its first token. Aligned by policy token, each k-th token sees the same group, so
    # the advantages are those of the gap-free layout, moved to the tokens' positions.
    returns = jnp.asarray([[1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    weights = jnp.asarray([[0.5, 0.2, 0.9, 0.0, 0.0], [0.3, 0.0, 0.0, 0.6, 0.4]])
    mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 0, 0, 1, 1]], bool)
    gapped = optimal_token_baseline(returns, weights, mask, 2, align="policy_token")
    packed_w = jnp.asarray([[0.5, 0.2, 0.9], [0.3, 0.6, 0.4]])
    packed = optimal_token_baseline(
        jnp.asarray([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), packed_w, jnp.ones((2, 3), bool), 2
    )
    np.testing.assert_allclose(gapped[0, :3], packed[0], rtol=1e-6)
    np.testing.assert_allclose(gapped[1, [0, 3, 4]], packed[1], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(gapped)[~np.asarray(mask)], 0.0)
    # Without gaps the two alignments agree.
    prefix = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool)
    np.testing.assert_allclose(
        optimal_token_baseline(returns, weights, prefix, 2, align="policy_token"),
        optimal_token_baseline(returns, weights, prefix, 2),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="align='turn'"):
        optimal_token_baseline(returns, weights, mask, 2, align="turn")
