"""Tests for rljax.advantages.exploration_bias (EDO) against hand values and numpy loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.exploration_bias import (
    exploration_bias,
    exploration_biased_rewards,
    sequence_logprob,
)
from rljax.advantages.group import group_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context, chain

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0, 1.0], np.float32)
MASK = np.array(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool
)
OLD = -np.random.default_rng(0).uniform(0.0, 3.0, size=(8, 3)).astype(np.float32)
REF = -np.random.default_rng(1).uniform(0.0, 3.0, size=(8, 3)).astype(np.float32)


def reference_seq_logprob(logprobs, mask, normalize):
    out = np.zeros(mask.shape[0])
    for i in range(mask.shape[0]):
        vals = [float(logprobs[i, t]) for t in range(mask.shape[1]) if mask[i, t]]
        if vals:
            out[i] = sum(vals) / len(vals) if normalize else sum(vals)
    return out


def make(rewards, mask, g, old=OLD, ref=REF):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b) // g,
        rewards=rewards,
        old_logprobs=old,
        ref_logprobs=ref,
    )


def test_hand_values():
    out = exploration_biased_rewards(jnp.array([1.0, 0.0]), jnp.array([-2.0, -0.5]), 0.1)
    np.testing.assert_allclose(out, [1.2, 0.05], rtol=1e-6)
    lp = sequence_logprob(jnp.array([[-1.0, -3.0, -7.0], [-2.0, 0.0, 0.0]]), MASK[:2])
    np.testing.assert_allclose(lp, [-2.0, -2.0], rtol=1e-6)


@pytest.mark.parametrize("normalize", [True, False])
def test_sequence_logprob_matches_reference(normalize):
    out = jax.jit(sequence_logprob, static_argnums=(2,))(jnp.array(OLD), jnp.array(MASK), normalize)
    np.testing.assert_allclose(out, reference_seq_logprob(OLD, MASK, normalize), rtol=1e-6)


@pytest.mark.parametrize(
    "source, normalize, only_correct",
    [("old", True, False), ("ref", False, False), ("old", True, True)],
)
def test_transform_matches_reference(source, normalize, only_correct):
    t = exploration_bias(0.3, source, normalize, only_correct, correct_threshold=1.0)
    batch, state, metrics = jax.jit(t.apply)(make(REWARDS, MASK, 4), (), CTX)
    lp = reference_seq_logprob(OLD if source == "old" else REF, MASK, normalize)
    bonus = -0.3 * lp
    if only_correct:
        bonus = np.where(REWARDS >= 1.0, bonus, 0.0)
    np.testing.assert_allclose(batch.rewards, REWARDS + bonus, rtol=1e-5)
    assert state == ()
    np.testing.assert_allclose(metrics["edo/bonus_mean"], bonus.mean(), rtol=1e-5)
    np.testing.assert_allclose(
        metrics["edo/seq_logprob_mean"], lp[MASK.any(axis=1)].mean(), rtol=1e-5
    )
    # Rows with no valid token get no bonus.
    assert batch.rewards[3] == REWARDS[3]


def test_coef_zero_is_identity():
    t = exploration_bias(0.0)
    batch = make(REWARDS, MASK, 4)
    out, _, metrics = t.apply(batch, (), CTX)
    np.testing.assert_array_equal(out.rewards, batch.rewards)
    assert metrics["edo/bonus_mean"] == 0.0


def test_bonus_ranks_less_likely_correct_response_higher_after_grpo():
    # Group of 4: two correct (one likely, one unlikely), two wrong.
    rewards = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    mask = np.ones((4, 2), bool)
    old = np.array([[-0.1, -0.1], [-2.0, -2.0], [-0.5, -3.0], [-1.0, -1.0]], np.float32)
    grpo = group_advantages(4)
    t = chain(exploration_bias(0.1, only_correct=True), grpo)
    plain = jax.jit(grpo.apply)(make(rewards, mask, 4, old, old), (), CTX)[0].advantages
    biased = jax.jit(t.apply)(make(rewards, mask, 4, old, old), t.init(), CTX)[0].advantages
    np.testing.assert_allclose(plain[0], plain[1])
    assert biased[1, 0] > biased[0, 0] > 0 > biased[2, 0]
    np.testing.assert_allclose(biased[2], biased[3])  # wrong answers stay tied


def test_errors():
    with pytest.raises(ValueError, match="coef=-0.1 must be >= 0"):
        exploration_bias(-0.1)
    with pytest.raises(ValueError, match="source='new'"):
        exploration_bias(0.1, source="new")
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        exploration_bias(0.1).apply(make(np.zeros((8, 2)), MASK, 4), (), CTX)


CHAIN = chain(exploration_bias(0.2), group_advantages(4))
APPLY = jax.jit(CHAIN.apply)
APPLY_ZERO = jax.jit(chain(exploration_bias(0.0), group_advantages(4)).apply)
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
    out = APPLY(make(rewards, mask, 4), CHAIN.init(), CTX)[0]
    out_p = APPLY(make(rewards[perm], mask[perm], 4, OLD[perm], REF[perm]), CHAIN.init(), CTX)[0]
    adv = np.asarray(out.advantages)
    np.testing.assert_allclose(np.asarray(out_p.advantages), adv[perm], atol=1e-4)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0)
    assert np.all(np.asarray(out.rewards) >= rewards)  # log-probs <= 0: the bonus is >= 0


@settings(max_examples=25, deadline=None)
@given(REWARD_VALUES, st.lists(st.booleans(), min_size=8, max_size=8))
def test_all_equal_rewards_and_length_one_rows(value, mask):
    # T = 1: every row is a length-1 response or fully masked.
    mask = np.array(mask).reshape(8, 1)
    batch = make(np.full(8, value, np.float32), mask, 4, OLD[:, :1], REF[:, :1])
    out, _, metrics = APPLY_ZERO(batch, ((), ()), CTX)
    np.testing.assert_array_equal(out.advantages, 0.0)
    out, _, metrics = APPLY(batch, ((), ()), CTX)
    assert np.all(np.isfinite(np.asarray(out.advantages)))
    assert all(np.isfinite(v) for v in metrics.values())
