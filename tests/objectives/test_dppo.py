"""Tests for rljax.objectives.dppo against a loop-based numpy reference of the DPPO paper's
Binary-TV and Binary-KL trust regions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.dppo import binary_kl, dppo

# Probabilities of the sampled tokens before and after, chosen around the bounds below.
P_OLD = np.array([[0.50, 0.10, 0.80, 0.30], [0.40, 0.05, 0.90, 0.60]])
P_NEW = np.array([[0.72, 0.29, 0.70, 0.31], [0.10, 0.01, 0.95, 0.20]])
ADV = np.array([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]], np.float32)
OLD = np.log(P_OLD).astype(np.float32)
NEW = np.log(P_NEW).astype(np.float32)
MASK = np.ones((2, 4), bool)
ENT = jnp.zeros((2, 4))


def make(mask=MASK):
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 4)),
        completion_mask=mask,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        old_logprobs=OLD,
        advantages=ADV * mask,
    )


def reference(divergence, low, high, cap, mask=MASK):
    """Token-mean loss, gradient and kept mask, one token at a time, from the paper's rule."""
    loss, grad, keep = 0.0, np.zeros(P_OLD.shape), np.zeros(P_OLD.shape, bool)
    n = int(mask.sum())
    for i, j in zip(*np.nonzero(mask), strict=True):
        p, q, a = P_OLD[i, j], P_NEW[i, j], float(ADV[i, j])
        if divergence == "tv":
            ok = q - p <= high if a > 0 else q - p >= -low
        else:
            kl = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
            ok = (kl <= high or q <= p) if a > 0 else (kl <= low or q >= p)
        keep[i, j] = ok
        w = min(q / p, cap)
        loss += -a * w * np.log(q) * ok / n
        grad[i, j] = -a * w * ok / n
    return loss, grad, keep


@pytest.mark.parametrize("divergence,low,high", [("tv", 0.25, 0.2), ("kl", 0.3, 0.05)])
@pytest.mark.parametrize("cap", [20.0, 2.0])
def test_loss_gradient_and_mask_match_reference(divergence, low, high, cap):
    obj = jax.jit(dppo(divergence, low, high, cap))
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(jnp.array(NEW), ENT, make())
    ref_loss, ref_grad, keep = reference(divergence, low, high, cap)
    assert 0 < keep.sum() < keep.size  # the bounds cut between the tokens
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["dppo/masked_frac"], 1 - keep.mean(), rtol=1e-6)
    capped = keep & (P_NEW / P_OLD > cap)
    np.testing.assert_allclose(metrics["dppo/capped_frac"], capped.mean(), rtol=1e-6)


def test_hand_tv_mask():
    # A > 0 (row 0): p rose by 0.22 (masked, > 0.2), 0.19 (kept), fell 0.10
    # (kept: moving back), rose 0.01 (kept). A < 0 (row 1): fell 0.30 (masked, < -0.25), fell
    # 0.04 (kept), rose 0.05 (kept), fell 0.40 (masked).
    _, _, keep = reference("tv", 0.25, 0.2, 20.0)
    np.testing.assert_array_equal(keep, [[0, 1, 1, 1], [0, 1, 1, 0]])
    _, metrics = dppo("tv", 0.25, 0.2)(jnp.array(NEW), ENT, make())
    np.testing.assert_allclose(metrics["dppo/masked_frac"], 3 / 8, rtol=1e-6)


def test_binary_kl_hand_value_and_zero():
    p, q = 0.5, 0.72
    expected = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
    np.testing.assert_allclose(binary_kl(np.log(p), np.log(q)), expected, rtol=1e-5)
    np.testing.assert_allclose(binary_kl(np.log(0.3), np.log(0.3)), 0.0, atol=1e-7)


def test_on_policy_gradient_is_reinforce():
    grad = jax.grad(lambda lp: dppo("kl")(lp, ENT, make())[0])(jnp.array(OLD))
    np.testing.assert_allclose(grad, -ADV / 8, rtol=1e-6)


def test_masked_garbage_stays_finite():
    mask = MASK.copy()
    mask[:, 3] = False
    new = NEW.copy()
    new[0, 3], new[1, 3] = np.nan, -np.inf
    (loss, _), grad = jax.value_and_grad(dppo("tv", 0.25, 0.2), has_aux=True)(
        jnp.array(new), ENT, make(mask)
    )
    ref_loss, ref_grad, _ = reference("tv", 0.25, 0.2, 20.0, mask)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_errors():
    with pytest.raises(ValueError, match="divergence='js'"):
        dppo("js")
    with pytest.raises(ValueError, match="delta_low=-0.1"):
        dppo(delta_low=-0.1)
    with pytest.raises(ValueError, match="ratio_cap=0"):
        dppo(ratio_cap=0.0)
