"""Tests for rljax.objectives.mu_grpo against loop-based numpy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.aggregation import aggregation_denominator
from rljax.core.batch import make_batch
from rljax.objectives.mu_grpo import mu_grpo, negative_advantage_veto
from rljax.objectives.surrogate import ppo_clip

DELTA = math.log(1.28)  # the default veto_delta for eps_high = 0.28, ~0.2469
# Per-token log(pi/mu); with eps 0.2 / 0.28 the clip band of log r is [-0.223, 0.247]:
#   row 0: A = -1, first |lr| > delta at t = 1           -> keep [T, F, F, F]
#   row 1: A = +1 (positive), drifts everywhere         -> untouched
#   row 2: A = [1, -3, -1, -1] (mean -1), trigger at t=2 -> keep [T, T, F, F]
#   row 3: A = -1, valid tokens inside the band; the padded t = 2, 3 hold garbage 5.0 which
#          must not trigger                             -> untouched
LR = np.array(
    [
        [0.1, 0.3, -0.05, 0.5],
        [0.5, -0.5, 0.4, 0.3],
        [0.1, 0.0, -0.3, 0.0],
        [0.1, -0.2, 5.0, 5.0],
    ],
    np.float32,
)
ADV = np.array([[-1.0] * 4, [1.0] * 4, [1.0, -3.0, -1.0, -1.0], [-1.0, -1.0, 0.0, 0.0]], np.float32)
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], bool)
KEEP = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], bool)
OLD = np.array(
    [[-1.0, -2.0, -0.5, -1.5], [-3.0, -1.0, -2.0, -0.2], [-0.7, -1.5, -2.5, -1.0], [-1.2] * 4],
    np.float32,
)
NEW = OLD + LR
ENT = jnp.zeros((4, 4))

veto = jax.jit(negative_advantage_veto, static_argnames="delta")
OBJ = jax.jit(mu_grpo())
PPO = jax.jit(ppo_clip(0.2, 0.28))


def make(adv=ADV, mask=MASK, old=OLD, loss_weights=None):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b),
        rewards=np.zeros(b),
        old_logprobs=old,
        advantages=np.asarray(adv) * mask,
        loss_weights=loss_weights,
    )


def veto_reference(lr, adv, mask, delta):
    """The spec's rule, one row and token at a time."""
    keep = np.ones(mask.shape, bool)
    for i in range(mask.shape[0]):
        idx = [j for j in range(mask.shape[1]) if mask[i, j]]
        a = sum(float(adv[i, j]) for j in idx) / len(idx) if idx else 0.0
        if a >= 0:
            continue
        for j in idx:
            if abs(float(lr[i, j])) > delta:
                keep[i, j:] = False
                break
    return keep


def loss_reference(lr, adv, mask, weights, eps_low, eps_high, delta):
    """Token-mean of the vetoed PPO loss over the loss weights."""
    keep = veto_reference(lr, adv, mask, delta)
    total, wsum = 0.0, 0.0
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            if weights[i, j] == 0:
                continue
            r, a = math.exp(float(lr[i, j])), float(adv[i, j])
            loss = max(-r * a, -min(max(r, 1 - eps_low), 1 + eps_high) * a) if keep[i, j] else 0.0
            total += weights[i, j] * loss
            wsum += weights[i, j]
    return total / wsum


def test_veto_matches_hand_mask_and_reference():
    keep = veto(jnp.array(LR), jnp.array(ADV * MASK), jnp.array(MASK), delta=DELTA)
    np.testing.assert_array_equal(veto_reference(LR, ADV * MASK, MASK, DELTA), KEEP)
    np.testing.assert_array_equal(keep, KEEP)


