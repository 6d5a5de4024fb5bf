"""Tests for rljax.advantages.dgpo, with statistics built from explicit logits in numpy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.dgpo import deviation_gated_advantages, dgpo_token_weights
from rljax.advantages.group import group_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context, chain

V = 5
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, -1.0], np.float32)
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]], bool
)


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def token_stats(old_logits, ref_logits):
    """Entropy of pi_old and squared Hellinger distance to pi_ref, per position, in numpy."""
    p, q = softmax(old_logits.astype(np.float64)), softmax(ref_logits.astype(np.float64))
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    entropy = -plogp.sum(axis=-1)
    hellinger = 1.0 - np.sqrt(p * q).sum(axis=-1)
    return entropy.astype(np.float32), hellinger.astype(np.float32)


def logits(seed, shape=(8, 3), scale=2.0):
    return np.random.default_rng(seed).normal(scale=scale, size=(*shape, V))


def reference_weights(entropy, hellinger, mask, vocab_size, temperature):
    """w_t = L exp(s_t/tau) / sum_{valid u} exp(s_u/tau), s = H/log|V| * d, by loops."""
    out = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t]]
        scores = {t: entropy[i, t] / math.log(vocab_size) * hellinger[i, t] for t in valid}
        z = sum(math.exp(scores[t] / temperature) for t in valid)
        for t in valid:
            out[i, t] = len(valid) * math.exp(scores[t] / temperature) / z
    return out


def make(rewards, mask, g, entropy, hellinger):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        extras={"old_entropy": entropy, "old_ref_hellinger": hellinger},
    )


WEIGHTS = jax.jit(dgpo_token_weights, static_argnums=(3, 4))
GRPO = group_advantages(4)
CHAIN = chain(GRPO, deviation_gated_advantages(V, temperature=0.5))
APPLY_CHAIN = jax.jit(CHAIN.apply)
APPLY_GRPO = jax.jit(GRPO.apply)


@pytest.mark.parametrize("temperature", [0.1, 1.0])
def test_weights_match_reference(temperature):
    entropy, hellinger = token_stats(logits(0), logits(1))
    out = WEIGHTS(jnp.array(entropy), jnp.array(hellinger), jnp.array(MASK), V, temperature)
    ref = reference_weights(entropy, hellinger, MASK, V, temperature)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out).sum(axis=1), MASK.sum(axis=1), rtol=1e-5)


def test_hand_value():
    # One row, two tokens; scores 0 and ln(3) (gate 1, d = ln 3): weights 2*[1/4, 3/4].
    entropy = jnp.array([[math.log(V), math.log(V)]])
    hellinger = jnp.array([[0.0, math.log(3.0)]])
    out = dgpo_token_weights(entropy, hellinger, jnp.ones((1, 2), bool), V)
    np.testing.assert_allclose(out, [[0.5, 1.5]], rtol=1e-6)


def test_equal_policies_give_uniform_weights_and_grpo_advantages():
    old = logits(2)
    entropy, hellinger = token_stats(old, old)
    np.testing.assert_allclose(hellinger, 0.0, atol=1e-6)
    batch = make(REWARDS, MASK, 4, entropy, hellinger)
    w = WEIGHTS(jnp.array(entropy), jnp.array(hellinger), jnp.array(MASK), V, 1.0)
    np.testing.assert_allclose(w, MASK.astype(np.float32), atol=1e-5)
    out = APPLY_CHAIN(batch, CHAIN.init(), CTX)[0].advantages
    grpo = APPLY_GRPO(batch, GRPO.init(), CTX)[0].advantages
    np.testing.assert_allclose(out, grpo, atol=1e-5)


def test_token_advantages_preserve_credit_mass():
    entropy, hellinger = token_stats(logits(3), logits(4))
    batch, _, metrics = APPLY_CHAIN(make(REWARDS, MASK, 4, entropy, hellinger), CHAIN.init(), CTX)
    grpo = np.asarray(APPLY_GRPO(make(REWARDS, MASK, 4, entropy, hellinger), (), CTX)[0].advantages)
    lengths = MASK.sum(axis=1)
    seq = np.array([grpo[i, MASK[i]].mean() if lengths[i] else 0.0 for i in range(8)])
    adv = np.asarray(batch.advantages)
    np.testing.assert_allclose(adv.sum(axis=1), lengths * seq, rtol=1e-5, atol=1e-6)
    ref = reference_weights(entropy, hellinger, MASK, V, 0.5) * seq[:, None]
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["dgpo/hellinger_mean"], hellinger[MASK].mean(), rtol=1e-5)
    np.testing.assert_allclose(
        metrics["dgpo/gate_mean"], (entropy[MASK] / math.log(V)).mean(), rtol=1e-5
    )
    w = reference_weights(entropy, hellinger, MASK, V, 0.5)
    np.testing.assert_allclose(metrics["dgpo/weight_max"], w[MASK].max(), rtol=1e-5)


def test_zero_entropy_token_gets_at_most_uniform_weight():
    old, ref = logits(5, (2, 4)), logits(6, (2, 4))
    old[:, 1] = 0.0
    old[:, 1, 2] = 1e4  # a point mass: entropy exactly 0 at position 1
    entropy, hellinger = token_stats(old, ref)
    assert np.all(entropy[:, 1] == 0.0) and np.all(hellinger[:, 1] > 0.1)
    mask = np.ones((2, 4), bool)
    w = np.asarray(WEIGHTS(jnp.array(entropy), jnp.array(hellinger), jnp.array(mask), V, 1.0))
    assert np.all(w[:, 1] <= 1.0 + 1e-6)
    np.testing.assert_allclose(w[:, 1], w.min(axis=1), rtol=1e-6)


def test_weights_carry_no_gradient():
    entropy, hellinger = token_stats(logits(7), logits(8))
    mask = jnp.array(MASK)
    proj = jnp.arange(24.0).reshape(8, 3)

    def f(e, d):
        return (dgpo_token_weights(e, d, mask, V) * proj).sum()

    ge, gd = jax.grad(f, argnums=(0, 1))(jnp.array(entropy), jnp.array(hellinger))
    np.testing.assert_array_equal(ge, 0.0)
    np.testing.assert_array_equal(gd, 0.0)


def test_errors():
    z = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="vocab_size=1"):
        dgpo_token_weights(z, z, z > 0, 1)
    with pytest.raises(ValueError, match="temperature=0.0"):
        deviation_gated_advantages(V, temperature=0.0)
    t = deviation_gated_advantages(V)
    entropy, hellinger = token_stats(logits(0), logits(1))
    batch = make(REWARDS, MASK, 4, entropy, hellinger)
    missing = batch.replace(extras={"old_entropy": batch.extras["old_entropy"]})
    with pytest.raises(ValueError, match=r"needs batch.extras\['old_ref_hellinger'\]"):
        t.apply(missing, (), CTX)
    bad = batch.replace(extras={**batch.extras, "old_entropy": jnp.zeros((8, 2))})
    with pytest.raises(ValueError, match=r"extras\['old_entropy'\] has shape \(8, 2\)"):
        t.apply(bad, (), CTX)


REWARD_VALUES = st.sampled_from([0.0, 0.1, 1.0, -0.3, 5.0])
STAT_VALUES = st.floats(0.0, 1.0, width=32)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(REWARD_VALUES, min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=24, max_size=24),
    st.lists(STAT_VALUES, min_size=24, max_size=24),
    st.lists(STAT_VALUES, min_size=24, max_size=24),
    st.permutations(range(4)),
    st.permutations(range(4)),
)
def test_permutation_within_groups_permutes_advantages(rewards, mask, ent, hel, p0, p1):
    rewards = np.array(rewards, np.float32)
    mask = np.array(mask).reshape(8, 3)
    entropy = np.array(ent, np.float32).reshape(8, 3) * math.log(V)
    hellinger = np.array(hel, np.float32).reshape(8, 3)
    perm = np.concatenate([np.array(p0), 4 + np.array(p1)])
    init = CHAIN.init()
    adv = np.asarray(
        APPLY_CHAIN(make(rewards, mask, 4, entropy, hellinger), init, CTX)[0].advantages
    )
    batch_p = make(rewards[perm], mask[perm], 4, entropy[perm], hellinger[perm])
    adv_p = np.asarray(APPLY_CHAIN(batch_p, init, CTX)[0].advantages)
    np.testing.assert_allclose(adv_p, adv[perm], atol=1e-5)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)


@settings(max_examples=25, deadline=None)
@given(
    REWARD_VALUES,
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.lists(STAT_VALUES, min_size=8, max_size=8),
)
def test_all_equal_rewards_and_length_one_rows(value, mask, hel):
    # T = 1: every row is a length-1 response (weight exactly 1) or fully masked (weight 0).
    mask = np.array(mask).reshape(8, 1)
    stat = np.array(hel, np.float32).reshape(8, 1)
    batch, _, metrics = APPLY_CHAIN(
        make(np.full(8, value, np.float32), mask, 4, stat, stat), CHAIN.init(), CTX
    )
    np.testing.assert_array_equal(batch.advantages, 0.0)
    assert all(np.isfinite(v) for v in metrics.values())
    w = WEIGHTS(jnp.array(stat), jnp.array(stat), jnp.array(mask), V, 0.5)
    np.testing.assert_allclose(w, mask.astype(np.float32), rtol=1e-6)
