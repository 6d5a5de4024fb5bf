"""Tests for rljax.quant.mismatch against numpy references, and a categorical policy whose
sampler is an MXFP4-quantised copy of the trainer: TIS and AIS remove the gradient bias."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.objectives.surrogate import ppo_clip
from rljax.quant.mismatch import (
    adaptive_is,
    ais_lambda,
    divergence_rejection,
    icepop,
    masked_is,
    mismatch_metrics,
    sequence_log_ratio,
    truncated_is,
)
from rljax.quant.mx import quantize_mx

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
# log rho = old - rollout on valid tokens; padding carries garbage that must never matter.
LOG_RHO = np.array(
    [
        [0.1, -0.9, 1.2, 50.0],
        [0.5, 0.3, np.nan, -50.0],
        [-0.05, 0.02, 0.8, -0.3],
        [9.0, -9.0, 9.0, -9.0],
    ],
    np.float32,
)
ADV = np.array([[1.0, 1.0, 1.0, 0], [-0.5, -0.5, 0, 0], [2.0, 2.0, 2.0, 2.0], [0, 0, 0, 0]])


def make(log_rho=LOG_RHO, mask=MASK, adv=ADV):
    b, t = mask.shape
    rollout = np.full((b, t), -1.5, np.float32)
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b),
        rewards=np.zeros(b),
        rollout_logprobs=rollout,
        old_logprobs=rollout + log_rho,
        advantages=np.asarray(adv, np.float32) * mask,
    )


def valid_log_rho(log_rho=LOG_RHO, mask=MASK):
    return np.where(mask, np.nan_to_num(log_rho.astype(np.float64)), 0.0)


def apply(transform, batch):
    return transform.apply(batch, transform.init(), CTX)


def test_mismatch_metrics_match_numpy():
    m = mismatch_metrics(make(), threshold=0.5)
    g = LOG_RHO.astype(np.float64)[MASK]
    rho = np.exp(g)
    k3 = rho - 1 - g
    per_seq = [
        sum(np.exp(x) - 1 - x for x in LOG_RHO[i][MASK[i]].astype(np.float64))
        for i in range(3)  # row 3 has no valid token
    ]
    np.testing.assert_allclose(m["mismatch/abs_gap_mean"], np.abs(g).mean(), rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/abs_gap_max"], 1.2, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch/gap_frac"], np.mean(np.abs(g) > 0.5), rtol=1e-6)
    np.testing.assert_allclose(m["mismatch/token_kl"], k3.mean(), rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/seq_kl"], np.mean(per_seq), rtol=1e-5)
    np.testing.assert_allclose(
        m["mismatch/ess"], rho.sum() ** 2 / (rho.size * (rho**2).sum()), rtol=1e-5
    )


def test_mismatch_metrics_vanish_without_mismatch_and_are_jittable():
    m = jax.jit(mismatch_metrics)(make(log_rho=np.zeros_like(LOG_RHO)))
    for key in ("abs_gap_mean", "abs_gap_max", "gap_frac", "token_kl", "seq_kl"):
        assert abs(float(m[f"mismatch/{key}"])) < 1e-7, key
    np.testing.assert_allclose(m["mismatch/ess"], 1.0, rtol=1e-6)


@pytest.mark.parametrize("cap", [0.9, 2.0])
def test_tis_token_weights_are_min_rho_cap(cap):
    batch, _, m = apply(truncated_is(cap), make())
    w = np.asarray(batch.extras["is_weight"])
    rho = np.exp(valid_log_rho())
    expected = np.where(MASK, np.minimum(rho, cap), 1.0)
    np.testing.assert_allclose(w, expected, rtol=1e-6)
    assert np.all(w[MASK] <= cap)
    below = MASK & (rho < cap)
    np.testing.assert_allclose(w[below], rho[below], rtol=1e-6)
    np.testing.assert_allclose(m["tis/weight_mean"], expected[MASK].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["tis/capped_frac"], np.mean(rho[MASK] > cap), rtol=1e-6)
    # Loss weights untouched: TIS must not be self-normalised by the aggregation.
    np.testing.assert_array_equal(batch.loss_weights, make().loss_weights)


@pytest.mark.parametrize("sequence_ratio", ["product", "geometric"])
def test_tis_sequence_weights_broadcast_the_row_ratio(sequence_ratio):
    batch, _, _ = apply(truncated_is(2.0, "sequence", sequence_ratio), make())
    lr = valid_log_rho()
    seq = lr.sum(1)
    if sequence_ratio == "geometric":
        seq = seq / np.maximum(MASK.sum(1), 1)
    np.testing.assert_allclose(sequence_log_ratio(make(), sequence_ratio), seq, rtol=1e-5)
    expected = np.where(MASK, np.minimum(np.exp(seq), 2.0)[:, None], 1.0)
    np.testing.assert_allclose(batch.extras["is_weight"], expected, rtol=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("sequence_ratio", ["product", "geometric"])
def test_mis_zeros_exactly_the_out_of_band_tokens_or_rows(level, sequence_ratio):
    # Bands chosen so that each case keeps some valid tokens and masks others.
    if level == "token":
        low, high = 0.6, 1.5
    else:
        low, high = (0.9, 1.55) if sequence_ratio == "product" else (0.9, 1.3)
    batch, _, m = apply(masked_is(low, high, level, sequence_ratio), make())
    lr = valid_log_rho()
    if level == "token":
        ratio = np.exp(lr)
    else:
        seq = lr.sum(1)
        if sequence_ratio == "geometric":
            seq = seq / np.maximum(MASK.sum(1), 1)
        ratio = np.broadcast_to(np.exp(seq)[:, None], MASK.shape)
    out = MASK & ((ratio < low) | (ratio > high))
    assert out.any() and (MASK & ~out).any()  # the case exercises both sides
    expected = np.where(out, 0.0, MASK.astype(np.float32))
    np.testing.assert_array_equal(batch.loss_weights, expected)
    np.testing.assert_allclose(m["mis/masked_frac"], out[MASK].mean(), rtol=1e-6)
    rows = MASK.any(1)
    np.testing.assert_allclose(m["mis/masked_seq_frac"], out.any(1)[rows].mean(), rtol=1e-6)
    assert "is_weight" not in batch.extras


def ais_reference(log_rho, adv, mask, d0):
    g = log_rho.astype(np.float64)[mask]
    a = adv.astype(np.float64)[mask]
    rho = np.exp(g)
    ess = rho.sum() ** 2 / (rho.size * (rho**2).sum())
    d = np.mean(rho - 1 - g)
    v = np.var(rho * a) / np.var(a)
    lam = np.clip((1 - np.exp(-d / d0)) * ess / max(1.0, v), 0, 1)
    return lam, ess, d, v


@pytest.mark.parametrize("d0", [0.01, 0.3, 3.0])
def test_ais_diagnostics_and_weights_match_numpy(d0):
    batch, _, m = apply(adaptive_is(cap=2.0, d0=d0), make())
    lam, ess, d, v = ais_reference(LOG_RHO, ADV, MASK, d0)
    assert 0 < lam < 1
    np.testing.assert_allclose(m["ais/lambda"], lam, rtol=1e-5)
    np.testing.assert_allclose(m["ais/ess"], ess, rtol=1e-5)
    np.testing.assert_allclose(m["ais/divergence"], d, rtol=1e-5)
    np.testing.assert_allclose(m["ais/variance_ratio"], v, rtol=1e-5)
    rho = np.exp(valid_log_rho())
    expected = np.where(MASK, (1 - lam) + lam * np.minimum(rho, 2.0), 1.0)
    np.testing.assert_allclose(batch.extras["is_weight"], expected, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(-3, 3, width=32), min_size=6, max_size=6),
    st.lists(st.floats(-2, 2, width=32), min_size=6, max_size=6),
    st.floats(1e-3, 10.0),
)
def test_ais_lambda_property(log_rho, adv, d0):
    log_rho = np.array(log_rho, np.float32).reshape(2, 3)
    adv = np.array(adv, np.float32).reshape(2, 3)
    mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    lam, m = ais_lambda(jnp.array(log_rho), jnp.array(adv), jnp.array(mask), d0)
    assert 0.0 <= float(lam) <= 1.0
    assert 0.0 < float(m["ais/ess"]) <= 1.0 + 1e-6
    if np.var(adv[mask].astype(np.float64)) > 1e-3:
        ref = ais_reference(log_rho, adv, mask, d0)[0]
        np.testing.assert_allclose(lam, ref, rtol=2e-3, atol=1e-5)


def test_ais_fixed_lambda_endpoints_are_uncorrected_and_tis():
    batch0, _, m0 = apply(adaptive_is(fixed_lambda=0.0), make())
    np.testing.assert_array_equal(batch0.extras["is_weight"], np.ones(MASK.shape))
    assert float(m0["ais/lambda"]) == 0.0 and float(m0["ais/divergence"]) > 0
    batch1, _, _ = apply(adaptive_is(cap=2.0, fixed_lambda=1.0), make())
    tis, _, _ = apply(truncated_is(2.0), make())
    np.testing.assert_array_equal(batch1.extras["is_weight"], tis.extras["is_weight"])


def test_ais_lambda_is_zero_without_mismatch():
    _, m = ais_lambda(jnp.zeros((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3), bool), 0.01)
    assert float(m["ais/lambda"]) == 0.0 and float(m["ais/ess"]) == 1.0


ALL_CORRECTIONS = [
    truncated_is(2.0),
    truncated_is(2.0, "sequence"),
    truncated_is(1.5, "sequence", "geometric"),
    masked_is(0.5, 2.0),
    masked_is(0.5, 2.0, "sequence"),
    adaptive_is(),
    adaptive_is(fixed_lambda=1.0),
]


@pytest.mark.parametrize("transform", ALL_CORRECTIONS)
def test_no_mismatch_makes_every_correction_a_no_op(transform):
    rng = np.random.default_rng(0)
    plain = make(log_rho=np.zeros_like(LOG_RHO))
    corrected, _, _ = apply(transform, plain)
    new = jnp.asarray(plain.old_logprobs + rng.normal(0, 0.3, MASK.shape).astype(np.float32))
    objective = ppo_clip()

    def loss(lp, batch):
        return objective(lp, jnp.zeros(MASK.shape), batch)[0]

    assert float(jnp.max(jnp.abs(corrected.extras.get("is_weight", 1.0) - 1.0))) <= 1e-6
    np.testing.assert_allclose(loss(new, corrected), loss(new, plain), rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(loss)(new, corrected), jax.grad(loss)(new, plain), rtol=1e-6, atol=1e-8
    )


def test_is_weights_compose_and_transforms_jit():
    twice, _, _ = jax.jit(lambda b: apply(truncated_is(2.0), apply(truncated_is(2.0), b)[0]))(
        make()
    )
    once, _, _ = apply(truncated_is(2.0), make())
    np.testing.assert_allclose(
        twice.extras["is_weight"], np.square(once.extras["is_weight"]), rtol=1e-6
    )


def test_errors():
    with pytest.raises(ValueError, match="cap=0"):
        truncated_is(0.0)
    with pytest.raises(ValueError, match="level="):
        truncated_is(level="batch")
    with pytest.raises(ValueError, match="sequence_ratio="):
        masked_is(sequence_ratio="mean")
    with pytest.raises(ValueError, match="low < high"):
        masked_is(2.0, 0.5)
    with pytest.raises(ValueError, match="d0="):
        adaptive_is(d0=0.0)
    with pytest.raises(ValueError, match="fixed_lambda="):
        adaptive_is(fixed_lambda=1.5)
    with pytest.raises(ValueError, match="threshold="):
        mismatch_metrics(make(), threshold=-1.0)


# A 6-action softmax policy. The sampler's logits are the trainer's quantised to MXFP4
# (one block of 8): [2.3, -0.7, 1.1, 0.4, -1.9, 1.6] -> [2, -0.75, 1, 0.5, -2, 1.5].
THETA = np.array([2.3, -0.7, 1.1, 0.4, -1.9, 1.6], np.float32)
REWARD = np.array([0.0, 1.0, 0.2, 1.0, 1.0, 0.0], np.float32)
N_SAMPLES = 100_000


def categorical_gradients():
    theta = jnp.asarray(THETA)
    logits_mu = quantize_mx(theta, "mxfp4", block_size=8)
    log_pi, log_mu = jax.nn.log_softmax(theta), jax.nn.log_softmax(logits_mu)
    pi, mu = jnp.exp(log_pi), jnp.exp(log_mu)
    adv_table = jnp.asarray(REWARD) - pi @ REWARD  # exact on-policy advantage
    # d log pi(a) / d theta = e_a - pi, so sum_a p(a) A(a) grad log pi(a) for p = pi or mu:
    jac = jnp.eye(6) - pi[None, :]
    exact = (pi * adv_table) @ jac
    biased = (mu * adv_table) @ jac  # what uncorrected sampling from mu estimates
    actions = jax.random.categorical(jax.random.PRNGKey(0), logits_mu, shape=(N_SAMPLES,))
    batch = make_batch(
        prompt_tokens=np.zeros((N_SAMPLES, 1)),
        prompt_mask=np.ones((N_SAMPLES, 1)),
        completion_tokens=actions[:, None],
        completion_mask=np.ones((N_SAMPLES, 1)),
        group_id=np.arange(N_SAMPLES),
        rewards=jnp.asarray(REWARD)[actions],
        rollout_logprobs=log_mu[actions][:, None],
        old_logprobs=log_pi[actions][:, None],
        advantages=adv_table[actions][:, None],
    )
    objective = ppo_clip()

    @jax.jit
    def policy_gradient(batch):  # ascent direction -grad(loss) at ratio 1
        def loss(th):
            new = jax.nn.log_softmax(th)[actions][:, None]
            return objective(new, jnp.zeros_like(new), batch)[0]

        return -jax.grad(loss)(theta)

    grads = {"none": policy_gradient(batch)}
    metrics = {}
    for name, transform in [("tis", truncated_is(2.0)), ("ais", adaptive_is(2.0))]:
        corrected, _, metrics[name] = apply(transform, batch)
        grads[name] = policy_gradient(corrected)
    return exact, biased, grads, metrics, mismatch_metrics(batch)


def test_tis_and_ais_remove_the_quantised_sampler_bias():
    exact, biased, grads, metrics, mismatch = categorical_gradients()
    err = {k: float(jnp.linalg.norm(g - exact)) for k, g in grads.items()}
    # The bias is real (about 20% of |exact|), and uncorrected sampling matches its analytic
    # expectation: it is bias, not sampling noise.
    assert float(jnp.linalg.norm(biased - exact)) > 0.15 * float(jnp.linalg.norm(exact))
    np.testing.assert_allclose(err["none"], float(jnp.linalg.norm(biased - exact)), rtol=0.2)
    assert float(jnp.linalg.norm(grads["none"] - biased)) < 0.2 * err["none"]
    # TIS (nothing is capped here: max rho < 2) is unbiased up to sampling noise.
    assert float(metrics["tis"]["tis/capped_frac"]) == 0.0
    assert err["tis"] < 0.1 * err["none"]
    # AIS mixes with lambda in (0, 1): the bias shrinks by about the factor 1 - lambda.
    lam = float(metrics["ais"]["ais/lambda"])
    assert 0.3 < lam < 0.9
    assert err["ais"] < 0.6 * err["none"]
    np.testing.assert_allclose(err["ais"], (1 - lam) * err["none"], rtol=0.25, atol=1e-3)
    assert float(mismatch["mismatch/token_kl"]) > 0.005


# IcePop and the divergence rejection (verl's own functions: tests/objectives/test_verl_parity.py).


def estimates(estimator):
    """Per valid token: k2 = l^2 / 2, k3 = e^l - 1 - l; 0 elsewhere."""
    out = np.zeros(MASK.shape)
    for i, j in zip(*np.nonzero(MASK), strict=True):
        lr = float(LOG_RHO[i, j])
        out[i, j] = lr * lr / 2 if estimator == "k2" else np.exp(lr) - 1 - lr
    return out


def test_icepop_keeps_rho_inside_the_band_and_zeroes_outside():
    batch, _, metrics = apply(icepop(0.5, 2.0), make())
    rho = np.exp(LOG_RHO.astype(np.float64))
    # Valid rho: [1.105, 0.407, 3.32], [1.65, 1.35], [0.95, 1.02, 2.23, 0.74]: 0.407, 3.32
    # and 2.23 are outside [0.5, 2].
    expected = np.where(MASK, np.where((rho >= 0.5) & (rho <= 2.0), rho, 0.0), 1.0)
    np.testing.assert_allclose(batch.extras["is_weight"], expected, rtol=1e-6)
    np.testing.assert_allclose(metrics["icepop/masked_frac"], 3 / 9, rtol=1e-6)
    np.testing.assert_allclose(metrics["icepop/weight_mean"], expected[MASK].mean(), rtol=1e-6)
    # The loss weights are untouched: masked tokens stay in the token-mean's count.
    np.testing.assert_array_equal(batch.loss_weights, MASK.astype(np.float32))


def test_icepop_zeroes_the_gradient_of_masked_tokens_only():
    batch = apply(icepop(0.5, 2.0), make(adv=np.ones((4, 4))))[0]
    new = jnp.asarray(batch.old_logprobs)
    grad = jax.grad(lambda lp: ppo_clip()(lp, jnp.zeros(MASK.shape), batch)[0])(new)
    weight = np.asarray(batch.extras["is_weight"])
    # On-policy PPO with A = 1: d loss / d logp = -w / 9 on valid tokens.
    np.testing.assert_allclose(np.asarray(grad)[MASK], -weight[MASK] / 9, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
@pytest.mark.parametrize(
    "level,threshold",
    [("token", 0.1), ("sequence_sum", 0.3), ("sequence_mean", 0.12), ("sequence_max", 0.5)],
)
def test_divergence_rejection_matches_reference(estimator, level, threshold):
    batch, _, metrics = apply(divergence_rejection(threshold, estimator, level), make())
    est = estimates(estimator)
    out = np.zeros(MASK.shape, bool)
    for i in range(MASK.shape[0]):
        valid = est[i][MASK[i]]
        if not len(valid):
            continue
        if level == "token":
            out[i] = MASK[i] & (est[i] > threshold)
            continue
        row = {
            "sequence_sum": valid.sum(),
            "sequence_mean": valid.mean(),
            "sequence_max": valid.max(),
        }
        out[i] = MASK[i] & (row[level] > threshold)
    assert 0 < out.sum() < MASK.sum()  # the threshold cuts between the tokens or rows
    np.testing.assert_array_equal(batch.loss_weights, np.where(out, 0.0, MASK))
    np.testing.assert_allclose(metrics["rejection/masked_frac"], out[MASK].mean(), rtol=1e-6)
    seq = [out[i].any() for i in range(3)]
    np.testing.assert_allclose(metrics["rejection/masked_seq_frac"], np.mean(seq), rtol=1e-6)
    np.testing.assert_allclose(metrics["rejection/estimate_mean"], est[MASK].mean(), rtol=1e-5)


def test_icepop_and_divergence_rejection_errors():
    with pytest.raises(ValueError, match="low=2.0, high=1.0"):
        icepop(2.0, 1.0)
    with pytest.raises(ValueError, match="threshold=0"):
        divergence_rejection(0.0)
    with pytest.raises(ValueError, match="estimator='k1'"):
        divergence_rejection(estimator="k1")
    with pytest.raises(ValueError, match="level='row'"):
        divergence_rejection(level="row")
