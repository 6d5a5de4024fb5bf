"""Tests for rljax.objectives.ipo against a loop-based numpy transcription of prime-rl's
`ipo_loss_fn` formula (per token: -A r keep + kl_tau log^2 r, keep = |pi - mu| <= threshold)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.ipo import ipo

# Sampler and trained probabilities of the sampled tokens: a rare token that doubles (moves
# 0.02, kept), a likely one that moves 0.15 (masked at 0.1), small moves both ways.
P_MU = np.array([[0.02, 0.70, 0.40, 0.90], [0.30, 0.05, 0.60, 0.50]])
P_PI = np.array([[0.04, 0.55, 0.45, 0.95], [0.12, 0.05, 0.62, 0.30]])
ADV = np.array([[1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, -0.5, -0.5]], np.float32)
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
ENT = jnp.zeros((2, 4))


def make():
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 4)),
        completion_mask=MASK,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        rollout_logprobs=np.log(P_MU).astype(np.float32),
        advantages=ADV * MASK,
    )


def reference(threshold, kl_tau):
    """Token-mean loss and its gradient w.r.t. log pi, one token at a time."""
    n = int(MASK.sum())
    loss, grad, kept = 0.0, np.zeros(MASK.shape), np.zeros(MASK.shape, bool)
    for i, j in zip(*np.nonzero(MASK), strict=True):
        r = P_PI[i, j] / P_MU[i, j]
        keep = abs(P_PI[i, j] - P_MU[i, j]) <= threshold
        kept[i, j] = keep
        a = float(ADV[i, j])
        loss += (-a * r * keep + kl_tau * np.log(r) ** 2) / n
        grad[i, j] = (-a * r * keep + 2 * kl_tau * np.log(r)) / n  # d/dlog pi
    return loss, grad, kept


@pytest.mark.parametrize("threshold,kl_tau", [(0.1, 1e-3), (0.3, 0.5)])
def test_loss_gradient_and_mask_match_reference(threshold, kl_tau):
    obj = jax.jit(ipo(threshold, kl_tau))
    new = jnp.asarray(np.log(P_PI), jnp.float32)
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(new, ENT, make())
    ref_loss, ref_grad, kept = reference(threshold, kl_tau)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["ipo/masked_frac"], 1 - kept[MASK].mean(), rtol=1e-6)


def test_hand_mask_is_symmetric_and_ignores_the_advantage_sign():
    _, _, kept = reference(0.1, 0.0)
    # Moves: +0.02, -0.15, +0.05, +0.05 (A > 0) and -0.18, 0, +0.02 (A < 0): the two large
    # moves are masked whichever their direction or the advantage's sign.
    np.testing.assert_array_equal(kept[MASK], [1, 0, 1, 1, 0, 1, 1])


def test_on_policy_gradient_is_reinforce_and_kl_is_zero():
    new = jnp.asarray(np.log(P_MU), jnp.float32)
    (loss, metrics), grad = jax.value_and_grad(ipo(), has_aux=True)(new, ENT, make())
    np.testing.assert_allclose(grad, -ADV * MASK / 7, rtol=1e-6)
    np.testing.assert_allclose(metrics["ipo/mismatch_kl"], 0.0, atol=1e-7)


def test_errors():
    with pytest.raises(ValueError, match="threshold=-0.1"):
        ipo(threshold=-0.1)
