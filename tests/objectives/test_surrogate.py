"""Tests for rljax.objectives.surrogate.ppo_clip against a loop-based numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.surrogate import ppo_clip

# Ratios and advantages chosen to hit every branch (eps = 0.2):
#   r=1.5, A=+1 -> clipped (1.2)      r=0.5, A=+1 -> unclipped (r*A smaller)
#   r=0.5, A=-1 -> clipped (0.8)      r=5.0, A=-1 -> unclipped, dual clip c=3 caps the loss at 3
#   r=1.1, A=+2 -> inside the band
#   r=3.0, A=-2 -> unclipped, loss 6 equals the dual cap 6 (not active)
RATIO = np.array([[1.5, 0.5, 0.5], [5.0, 1.1, 3.0]], np.float32)
ADV = np.array([[1.0, 1.0, -1.0], [-1.0, 2.0, -2.0]], np.float32)
OLD = np.array([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0]], np.float32)
NEW = OLD + np.log(RATIO)
MASK = np.ones((2, 3), bool)


def make(mask=MASK, adv=ADV, old=OLD):
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        old_logprobs=old,
        advantages=np.asarray(adv) * mask,
    )


def reference(ratio, adv, mask, eps_low=0.2, eps_high=0.2, c=None):
    losses, clipped_count, dual_count, n = 0.0, 0, 0, 0
    for i in range(ratio.shape[0]):
        for j in range(ratio.shape[1]):
            if not mask[i, j]:
                continue
            r, a = float(ratio[i, j]), float(adv[i, j])
            un = -r * a
            cl = -min(max(r, 1 - eps_low), 1 + eps_high) * a
            loss = max(un, cl)
            clipped_count += cl > un
            if c is not None and a < 0 and loss > -c * a:
                loss = -c * a
                dual_count += 1
            losses += loss
            n += 1
    return losses / n, clipped_count / n, dual_count / n


def test_loss_and_clip_frac_match_reference():
    loss, metrics = ppo_clip()(jnp.array(NEW), jnp.zeros((2, 3)), make())
    ref_loss, ref_clip, _ = reference(RATIO, ADV, MASK)
    # By hand: [-1.2, -0.5, 0.8, 5.0, -2.2, 6.0] -> mean 7.9 / 6; clipped tokens 0 and 2.
    np.testing.assert_allclose(ref_loss, 7.9 / 6, rtol=1e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/clip_frac"], ref_clip)
    np.testing.assert_allclose(ref_clip, 2 / 6)
    assert "pg/dual_clip_frac" not in metrics
    np.testing.assert_allclose(metrics["pg/loss"], loss)


def test_dual_clip():
    loss, metrics = ppo_clip(dual_clip_c=3.0)(jnp.array(NEW), jnp.zeros((2, 3)), make())
    ref_loss, _, ref_dual = reference(RATIO, ADV, MASK, c=3.0)
    # Only the r=5, A=-1 token is capped: 5.0 -> 3.0.
    np.testing.assert_allclose(ref_loss, 5.9 / 6, rtol=1e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/dual_clip_frac"], ref_dual)
    np.testing.assert_allclose(ref_dual, 1 / 6)


def test_asymmetric_clip():
    loss, metrics = ppo_clip(eps_low=0.1, eps_high=0.6)(jnp.array(NEW), jnp.zeros((2, 3)), make())
    ref_loss, ref_clip, _ = reference(RATIO, ADV, MASK, eps_low=0.1, eps_high=0.6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/clip_frac"], ref_clip)


def test_gradient_is_zero_on_clipped_tokens():
    grad = jax.grad(lambda lp: ppo_clip(dual_clip_c=3.0)(lp, jnp.zeros((2, 3)), make())[0])(
        jnp.array(NEW)
    )
    # d(-r*A)/d logp = -r*A on unclipped tokens, / 6 tokens; 0 where clipped or dual-capped.
    expected = np.where([[0, 1, 0], [0, 1, 1]], -RATIO * ADV, 0.0) / 6
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_mask_excludes_tokens_and_garbage_stays_finite():
    mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    new = NEW.copy()
    new[0, 2], new[1, 2] = 1e4, -1e4  # padded positions with garbage log-probs
    obj = ppo_clip(dual_clip_c=3.0)
    (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(
        jnp.array(new), jnp.zeros((2, 3)), make(mask)
    )
    ref_loss, ref_clip, ref_dual = reference(RATIO, ADV, mask, c=3.0)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/clip_frac"], ref_clip)
    np.testing.assert_allclose(metrics["pg/dual_clip_frac"], ref_dual)
    np.testing.assert_allclose(metrics["pg/ratio_max"], 5.0, rtol=1e-5)
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0)


def test_ratio_and_kl_metrics():
    _, metrics = jax.jit(ppo_clip())(jnp.array(NEW), jnp.zeros((2, 3)), make())
    r = RATIO.ravel().astype(np.float64)
    np.testing.assert_allclose(metrics["pg/ratio_mean"], r.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/ratio_max"], 5.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/approx_kl"], np.mean(r - 1 - np.log(r)), rtol=1e-5)


def test_on_policy_loss_is_minus_mean_advantage():
    loss, metrics = ppo_clip()(jnp.array(OLD), jnp.zeros((2, 3)), make())
    np.testing.assert_allclose(loss, -ADV.mean(), rtol=1e-6)
    assert metrics["pg/clip_frac"] == 0 and metrics["pg/approx_kl"] == 0


def test_seq_mean_token_mean_aggregation():
    mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    loss, _ = ppo_clip(aggregation="seq-mean-token-mean")(
        jnp.array(NEW), jnp.zeros((2, 3)), make(mask)
    )
    np.testing.assert_allclose(loss, ((-1.2 - 0.5) / 2 + 5.0) / 2, rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="eps_low=1.0"):
        ppo_clip(eps_low=1.0)
    with pytest.raises(ValueError, match="eps_high=-0.1"):
        ppo_clip(eps_high=-0.1)
    with pytest.raises(ValueError, match="dual_clip_c=1.0 must be > 1"):
        ppo_clip(dual_clip_c=1.0)
    with pytest.raises(ValueError, match="valid modes"):
        ppo_clip(aggregation="sum")


def test_clip_scale_from_extras_tightens_the_clip_range_per_row():
    # Ratio 1.15 on both rows, A > 0: inside the 0.2 band unless the row's range is halved.
    b = make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 1)),
        completion_mask=np.ones((2, 1)),
        group_id=np.arange(2),
        rewards=np.zeros(2),
        old_logprobs=np.zeros((2, 1)),
        advantages=np.ones((2, 1)),
        extras={"clip_scale": np.array([1.0, 0.5], np.float32)},
    )
    new = jnp.full((2, 1), np.log(1.15), jnp.float32)
    objective = ppo_clip(0.2, 0.2)
    loss, metrics = objective(new, jnp.zeros((2, 1)), b)
    np.testing.assert_allclose(loss, -(1.15 + 1.1) / 2, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg/clip_frac"], 0.5)


def test_unit_is_weight_is_bit_identical_to_no_weight():
    new = jnp.array(NEW)
    for kwargs in ({}, {"dual_clip_c": 3.0}, {"aggregation": "seq-mean-token-sum"}):
        plain = make()
        weighted = plain.replace(extras={"is_weight": jnp.ones((2, 3), jnp.float32)})
        objective = ppo_clip(**kwargs)
        (l0, m0), g0 = jax.value_and_grad(objective, has_aux=True)(new, jnp.zeros((2, 3)), plain)
        (l1, m1), g1 = jax.value_and_grad(objective, has_aux=True)(new, jnp.zeros((2, 3)), weighted)
        np.testing.assert_array_equal(l1, l0)
        np.testing.assert_array_equal(g1, g0)
        for key in m0:
            np.testing.assert_array_equal(m1[key], m0[key])


def test_is_weight_multiplies_the_clipped_term_not_the_normaliser():
    # Per-token losses [-1.2, -0.5, 0.8, 5.0, -2.2, 6.0] (see the first test) times the weights;
    # token-mean still divides by the 6 loss weights, not by the sum of the IS weights.
    w = np.array([[2.0, 0.5, 1.0], [0.25, 1.5, 0.0]], np.float32)
    batch = make().replace(extras={"is_weight": jnp.asarray(w)})
    loss_fn = ppo_clip()
    (loss, _), grad = jax.value_and_grad(loss_fn, has_aux=True)(
        jnp.array(NEW), jnp.zeros((2, 3)), batch
    )
    per_token = np.array([[-1.2, -0.5, 0.8], [5.0, -2.2, 6.0]])
    np.testing.assert_allclose(loss, (per_token * w).sum() / 6, rtol=1e-5)
    # The gradient is the unweighted one scaled per token (the weight is a constant).
    expected = np.where([[0, 1, 0], [1, 1, 1]], -RATIO * ADV, 0.0) * w / 6
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
    # No gradient flows into the weight.
    dw = jax.grad(
        lambda x: loss_fn(
            jnp.array(NEW), jnp.zeros((2, 3)), make().replace(extras={"is_weight": x})
        )[0]
    )(jnp.asarray(w))
    np.testing.assert_array_equal(dw, np.zeros_like(w))


def test_is_weight_shape_is_checked():
    batch = make().replace(extras={"is_weight": jnp.ones((2,))})
    with pytest.raises(ValueError, match="is_weight"):
        ppo_clip()(jnp.array(NEW), jnp.zeros((2, 3)), batch)
