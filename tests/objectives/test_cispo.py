"""Tests for rljax.objectives.cispo: clipped stop-gradient IS weights on REINFORCE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.cispo import cispo

# Ratios r = pi_new / pi_old and advantages. With eps_high = 0.2 and no lower bound the
# weights are min(r, 1.2) = [[1.2, 0.5, 1.1], [1.2, 0.9, 1.2]]; with eps_low = 0.2 the 0.5
# becomes 0.8.
RATIO = np.array([[1.5, 0.5, 1.1], [5.0, 0.9, 3.0]], np.float32)
ADV = np.array([[1.0, 1.0, -1.0], [-1.0, 2.0, -2.0]], np.float32)
OLD = np.array([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0]], np.float32)
NEW = OLD + np.log(RATIO)
MASK = np.ones((2, 3), bool)
ENT = jnp.zeros((2, 3))


def make(mask=MASK, loss_weights=None):
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        old_logprobs=OLD,
        advantages=ADV * mask,
        loss_weights=loss_weights,
    )


def reference(new, old, adv, mask, eps_low, eps_high):
    """Token-mean CISPO loss, its gradient w.r.t. new log-probs, and the clip fraction."""
    loss, grad, n_clipped = 0.0, np.zeros(new.shape), 0
    n = int(mask.sum())
    for i in range(new.shape[0]):
        for j in range(new.shape[1]):
            if not mask[i, j]:
                continue
            r = np.exp(float(new[i, j]) - float(old[i, j]))
            w = min(r, 1 + eps_high) if eps_low is None else min(max(r, 1 - eps_low), 1 + eps_high)
            n_clipped += w != r
            loss += -w * float(adv[i, j]) * float(new[i, j]) / n
            grad[i, j] = -w * float(adv[i, j]) / n
    return loss, grad, n_clipped / n


@pytest.mark.parametrize("eps_low", [None, 0.2])
def test_loss_gradient_and_clip_frac_match_reference(eps_low):
    obj = jax.jit(cispo(eps_high=0.2, eps_low=eps_low))
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(jnp.array(NEW), ENT, make())
    ref_loss, ref_grad, ref_clip = reference(NEW, OLD, ADV, MASK, eps_low, 0.2)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["cispo/loss"], loss)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["cispo/clip_frac"], ref_clip)


def test_gradient_is_exactly_minus_clipped_weight_times_advantage():
    grad = jax.grad(lambda lp: cispo()(lp, ENT, make())[0])(jnp.array(NEW))
    # Hand: the weight is stop-gradient, so d loss / d logp_t = -clip(r_t) * A_t / 6.
    weights = np.array([[1.2, 0.5, 1.1], [1.2, 0.9, 1.2]])
    np.testing.assert_allclose(grad, -weights * ADV / 6, rtol=1e-5)
    # Unlike PPO's clip, no token with A != 0 loses its gradient, not even r = 5 or r = 3.
    assert np.all(np.asarray(grad) != 0)


def test_hand_loss_value_and_metrics():
    loss, metrics = cispo()(jnp.array(NEW), ENT, make())
    weights = np.array([[1.2, 0.5, 1.1], [1.2, 0.9, 1.2]])
    np.testing.assert_allclose(loss, np.mean(-weights * ADV * NEW), rtol=1e-5)
    np.testing.assert_allclose(metrics["cispo/clip_frac"], 3 / 6)  # r = 1.5, 5.0, 3.0
    np.testing.assert_allclose(metrics["cispo/weight_mean"], weights.mean(), rtol=1e-5)
    r = RATIO.astype(np.float64)
    np.testing.assert_allclose(metrics["cispo/ratio_mean"], r.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["cispo/ratio_max"], 5.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["cispo/approx_kl"], np.mean(r - 1 - np.log(r)), rtol=1e-5)


def test_on_policy_gradient_is_reinforce():
    grad = jax.grad(lambda lp: cispo()(lp, ENT, make())[0])(jnp.array(OLD))
    np.testing.assert_allclose(grad, -ADV / 6, rtol=1e-6)


def test_mask_and_garbage_stay_finite():
    mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    new = NEW.copy()
    new[0, 2], new[1, 2] = 1e4, -np.inf
    (loss, metrics), grad = jax.value_and_grad(cispo(), has_aux=True)(
        jnp.array(new), ENT, make(mask)
    )
    ref_loss, ref_grad, ref_clip = reference(NEW, OLD, ADV, mask, None, 0.2)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["cispo/clip_frac"], ref_clip)
    assert all(np.isfinite(v) for v in metrics.values())


def test_seq_mean_token_sum_aggregation():
    loss, _ = cispo(aggregation="seq-mean-token-sum")(jnp.array(NEW), ENT, make())
    weights = np.array([[1.2, 0.5, 1.1], [1.2, 0.9, 1.2]])
    np.testing.assert_allclose(loss, (-weights * ADV * NEW).sum() / 2, rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="eps_high=-0.1"):
        cispo(eps_high=-0.1)
    with pytest.raises(ValueError, match="eps_low=1.5"):
        cispo(eps_low=1.5)
    with pytest.raises(ValueError, match="valid modes"):
        cispo(aggregation="sum")
