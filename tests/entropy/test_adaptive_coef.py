"""Tests for rljax.entropy.adaptive_coef: the coefficient's trajectory against a hand-run of
the rule over a sequence of batch entropies, and the bonus's gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.entropy.adaptive_coef import adaptive_entropy_bonus, adaptive_entropy_coef

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
MASK = np.array([[1, 1, 0], [1, 1, 1]], bool)


def batch_with_entropy(h):
    """A batch whose pre-update token entropies average h over its 5 valid tokens (the
    padding holds garbage that must not count)."""
    entropy = np.where(MASK, h, 99.0).astype(np.float32)
    entropy[1, 0], entropy[1, 1] = h - 0.01, h + 0.01
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=MASK,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        extras={"old_entropy": entropy},
    )


def test_coefficient_follows_the_rule_step_by_step():
    t = adaptive_entropy_coef(target=0.2, step=0.01, max_coef=0.025)
    state = t.init()
    # Hand-run of alpha_k = c_k [H_k <= 0.2], c_{k+1} = clip(c_k + 0.01 sign(0.2 - H_k), 0, 0.025):
    entropies = [0.1, 0.1, 0.15, 0.1, 0.3, 0.3, 0.3, 0.2]
    expected_alpha = [0.0, 0.01, 0.02, 0.025, 0.0, 0.0, 0.0, 0.0]
    expected_next = [0.01, 0.02, 0.025, 0.025, 0.015, 0.005, 0.0, 0.0]
    for h, alpha, nxt in zip(entropies, expected_alpha, expected_next, strict=True):
        out, state, metrics = t.apply(batch_with_entropy(h), state, CTX)
        np.testing.assert_allclose(metrics["adaptive_entropy/batch_entropy"], h, rtol=1e-5)
        np.testing.assert_allclose(metrics["adaptive_entropy/coef"], alpha, atol=1e-7)
        np.testing.assert_allclose(state.coef, nxt, atol=1e-7)
        np.testing.assert_allclose(out.extras["entropy_coef"], [alpha, alpha], atol=1e-7)


def test_bonus_gradient_is_minus_alpha_over_the_token_count():
    batch = batch_with_entropy(0.1).replace(extras={"entropy_coef": jnp.full((2,), 0.03)})
    obj = adaptive_entropy_bonus()
    entropy = jnp.full((2, 3), 0.5)
    (loss, metrics), grad = jax.value_and_grad(
        lambda e: obj(jnp.zeros((2, 3)), e, batch), has_aux=True
    )(entropy)
    np.testing.assert_allclose(loss, -0.03 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(grad, np.where(MASK, -0.03 / 5, 0.0), rtol=1e-6)
    assert metrics["adaptive_entropy/loss"] == loss


def test_errors():
    with pytest.raises(ValueError, match="target=0"):
        adaptive_entropy_coef(0.0)
    with pytest.raises(ValueError, match="max_coef=0.001"):
        adaptive_entropy_coef(0.2, step=0.01, max_coef=0.001)
