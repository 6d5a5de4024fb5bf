"""Tests for rljax.objectives.kl: estimators against numpy and exact expectations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.objectives.kl import KL_ESTIMATORS, kl_loss, kl_penalty, kl_reward_penalty

LOGP = np.array([[-1.0, -2.0, -0.1], [-3.0, -0.5, -4.0]], np.float32)
REF = np.array([[-1.5, -1.0, -0.7], [-2.0, -2.5, -1.0]], np.float32)


def reference(logp, ref, estimator):
    out = np.zeros(logp.shape)
    for i in range(logp.shape[0]):
        for j in range(logp.shape[1]):
            x = float(logp[i, j]) - float(ref[i, j])  # log pi / ref
            if estimator == "k1":
                out[i, j] = x
            elif estimator == "k2":
                out[i, j] = 0.5 * x * x
            else:
                log_ratio = min(max(float(ref[i, j]) - float(logp[i, j]), -20.0), 20.0)
                ratio = np.exp(log_ratio)  # ref / pi
                out[i, j] = ratio - 1.0 - log_ratio
                if estimator == "low_var_kl":
                    out[i, j] = min(max(out[i, j], -10.0), 10.0)
    return out


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_estimators_match_numpy(estimator):
    out = jax.jit(kl_penalty, static_argnums=2)(jnp.array(LOGP), jnp.array(REF), estimator)
    np.testing.assert_allclose(out, reference(LOGP, REF, estimator), rtol=1e-5, atol=1e-6)


def test_hand_values():
    x = jnp.array([[0.5, -1.0]])
    np.testing.assert_allclose(kl_penalty(x, jnp.zeros_like(x), "k1"), [[0.5, -1.0]])
    np.testing.assert_allclose(kl_penalty(x, jnp.zeros_like(x), "k2"), [[0.125, 0.5]])
    np.testing.assert_allclose(
        kl_penalty(x, jnp.zeros_like(x), "k3"), [[np.exp(-0.5) - 0.5, np.e - 2.0]], rtol=1e-6
    )


def test_low_var_kl_hand_values_and_clamp():
    # x = log pi - log ref. k3(x) = exp(-x) - 1 + x:
    #   x = 0.5  -> exp(-0.5) - 0.5 = 0.1065 (no clamp, equals k3)
    #   x = -2   -> e^2 - 3 = 4.389 (no clamp)
    #   x = -3   -> e^3 - 4 = 16.09 -> clamped to 10
    #   x = 12   -> exp(-12) + 11 = 11.000006 -> clamped to 10
    #   x = -25  -> log ratio clamped to -20 first: k3 = e^20 - 21 (finite), then 10
    x = jnp.array([[0.5, -2.0, -3.0, 12.0, -25.0]])
    zeros = jnp.zeros_like(x)
    out = jax.jit(kl_penalty, static_argnums=2)(x, zeros, "low_var_kl")
    np.testing.assert_allclose(
        out, [[np.exp(-0.5) - 0.5, np.e**2 - 3.0, 10.0, 10.0, 10.0]], rtol=1e-6
    )
    k3 = np.asarray(kl_penalty(x, zeros, "k3"))
    np.testing.assert_allclose(k3[0, 2], np.e**3 - 4.0, rtol=1e-6)
    np.testing.assert_allclose(k3[0, 4], np.exp(20.0) - 21.0, rtol=1e-5)  # x clamped to -20
    # Clamped tokens get zero gradient; unclamped ones d k3 / dx = 1 - exp(-x).
    grad = jax.grad(lambda lp: kl_penalty(lp, zeros, "low_var_kl").sum())(x)
    np.testing.assert_allclose(
        grad, [[1 - np.exp(-0.5), 1 - np.e**2, 0.0, 0.0, 0.0]], rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("estimator", ["k2", "k3", "low_var_kl"])
def test_nonnegative_and_zero_at_equality(estimator):
    x = jnp.linspace(-15.0, 15.0, 61).reshape(1, -1)
    assert np.all(np.asarray(kl_penalty(x, jnp.zeros_like(x), estimator)) >= 0)
    assert np.all(np.asarray(kl_penalty(x, x, estimator)) == 0)


def test_unbiased_on_categorical_by_enumeration():
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    ref = np.array([0.4, 0.3, 0.2, 0.1])
    true_kl = sum(p * np.log(p / q) for p, q in zip(pi, ref))
    logp = jnp.array(np.log(pi)[None], jnp.float32)
    logr = jnp.array(np.log(ref)[None], jnp.float32)
    expect = {
        e: float(np.sum(pi * np.asarray(kl_penalty(logp, logr, e))[0])) for e in KL_ESTIMATORS
    }
    np.testing.assert_allclose(expect["k1"], true_kl, rtol=1e-5)
    np.testing.assert_allclose(expect["k3"], true_kl, rtol=1e-5)
    np.testing.assert_allclose(expect["low_var_kl"], true_kl, rtol=1e-5)  # clamp inactive
    assert abs(expect["k2"] - true_kl) > 0.01  # k2 is biased


def tiny_batch(mask, old=LOGP, ref=REF, rewards=(1.0, 2.0)):
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=mask,
        group_id=np.zeros(2),
        rewards=np.array(rewards),
        old_logprobs=old,
        ref_logprobs=ref,
    )


MASK = np.array([[1, 1, 0], [1, 1, 1]], bool)


def test_kl_loss():
    obj = kl_loss(0.1, "k3")
    loss, metrics = jax.jit(obj)(jnp.array(LOGP), jnp.zeros((2, 3)), tiny_batch(MASK))
    kl = reference(LOGP, REF, "k3")
    expected_mean = kl[MASK].mean()
    np.testing.assert_allclose(loss, 0.1 * expected_mean, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl/mean"], expected_mean, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl/loss"], loss)
    grad = jax.grad(lambda lp: obj(lp, jnp.zeros((2, 3)), tiny_batch(MASK))[0])(jnp.array(LOGP))
    x = LOGP - REF  # d k3 / dx = 1 - exp(-x)
    np.testing.assert_allclose(
        grad, np.where(MASK, 0.1 * (1 - np.exp(-x)) / MASK.sum(), 0), rtol=1e-5
    )


def test_kl_loss_aggregation_mode():
    loss, _ = kl_loss(1.0, "k1", aggregation="seq-mean-token-sum")(
        jnp.array(LOGP), jnp.zeros((2, 3)), tiny_batch(MASK)
    )
    x = LOGP - REF
    np.testing.assert_allclose(loss, ((x[0, 0] + x[0, 1]) + x[1].sum()) / 2, rtol=1e-5)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_reward_penalty(estimator):
    t = kl_reward_penalty(0.5, estimator)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    batch, state, metrics = jax.jit(t.apply)(tiny_batch(MASK), t.init(), ctx)
    kl = reference(LOGP, REF, estimator)
    seq_kl = np.array([sum(kl[i, j] for j in range(3) if MASK[i, j]) for i in range(2)])
    np.testing.assert_allclose(batch.rewards, np.array([1.0, 2.0]) - 0.5 * seq_kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl_reward/kl"], seq_kl.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["kl_reward/penalty"], 0.5 * seq_kl.mean(), rtol=1e-5)
    assert state == ()


def test_errors():
    with pytest.raises(ValueError, match=r"valid estimators: \['k1', 'k2', 'k3', 'low_var_kl'\]"):
        kl_penalty(jnp.zeros((1, 1)), jnp.zeros((1, 1)), "k4")
    with pytest.raises(ValueError, match="differ in shape"):
        kl_penalty(jnp.zeros((1, 2)), jnp.zeros((1, 1)), "k1")
    with pytest.raises(ValueError, match="valid estimators"):
        kl_loss(0.1, "k4")
    with pytest.raises(ValueError, match="coef=-1"):
        kl_loss(-1)
    with pytest.raises(ValueError, match="valid modes"):
        kl_loss(0.1, aggregation="mean")
    with pytest.raises(ValueError, match="valid estimators"):
        kl_reward_penalty(0.1, "k5")
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    batch = tiny_batch(MASK).replace(rewards=jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"needs \[B\] rewards"):
        kl_reward_penalty(0.1).apply(batch, (), ctx)
