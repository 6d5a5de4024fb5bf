"""Tests for rljax.diffusion.objectives against numpy loops and rljax's own PPO/KL objectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.objective import sum_objectives
from rljax.diffusion.objectives import (
    daca_advantages,
    daca_weights,
    diffu_grpo_loss,
    rldf_loss,
    rspo_loss,
    stable_steps,
    wd1_loss,
)
from rljax.objectives import kl_loss, ppo_clip

RNG = np.random.default_rng(0)
B, T = 4, 5
LOGP = RNG.normal(-1.5, 0.6, (B, T)).astype(np.float32)
OLD = (LOGP + RNG.normal(0.0, 0.3, (B, T))).astype(np.float32)
REF = (LOGP + RNG.normal(0.0, 0.5, (B, T))).astype(np.float32)
ADV = np.array([1.0, -0.5, 2.0, -1.5], np.float32)
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], bool)


def _np_grpo_tokens(logp, old, ref, adv, eps, beta):
    """Per-token d1 loss by scalar loops."""
    out = np.zeros(logp.shape)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            a = adv[i] if np.ndim(adv) == 1 else adv[i, t]
            r = np.exp(float(logp[i, t]) - float(old[i, t]))
            pg = -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
            x = float(ref[i, t]) - float(logp[i, t])
            out[i, t] = pg + beta * (np.exp(x) - 1 - x)
    return out


def test_diffu_grpo_matches_numpy_and_rljax_ppo_plus_kl():
    loss, metrics = diffu_grpo_loss(
        jnp.array(LOGP), jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), jnp.array(REF), 0.2, 0.04
    )
    per_token = _np_grpo_tokens(LOGP, OLD, REF, ADV, 0.2, 0.04)
    np.testing.assert_allclose(loss, per_token[MASK].mean(), rtol=1e-5)
    assert metrics["pg/loss"] == loss
    ratio = np.exp(LOGP - OLD)
    np.testing.assert_allclose(metrics["pg/ratio_mean"], ratio[MASK].mean(), rtol=1e-5)
    # The same loss from rljax's Objective framework: ppo_clip + kl_loss("k3").
    batch = make_batch(
        np.zeros((B, 1)), np.ones((B, 1)), np.zeros((B, T)), MASK, np.arange(B), np.zeros(B),
        old_logprobs=OLD, ref_logprobs=REF, advantages=np.broadcast_to(ADV[:, None], (B, T)),
    )  # fmt: skip
    ref_loss, _ = sum_objectives(ppo_clip(0.2, 0.2), kl_loss(0.04, "k3"))(
        jnp.array(LOGP), jnp.zeros((B, T)), batch
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)


def test_diffu_grpo_token_advantages_no_ref_and_seq_mean():
    adv = RNG.normal(size=(B, T)).astype(np.float32)
    loss, metrics = diffu_grpo_loss(
        jnp.array(LOGP), jnp.array(OLD), jnp.array(adv), jnp.array(MASK), None, 0.1, 1.0,
        "seq-mean-token-mean",
    )  # fmt: skip
    per_token = _np_grpo_tokens(LOGP, OLD, LOGP, adv, 0.1, 0.0)  # ref = logp: no KL
    want = np.mean([per_token[i][MASK[i]].mean() for i in range(B)])
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert "kl/mean" not in metrics
    with pytest.raises(ValueError, match="eps"):
        diffu_grpo_loss(jnp.array(LOGP), jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), eps=1.0)


def test_diffu_grpo_gradient_vanishes_on_clipped_tokens():
    grad = jax.grad(
        lambda lp: diffu_grpo_loss(lp, jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), beta=0.0)[0]
    )(jnp.array(LOGP))
    ratio = np.exp(LOGP - OLD)
    a = ADV[:, None]
    clipped = ((a > 0) & (ratio > 1.2)) | ((a < 0) & (ratio < 0.8))
    assert (MASK & clipped).any() and (MASK & ~clipped).any()  # both cases are exercised
    want = np.where(MASK & ~clipped, -a * ratio, 0.0) / MASK.sum()
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)


def test_rldf_loss_normalises_over_scored_tokens_of_all_states():
    k = 3
    shape = (2, k, T)
    logp = RNG.normal(-1.0, 0.5, shape).astype(np.float32)
    old = (logp + RNG.normal(0.0, 0.3, shape)).astype(np.float32)
    ref = (logp + RNG.normal(0.0, 0.3, shape)).astype(np.float32)
    scored = RNG.random(shape) < 0.5
    adv = np.array([0.7, -1.2], np.float32)
    loss, _ = rldf_loss(*map(jnp.array, (logp, old, ref, adv, scored)))
    total, count = 0.0, 0
    for b in range(2):
        per_token = _np_grpo_tokens(logp[b], old[b], ref[b], np.full(k, adv[b]), 0.2, 0.01)
        total += per_token[scored[b]].sum()
        count += scored[b].sum()
    np.testing.assert_allclose(loss, total / count, rtol=1e-5)


def test_wd1_loss_matches_numpy_and_its_gradient():
    seq = np.array([-3.0, -5.0, -2.0, -4.0, -1.0, -6.0], np.float32)
    adv = np.array([1.0, -1.0, 0.5, 0.2, -0.3, 0.1], np.float32)
    loss, _ = wd1_loss(jnp.array(seq), jnp.array(adv), 3)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    groups = []
    for g in range(2):
        s, a = seq[3 * g : 3 * g + 3], adv[3 * g : 3 * g + 3]
        groups.append(-(softmax(a) * s).sum() + (softmax(-a) * s).sum())
    np.testing.assert_allclose(loss, np.mean(groups), rtol=1e-5)
    grad = jax.grad(lambda s: wd1_loss(s, jnp.array(adv), 3)[0])(jnp.array(seq))
    want = np.concatenate(
        [(softmax(-adv[i : i + 3]) - softmax(adv[i : i + 3])) / 2 for i in (0, 3)]
    )
    np.testing.assert_allclose(grad, want, rtol=1e-5)
    with pytest.raises(ValueError, match="does not divide"):
        wd1_loss(jnp.array(seq), jnp.array(adv), 4)


def test_rspo_gradient_is_gap_times_log_ratio_gradient():
    x = jnp.array(RNG.normal(size=(3, 2)), jnp.float32)
    ref_elbo = jnp.array([-2.0, -1.0, -3.0])
    adv = jnp.array([0.5, -1.0, 0.2])
    beta = 0.5

    def loss_of(theta):
        return rspo_loss(x @ theta, ref_elbo, adv, beta)[0]

    theta = jnp.array([0.3, -0.7])
    delta = np.asarray(x @ theta - ref_elbo)
    value, grad = jax.value_and_grad(loss_of)(theta)
    np.testing.assert_allclose(value, 0.5 * np.mean((beta * delta - adv) ** 2), rtol=1e-5)
    # grad = -(1/B) sum_b beta (A_b - beta Delta_b) grad Delta_b, grad Delta_b = x_b.
    want = -(beta * (np.asarray(adv) - beta * delta)[:, None] * np.asarray(x)).mean(axis=0)
    np.testing.assert_allclose(grad, want, rtol=1e-5)
    # Zero gradient when beta Delta = A: the ELBO already matches the target.
    g = jax.grad(lambda e: rspo_loss(e, ref_elbo, adv, beta)[0])(ref_elbo + adv / beta)
    np.testing.assert_allclose(g, 0.0, atol=1e-6)
    # The reference ELBO gets no gradient.
    g_ref = jax.grad(lambda r: rspo_loss(x @ theta, r, adv, beta)[0])(ref_elbo)
    np.testing.assert_array_equal(g_ref, 0.0)


def test_stable_steps_hand_case():
    # 4 steps, 3 positions; final tokens [5, 6, 7].
    preds = np.array([[[1, 6, 7], [5, 6, 2], [5, 6, 7], [5, 6, 7]]])  # [1, S, T]
    np.testing.assert_array_equal(
        stable_steps(jnp.array(preds), jnp.array([[5, 6, 7]])), [[1, 0, 2]]
    )
    preds[0, 3, 0] = 9  # never settles on the final token
    np.testing.assert_array_equal(
        stable_steps(jnp.array(preds), jnp.array([[5, 6, 7]])), [[4, 0, 2]]
    )


def test_daca_weights_and_advantages():
    stable = jnp.array([[0, 2, 3, 1], [3, 1, 0, 0], [4, 4, 0, 0]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]], bool)
    w = np.asarray(daca_weights(stable, mask, 4))
    u0 = np.array([1.0, 0.5, 0.25, 0.75])
    np.testing.assert_allclose(w[0], u0 / u0.mean(), rtol=1e-6)
    u1 = np.array([0.25, 0.75])
    np.testing.assert_allclose(w[1], [*(u1 / u1.mean()), 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(w[2], [1.0, 1.0, 0.0, 0.0])  # no progress at all: uniform
    np.testing.assert_allclose(w.sum(axis=1) / np.asarray(mask).sum(axis=1), 1.0, rtol=1e-6)
    adv = np.asarray(daca_advantages(jnp.array([2.0, -1.0, 0.5]), jnp.array(w)))
    np.testing.assert_allclose(adv, w * np.array([2.0, -1.0, 0.5])[:, None], rtol=1e-6)
