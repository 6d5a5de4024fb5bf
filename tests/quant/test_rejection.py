"""Tests for IcePop and the divergence rejection in rljax.quant.mismatch, against loop-based
numpy references (verl's own functions: tests/objectives/test_verl_parity.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.objectives.surrogate import ppo_clip
from rljax.quant.mismatch import divergence_rejection, icepop

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


def make(log_rho=LOG_RHO, mask=MASK):
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
        advantages=np.ones((b, t), np.float32) * mask,
    )


def apply(transform):
    """(batch, metrics) after `transform`."""
    batch, _, metrics = transform.apply(make(), transform.init(), CTX)
    return batch, metrics


def estimates(estimator):
    """Per valid token: k2 = l^2 / 2, k3 = e^l - 1 - l; 0 elsewhere."""
    out = np.zeros(MASK.shape)
    for i, j in zip(*np.nonzero(MASK), strict=True):
        lr = float(LOG_RHO[i, j])
        out[i, j] = lr * lr / 2 if estimator == "k2" else np.exp(lr) - 1 - lr
    return out


def test_icepop_keeps_rho_inside_the_band_and_zeroes_outside():
    batch, metrics = apply(icepop(0.5, 2.0))
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
    batch = apply(icepop(0.5, 2.0))[0]
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
    batch, metrics = apply(divergence_rejection(threshold, estimator, level))
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


def test_errors():
    with pytest.raises(ValueError, match="low=2.0, high=1.0"):
        icepop(2.0, 1.0)
    with pytest.raises(ValueError, match="threshold=0"):
        divergence_rejection(0.0)
    with pytest.raises(ValueError, match="estimator='k1'"):
        divergence_rejection(estimator="k1")
    with pytest.raises(ValueError, match="level='row'"):
        divergence_rejection(level="row")
