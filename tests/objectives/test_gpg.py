"""Tests for rljax.objectives.gpg: the plain policy-gradient loss and its batch scaling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.aggregation import aggregation_denominator
from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.objectives.gpg import gpg, valid_group_scale, valid_group_scaling

# Two groups of two. Group 0 rewards (1, 0) vary: Dr. GRPO advantages (+0.5, -0.5).
# Group 1 rewards (1, 1) are equal: advantage 0, no learning signal.
REWARDS = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
SEQ_ADV = np.array([0.5, -0.5, 0.0, 0.0], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
NEW = np.array(
    [[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0], [-0.7, -1.5, -2.5], [-1.2, -0.3, -4.0]], np.float32
)
ENT = jnp.zeros((4, 3))
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
GPG_GRAD = jax.jit(jax.value_and_grad(gpg(), has_aux=True))
SCALING = valid_group_scaling(2)
SCALE_APPLY = jax.jit(SCALING.apply)


def make(mask=MASK, rewards=REWARDS, adv=SEQ_ADV, loss_weights=None):
    return make_batch(
        prompt_tokens=np.zeros((4, 1)),
        prompt_mask=np.ones((4, 1)),
        completion_tokens=np.zeros((4, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0, 1, 1]),
        rewards=rewards,
        old_logprobs=NEW - 0.3,  # GPG ignores old log-probs: no ratio
        advantages=np.asarray(adv)[:, None] * mask,
        loss_weights=loss_weights,
    )


def reference_token_mean(new, adv, mask):
    total, n = 0.0, 0
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            if mask[i, j]:
                total += -float(adv[i]) * float(new[i, j])
                n += 1
    return total / n


def test_loss_matches_hand_value_and_reference():
    loss, metrics = jax.jit(gpg())(jnp.array(NEW), ENT, make())
    # -A * logp summed over valid tokens: row 0: 0.5 + 1.0 = 1.5; row 1: 0.5 * (-3 - 1 - 2) = -3;
    # rows 2, 3 have A = 0. Total -1.5 over 8 tokens.
    np.testing.assert_allclose(reference_token_mean(NEW, SEQ_ADV, MASK), -1.5 / 8, rtol=1e-6)
    np.testing.assert_allclose(loss, -1.5 / 8, rtol=1e-5)
    np.testing.assert_allclose(metrics["gpg/loss"], loss)
    np.testing.assert_allclose(metrics["gpg/logprob_mean"], NEW[MASK].mean(), rtol=1e-5)
    assert set(metrics) == {"gpg/loss", "gpg/logprob_mean"}


def test_gradient_is_minus_advantage_over_token_count():
    grad = jax.grad(lambda lp: gpg()(lp, ENT, make())[0])(jnp.array(NEW))
    expected = np.where(MASK, -SEQ_ADV[:, None] / MASK.sum(), 0.0)
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8)


def test_valid_group_scaling():
    batch, state, metrics = SCALE_APPLY(make(), SCALING.init(), CTX)
    assert state == ()
    # B = 4 samples, B_valid = 2 (group 0 only): alpha = 2, applied to the advantages.
    np.testing.assert_allclose(metrics["gpg/valid_group_scale"], 2.0)
    np.testing.assert_allclose(batch.advantages, 2.0 * SEQ_ADV[:, None] * MASK)
    (loss, metrics), grad = GPG_GRAD(jnp.array(NEW), ENT, batch)
    np.testing.assert_allclose(loss, 2.0 * -1.5 / 8, rtol=1e-5)
    np.testing.assert_allclose(metrics["gpg/loss"], loss)
    np.testing.assert_allclose(
        grad, np.where(MASK, -2.0 * SEQ_ADV[:, None] / MASK.sum(), 0.0), rtol=1e-6, atol=1e-8
    )
    # Linear in A: scaling the advantages equals scaling the loss of the unscaled batch, in
    # every aggregation mode.
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        plain, _ = gpg(mode)(jnp.array(NEW), ENT, make())
        scaled, _ = gpg(mode)(jnp.array(NEW), ENT, batch)
        np.testing.assert_allclose(scaled, 2.0 * plain, rtol=1e-5)
    # All groups valid: alpha = 1, advantages unchanged.
    rewards = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    adv = np.array([0.5, -0.5, -0.5, 0.5], np.float32)
    batch, _, metrics = SCALE_APPLY(make(rewards=rewards, adv=adv), (), CTX)
    np.testing.assert_allclose(metrics["gpg/valid_group_scale"], 1.0)
    np.testing.assert_allclose(batch.advantages, adv[:, None] * MASK)


# Eight rows, four groups of two: groups 0 and 2 vary, 1 and 3 do not: alpha = 8 / 4 = 2.
MB_RNG = np.random.default_rng(3)
MB_REWARDS = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0], np.float32)
MB_ADV = np.array([0.5, -0.5, 0.0, 0.0, -0.5, 0.5, 0.0, 0.0], np.float32)
MB_MASK = MB_RNG.uniform(size=(8, 3)) < 0.7
MB_MASK[:, 0] = True
MB_NEW = np.log(MB_RNG.uniform(0.1, 1.0, size=(8, 3))).astype(np.float32)
MB_BATCH = make_batch(
    prompt_tokens=np.zeros((8, 1)),
    prompt_mask=np.ones((8, 1)),
    completion_tokens=np.zeros((8, 3)),
    completion_mask=MB_MASK,
    group_id=np.arange(8) // 2,
    rewards=MB_REWARDS,
    advantages=MB_ADV[:, None] * MB_MASK,
)
MB_PREPARED = SCALE_APPLY(MB_BATCH, (), CTX)[0]


@settings(max_examples=10, deadline=None)
@given(st.permutations(range(8)))
def test_loss_and_gradient_unchanged_by_shuffled_micro_batches(perm):
    # steps.update shuffles rows, splits them into 2 micro-batches and combines them weighted by
    # aggregation_denominator: the result equals the full-batch loss with alpha = 2.
    ref = 2.0 * reference_token_mean(MB_NEW, MB_ADV, MB_MASK)
    (full_loss, _), full_grad = GPG_GRAD(jnp.array(MB_NEW), jnp.zeros((8, 3)), MB_PREPARED)
    np.testing.assert_allclose(full_loss, ref, rtol=1e-5)
    total_loss, total_weight, grad = 0.0, 0.0, np.zeros((8, 3))
    for ids in np.split(np.asarray(perm), 2):
        sub = jax.tree.map(lambda x, ids=ids: x[ids], MB_PREPARED)
        (sub_loss, _), sub_grad = GPG_GRAD(jnp.array(MB_NEW[ids]), jnp.zeros((4, 3)), sub)
        d = float(aggregation_denominator(sub.loss_weights, "token-mean"))
        total_loss += d * float(sub_loss)
        grad[ids] += d * np.asarray(sub_grad)
        total_weight += d
    np.testing.assert_allclose(total_loss / total_weight, ref, rtol=1e-5)
    np.testing.assert_allclose(grad / total_weight, full_grad, rtol=1e-5, atol=1e-8)


def test_valid_group_scale_values():
    np.testing.assert_allclose(valid_group_scale(jnp.array(REWARDS), 2), 2.0)
    np.testing.assert_allclose(valid_group_scale(jnp.array([0.0, 1.0, 1.0, 0.0]), 2), 1.0)
    np.testing.assert_allclose(valid_group_scale(jnp.ones(6), 3), 1.0)  # no valid group
    # [B, K] rewards: a group is valid if any dimension varies.
    multi = jnp.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0], [2.0, 2.0]])
    np.testing.assert_allclose(valid_group_scale(multi, 2), 3.0)
    with pytest.raises(ValueError, match="does not divide"):
        valid_group_scale(jnp.ones(5), 2)


def test_aggregation_modes():
    loss, _ = gpg(aggregation="seq-mean-token-mean")(jnp.array(NEW), ENT, make())
    row0 = (0.5 + 1.0) / 2
    row1 = 0.5 * (-3.0 - 1.0 - 2.0) / 3
    np.testing.assert_allclose(loss, (row0 + row1) / 4, rtol=1e-5)
    loss, _ = gpg(aggregation="seq-mean-token-sum-norm", max_len=10)(jnp.array(NEW), ENT, make())
    np.testing.assert_allclose(loss, -1.5 / (4 * 10), rtol=1e-5)


def test_padding_garbage_and_zero_weights():
    new = NEW.copy()
    new[~MASK] = -np.inf  # garbage at padded positions
    weights = MASK.astype(np.float32)
    weights[1] = 0.0  # row 1 filtered out
    (loss, metrics), grad = jax.value_and_grad(gpg(), has_aux=True)(
        jnp.array(new), ENT, make(loss_weights=weights)
    )
    np.testing.assert_allclose(loss, 1.5 / 5, rtol=1e-5)  # rows 0, 2, 3: 5 tokens
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[weights == 0] == 0)
    assert np.isfinite(metrics["gpg/logprob_mean"])


def test_errors():
    with pytest.raises(ValueError, match="valid modes"):
        gpg(aggregation="sum")
    with pytest.raises(ValueError, match="max_len=5 is only used"):
        gpg(max_len=5)
    with pytest.raises(ValueError, match="valid_group_scaling needs group_size >= 2"):
        valid_group_scaling(1)
    with pytest.raises(ValueError, match="mixes group ids"):
        SCALING.apply(make().replace(group_id=jnp.array([0, 1, 1, 2])), (), CTX)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        valid_group_scaling(3).apply(make(), (), CTX)