def test_veto_threshold_is_strict_and_empty_rows_untouched():
    lr = np.array([[0.0, DELTA * 0.999, DELTA * 1.001], [9.0, 9.0, 9.0]], np.float32)
    adv = -np.ones((2, 3), np.float32)
    mask = np.array([[1, 1, 1], [0, 0, 0]], bool)
    keep = negative_advantage_veto(jnp.array(lr), jnp.array(adv), jnp.array(mask), DELTA)
    np.testing.assert_array_equal(keep, [[1, 1, 0], [1, 1, 1]])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-1.0, 1.0, width=32, allow_subnormal=False), min_size=15, max_size=15),
    st.lists(st.floats(-2.0, 2.0, width=32, allow_subnormal=False), min_size=15, max_size=15),
    st.lists(st.booleans(), min_size=15, max_size=15),
    st.floats(0.0, 0.8),
)
def test_veto_is_suffix_closed_and_matches_reference(lr, adv, mask, delta):
    lr, adv = np.array(lr, np.float32).reshape(3, 5), np.array(adv, np.float32).reshape(3, 5)
    # A row mean of tiny advantages can be subnormal, which XLA on CPU flushes to zero (sign
    # lost): round so numpy and XLA agree on which rows are negative.
    adv = np.round(adv, 3)
    mask = np.array(mask).reshape(3, 5)
    keep = np.asarray(
        negative_advantage_veto(jnp.array(lr), jnp.array(adv), jnp.array(mask), delta)
    )
    np.testing.assert_array_equal(keep, veto_reference(lr, adv, mask, delta))
    # Prefix-closed keep set: once a position is vetoed, every later one is.
    assert np.all(keep[:, 1:] <= keep[:, :-1])
    seq_adv = np.where(mask, adv, 0).sum(1) / np.maximum(mask.sum(1), 1)
    assert np.all(keep[seq_adv >= 0])


def test_loss_and_metrics_match_reference():
    loss, metrics = OBJ(jnp.array(NEW), ENT, make())
    ref = loss_reference(LR, ADV * MASK, MASK, MASK.astype(float), 0.2, 0.28, DELTA)
    # By hand, per valid token (r = e^lr): row 0 keeps t=0 only: -(-1) e^0.1; row 1 (A=+1):
    # t=0: -1.28 (clipped), t=1: -e^-0.5 (below band, A>0 unclipped), t=2, 3: -1.28;
    # row 2: t=0: -e^0.1, t=1: 3 e^0 = 3, t=2, 3 vetoed; row 3: e^0.1 + e^-0.2.
    hand = (
        np.exp(0.1) - 1.28 * 3 - np.exp(-0.5) - np.exp(0.1) + 3.0 + np.exp(0.1) + np.exp(-0.2)
    ) / 14
    np.testing.assert_allclose(ref, hand, rtol=1e-6)
    np.testing.assert_allclose(loss, hand, rtol=1e-5)
    np.testing.assert_allclose(metrics["mu_grpo/loss"], loss)
    np.testing.assert_allclose(metrics["mu_grpo/veto_frac"], 5 / 14)  # 3 in row 0, 2 in row 2
    np.testing.assert_allclose(metrics["mu_grpo/veto_row_frac"], 2 / 4)
    np.testing.assert_allclose(metrics["mu_grpo/clip_frac"], 3 / 14)  # row 1, t = 0, 2, 3
    r = np.exp(LR[MASK])
    np.testing.assert_allclose(metrics["mu_grpo/ratio_mean"], r.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["mu_grpo/approx_kl"], np.mean(r - 1 - LR[MASK]), rtol=1e-5)


def test_vetoed_tokens_get_zero_gradient():
    grad = np.asarray(jax.grad(lambda lp: OBJ(lp, ENT, make())[0])(jnp.array(NEW)))
    vetoed = MASK & ~KEEP
    np.testing.assert_array_equal(grad[vetoed], 0.0)
    # A kept, in-band token of a negative row still gets the PPO gradient -A r / N.
    np.testing.assert_allclose(grad[0, 0], np.exp(0.1) / 14, rtol=1e-5)
    np.testing.assert_allclose(grad[2, 1], 3.0 / 14, rtol=1e-5)
    # Without the veto (delta huge) the same tokens do get gradient.
    grad_nv = jax.grad(lambda lp: mu_grpo(veto_delta=1e3)(lp, ENT, make())[0])(jnp.array(NEW))
    assert np.all(np.asarray(grad_nv)[[0, 2], [2, 3]] != 0)


