"""Tests for rljax.objectives.sapo against a loop-based numpy reference of the SAPO paper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.sapo import sapo, sapo_gate

RATIO = np.array([[1.5, 0.5, 1.1], [5.0, 0.9, 3.0]], np.float32)
ADV = np.array([[1.0, 1.0, 1.0], [-1.0, -2.0, -2.0]], np.float32)
OLD = np.array([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0]], np.float32)
NEW = OLD + np.log(RATIO)
MASK = np.array([[1, 1, 1], [1, 1, 0]], bool)
ENT = jnp.zeros((2, 3))


def make(mask=MASK):
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        old_logprobs=OLD,
        advantages=ADV * mask,
    )


def reference(new, old, adv, mask, tau_pos, tau_neg):
    """Seq-mean-token-mean SAPO loss and d loss / d new log-probs, one token at a time:
    f(r) = sigmoid(tau (r - 1)) 4 / tau, df/dlog r = 4 s (1 - s) r."""
    loss, grad = 0.0, np.zeros(new.shape)
    rows = [i for i in range(new.shape[0]) if mask[i].any()]
    for i in rows:
        n = int(mask[i].sum())
        for j in np.flatnonzero(mask[i]):
            r = np.exp(float(new[i, j]) - float(old[i, j]))
            tau = tau_pos if adv[i, j] > 0 else tau_neg
            s = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
            loss += -s * 4.0 / tau * float(adv[i, j]) / n / len(rows)
            grad[i, j] = -4.0 * s * (1.0 - s) * r * float(adv[i, j]) / n / len(rows)
    return loss, grad


@pytest.mark.parametrize("taus", [(1.0, 1.05), (2.0, 4.0)])
def test_loss_and_gradient_match_reference(taus):
    obj = jax.jit(sapo(*taus))
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(jnp.array(NEW), ENT, make())
    ref_loss, ref_grad = reference(NEW, OLD, ADV, MASK, *taus)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["sapo/loss"], loss)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_gate_hand_values():
    # f(1) = 0.5 * 4 / tau = 2 / tau; the slope in log r at r = 1 is 4 * 0.25 * 1 = 1.
    np.testing.assert_allclose(sapo_gate(jnp.float32(1.0), 2.0), 1.0)
    slope = jax.grad(lambda lr: sapo_gate(jnp.exp(lr), 1.7))(0.0)
    np.testing.assert_allclose(slope, 1.0, rtol=1e-6)
    # The slope in r, 4 s (1 - s), is largest at r = 1 and fades smoothly on both sides (a
    # hard clip cuts it to exactly zero at the boundary); far from 1 no gradient is left.
    slopes = [float(jax.grad(lambda r: sapo_gate(r, 1.0))(x)) for x in (1.0, 1.5, 4.0, 0.2)]
    assert slopes[0] == pytest.approx(1.0) and slopes[0] > slopes[1] > slopes[2] > 0
    assert 0 < slopes[3] < slopes[0]
    assert float(jax.grad(lambda lr: sapo_gate(jnp.exp(lr), 1.0))(3.0)) < 1e-6


def test_on_policy_gradient_is_reinforce():
    grad = jax.grad(lambda lp: sapo()(lp, ENT, make())[0])(jnp.array(OLD))
    counts = MASK.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(grad, -ADV * MASK / counts / 2, rtol=1e-6)


def test_larger_negative_temperature_damps_negative_updates():
    # A negative token pushed down to r = 0.5: the larger tau_neg, the smaller its gradient.
    g = [jax.grad(lambda lr, t=t: sapo_gate(jnp.exp(lr), t))(np.log(0.5)) for t in (1.0, 3.0)]
    assert g[1] < g[0]


def test_garbage_on_masked_tokens_and_metrics():
    new = NEW.copy()
    new[1, 2] = np.inf
    (loss, metrics), grad = jax.value_and_grad(sapo(), has_aux=True)(jnp.array(new), ENT, make())
    ref_loss, ref_grad = reference(NEW, OLD, ADV, MASK, 1.0, 1.05)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    gates = [sapo_gate(RATIO[0, j], 1.0) for j in range(3)] + [
        sapo_gate(RATIO[1, j], 1.05) for j in range(2)
    ]
    np.testing.assert_allclose(metrics["sapo/gate_mean"], np.mean(gates), rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="tau_pos=0"):
        sapo(tau_pos=0.0)
    with pytest.raises(ValueError, match="valid modes"):
        sapo(aggregation="sum")
