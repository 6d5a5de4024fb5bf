"""The clipped value loss against numpy, including which branch of the max is taken."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.value import clipped_value_loss


def make(returns, old_values, mask, weights=None):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b),
        rewards=np.zeros(b),
        loss_weights=weights,
        extras={"returns": returns, "old_values": old_values},
    )


def test_matches_numpy_token_mean():
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    returns, old, new = rng.normal(size=(3, 2, 3)).astype(np.float32)
    loss, metrics = clipped_value_loss(coef=0.5, clip=0.2)(
        jnp.asarray(new), make(returns, old, mask)
    )
    clipped = np.clip(new, old - 0.2, old + 0.2)
    per = np.maximum((new - returns) ** 2, (clipped - returns) ** 2)
    np.testing.assert_allclose(loss, 0.5 * 0.5 * per[mask].mean(), rtol=1e-5)
    frac = ((clipped - returns) ** 2 > (new - returns) ** 2)[mask].mean()
    np.testing.assert_allclose(metrics["value/clip_frac"], frac, rtol=1e-6)


def test_clip_frac_counts_only_values_outside_the_band_in_float32():
    # Old and new values of very different magnitudes (old down to 1e-8, new ~0.1): in float32
    # new - old rounds, so old + (new - old) != new for many tokens, and a clipped value built
    # that way differs from new inside the band and would be counted as clipped. Half the
    # tokens stay inside the band (|new - old| < 0.2 = clip), half move 1 outside it.
    rng = np.random.default_rng(0)
    shape = (8, 64)
    old = rng.uniform(-0.1, 0.1, shape) * 10.0 ** -rng.integers(0, 9, size=shape)
    inside = rng.random(shape) < 0.5
    new = np.where(inside, rng.uniform(-0.1, 0.1, shape), old + rng.choice([-1.0, 1.0], shape))
    old, new = old.astype(np.float32), new.astype(np.float32)
    returns = rng.normal(size=shape).astype(np.float32)
    assert np.any((old + (new - old)) != new)  # the rounding this test is about
    mask = np.ones(shape, bool)
    _, metrics = clipped_value_loss(coef=0.5, clip=0.2)(jnp.asarray(new), make(returns, old, mask))
    new64, old64, ret64 = (x.astype(np.float64) for x in (new, old, returns))
    clipped = np.clip(new64, old64 - 0.2, old64 + 0.2)
    frac = ((clipped - ret64) ** 2 > (new64 - ret64) ** 2).mean()
    assert 0 < frac < 0.5  # only tokens outside the band can be clipped
    np.testing.assert_allclose(metrics["value/clip_frac"], frac, atol=1e-6)


def test_clip_keeps_the_larger_error_and_stops_its_gradient():
    # Old value 0, new 1 (moved past the 0.2 band), return 2: the unclipped error 1 is smaller
    # than the clipped one (0.2 - 2)^2, so the clipped term is taken and has no gradient.
    mask = np.ones((1, 1), bool)
    batch = make(np.array([[2.0]]), np.array([[0.0]]), mask)
    loss_fn = clipped_value_loss(coef=1.0, clip=0.2)
    loss, _ = loss_fn(jnp.array([[1.0]]), batch)
    np.testing.assert_allclose(loss, 0.5 * 1.8**2, rtol=1e-6)
    grad = jax.grad(lambda v: loss_fn(v, batch)[0])(jnp.array([[1.0]]))
    np.testing.assert_allclose(grad, 0.0, atol=1e-7)
    plain = clipped_value_loss(coef=1.0, clip=None)
    grad = jax.grad(lambda v: plain(v, batch)[0])(jnp.array([[1.0]]))
    np.testing.assert_allclose(grad, [[-1.0]], rtol=1e-6)  # d/dv 0.5 (v - 2)^2


def test_errors():
    with pytest.raises(ValueError, match="coef=0"):
        clipped_value_loss(coef=0)
    with pytest.raises(ValueError, match="clip=-1"):
        clipped_value_loss(clip=-1)
    batch = make(np.zeros((1, 1)), np.zeros((1, 1)), np.ones((1, 1), bool)).replace(extras={})
    with pytest.raises(ValueError, match="gae_advantages"):
        clipped_value_loss()(jnp.zeros((1, 1)), batch)