@pytest.mark.parametrize("case", ["positive_advantages", "ratios_in_band"])
def test_no_op_cases_equal_ppo_clip(case):
    if case == "positive_advantages":
        adv = np.abs(ADV) + 0.5  # every row A > 0: drifted tokens stay
        new = NEW
    else:
        adv = ADV
        new = OLD + np.clip(LR, -0.2, 0.24)  # every ratio inside [0.8, 1.28]
    batch = make(adv=adv)
    (l_mu, m_mu), g_mu = jax.value_and_grad(OBJ, has_aux=True)(jnp.array(new), ENT, batch)
    (l_pp, _), g_pp = jax.value_and_grad(PPO, has_aux=True)(jnp.array(new), ENT, batch)
    np.testing.assert_allclose(l_mu, l_pp, rtol=1e-6)
    np.testing.assert_allclose(g_mu, g_pp, rtol=1e-6)
    assert m_mu["mu_grpo/veto_frac"] == 0 and m_mu["mu_grpo/veto_row_frac"] == 0


def test_veto_keeps_the_denominator_and_micro_batches_accumulate_exactly():
    weights = MASK.astype(np.float32)
    weights[1, 3] = 0.0  # a transform dropped one token
    batch = make(loss_weights=weights)
    loss, _ = OBJ(jnp.array(NEW), ENT, batch)
    ref = loss_reference(LR, ADV * MASK, MASK, weights, 0.2, 0.28, DELTA)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    # The 5 vetoed tokens still count in the denominator, sum of loss_weights = 13 (not 8):
    # the kept losses of the hand case of the test above, less row 1's dropped -1.28.
    kept = np.exp(0.1) - 1.28 * 2 - np.exp(-0.5) - np.exp(0.1) + 3.0 + np.exp(0.1) + np.exp(-0.2)
    np.testing.assert_allclose(loss, kept / 13, rtol=1e-5)
    total, den = 0.0, 0.0
    for rows in (np.array([0, 1]), np.array([2, 3])):
        sub = jax.tree_util.tree_map(lambda x, rows=rows: x[rows], batch)
        sub_loss, _ = mu_grpo()(jnp.array(NEW[rows]), ENT[:2], sub)
        d = aggregation_denominator(sub.loss_weights, "token-mean")
        total, den = total + sub_loss * d, den + d
    np.testing.assert_allclose(total / den, loss, rtol=1e-5)


def test_fully_masked_row_and_garbage_padding_stay_finite():
    mask = MASK.copy()
    mask[3] = False
    new = NEW.copy()
    new[~mask] = 1e4
    (loss, metrics), grad = jax.value_and_grad(OBJ, has_aux=True)(
        jnp.array(new), ENT, make(mask=mask)
    )
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    assert all(np.isfinite(v) for v in metrics.values())
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)
    np.testing.assert_allclose(metrics["mu_grpo/veto_row_frac"], 2 / 3)


def test_errors():
    with pytest.raises(ValueError, match="eps_low=1.0"):
        mu_grpo(eps_low=1.0)
    with pytest.raises(ValueError, match="eps_high=-0.1"):
        mu_grpo(eps_high=-0.1)
    with pytest.raises(ValueError, match="veto_delta=-0.5"):
        mu_grpo(veto_delta=-0.5)
    with pytest.raises(ValueError, match="valid modes"):
        mu_grpo(aggregation="sum")
    with pytest.raises(ValueError, match="delta=-0.1"):
        negative_advantage_veto(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2), bool), -0.1)
