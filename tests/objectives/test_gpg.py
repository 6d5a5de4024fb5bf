"""Tests for rljax.objectives.gpg: the plain policy-gradient loss and its batch scaling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.gpg import gpg, valid_group_scale

# Two groups of two. Group 0 rewards (1, 0) vary: Dr. GRPO advantages (+0.5, -0.5).
# Group 1 rewards (1, 1) are equal: advantage 0, no learning signal.
REWARDS = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
SEQ_ADV = np.array([0.5, -0.5, 0.0, 0.0], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
NEW = np.array(
    [[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0], [-0.7, -1.5, -2.5], [-1.2, -0.3, -4.0]], np.float32
)
ENT = jnp.zeros((4, 3))


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
    assert "gpg/alpha" not in metrics


def test_gradient_is_minus_advantage_over_token_count():
    grad = jax.grad(lambda lp: gpg()(lp, ENT, make())[0])(jnp.array(NEW))
    expected = np.where(MASK, -SEQ_ADV[:, None] / MASK.sum(), 0.0)
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8)


def test_valid_group_scaling():
    obj = jax.jit(gpg(valid_group_scaling=True, group_size=2))
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(jnp.array(NEW), ENT, make())
    # B = 4 samples, B_valid = 2 (group 0 only): alpha = 2.
    np.testing.assert_allclose(metrics["gpg/alpha"], 2.0)
    np.testing.assert_allclose(loss, 2.0 * -1.5 / 8, rtol=1e-5)
    np.testing.assert_allclose(
        grad, np.where(MASK, -2.0 * SEQ_ADV[:, None] / MASK.sum(), 0.0), rtol=1e-6, atol=1e-8
    )


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
    with pytest.raises(ValueError, match="valid_group_scaling needs group_size"):
        gpg(valid_group_scaling=True)
    with pytest.raises(ValueError, match="mixes group ids"):
        gpg(valid_group_scaling=True, group_size=2)(
            jnp.array(NEW), ENT, make().replace(group_id=jnp.array([0, 1, 1, 2]))
        )
