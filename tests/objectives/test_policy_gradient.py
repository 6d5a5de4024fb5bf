"""Per-token policy-gradient surrogates and the objective builder that does the plumbing once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core import keys
from rljax.core.batch import make_batch
from rljax.entropy.covariance import kl_cov
from rljax.objectives.policy_gradient import (
    clipped_is_reinforce,
    clipped_surrogate,
    dual_clip,
    policy_gradient_objective,
    reinforce,
)
from rljax.objectives.surrogate import ppo_clip


def test_clipped_surrogate_hand_values():
    ratio = jnp.asarray([0.5, 1.0, 1.5, 1.5, 0.5])
    adv = jnp.asarray([1.0, 2.0, 1.0, -1.0, -1.0])
    loss, clipped = clipped_surrogate(ratio, adv, 0.2, 0.2)
    # -min(rA, clip(r)A): [-0.5, -2, -1.2, 1.5, 0.8]
    np.testing.assert_allclose(loss, [-0.5, -2.0, -1.2, 1.5, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [False, False, True, False, True])


def test_dual_clip_bounds_negative_advantage_losses():
    loss, active = dual_clip(jnp.asarray([5.0, 1.0, 5.0]), jnp.asarray([-1.0, -1.0, 1.0]), 3.0)
    np.testing.assert_allclose(loss, [3.0, 1.0, 5.0])
    np.testing.assert_array_equal(active, [True, False, False])


def test_cispo_and_reinforce_gradients():
    logp = jnp.asarray([-1.0, -2.0])
    ratio = jnp.asarray([2.0, 0.5])
    adv = jnp.asarray([1.0, -1.0])
    grad = jax.grad(lambda lp: clipped_is_reinforce(lp, ratio, adv, 0.8, 1.2)[0].sum())(logp)
    np.testing.assert_allclose(grad, [-1.2, 0.8])  # -sg(clip(r)) A
    np.testing.assert_allclose(jax.grad(lambda lp: reinforce(lp, adv).sum())(logp), [-1.0, 1.0])


def batch(extras=None):
    mask = np.asarray([[1, 1, 0], [1, 1, 1]], bool)
    return make_batch(
        jnp.ones((2, 1)),
        jnp.ones((2, 1)),
        jnp.ones((2, 3)),
        mask,
        jnp.zeros(2),
        jnp.zeros(2),
        old_logprobs=jnp.full((2, 3), -1.0),
        advantages=jnp.asarray([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]),
        extras=extras,
    )


def test_builder_applies_is_weight_and_clip_scale_once():
    new = jnp.full((2, 3), -0.5)  # ratio e^0.5 ~ 1.65 everywhere
    plain = ppo_clip(0.2, 0.2)
    loss0, m0 = plain(new, new, batch())
    w = jnp.asarray([[2.0, 2.0, 2.0], [0.5, 0.5, 0.5]])
    loss_w, _ = plain(new, new, batch({"is_weight": w}))
    # token-mean over 5 valid tokens: [-1.2, -1.2] * 2 and [1.65...] * 0.5
    r = float(np.exp(0.5))
    np.testing.assert_allclose(loss0, (2 * -1.2 + 3 * r) / 5, rtol=1e-5)
    np.testing.assert_allclose(loss_w, (2 * -2.4 + 3 * 0.5 * r) / 5, rtol=1e-5)
    scaled, m = plain(new, new, batch({"clip_scale": jnp.asarray([0.5, 0.5])}))
    np.testing.assert_allclose(scaled, (2 * -1.1 + 3 * r) / 5, rtol=1e-5)
    assert float(m["pg/ratio_max"]) == pytest.approx(r, rel=1e-5)
    assert set(m0) == {"pg/loss", "pg/clip_frac", "pg/ratio_mean", "pg/ratio_max", "pg/approx_kl"}
    assert plain.reads == keys.PG_READS
    assert plain.optional_reads == {keys.IS_WEIGHT, keys.CLIP_SCALE}


def test_kl_cov_now_applies_the_rollout_correction_weight():
    new = jnp.full((2, 3), -0.5)
    objective = kl_cov(kl_coef=0.0)
    loss0, _ = objective(new, new, batch())
    loss2, _ = objective(new, new, batch({"is_weight": jnp.full((2, 3), 2.0)}))
    np.testing.assert_allclose(loss2, 2 * loss0, rtol=1e-6)


def test_builder_refuses_ratio_metrics_without_a_ratio():
    with pytest.raises(ValueError, match="ratio_metrics"):
        policy_gradient_objective("x", lambda pg: (pg.logprobs, {}), ratio=False)
