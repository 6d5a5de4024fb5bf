"""Tests for rljax.objectives.gmpo against a hand-computed case of the GMPO paper's formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.gmpo import gmpo

# Per-token log-ratios on the valid tokens and one advantage per row; with eps 0.4 both ways:
#   row 0, A = +1: [0.6, 0.0] -> 0.6 is clipped to 0.4 (A > 0 caps the rise); mean 0.2
#   row 1, A = -2: [-0.7, 0.6, 0.1] -> -0.7 clipped to -0.4 (A < 0 floors the fall), 0.6 kept
#   row 2, A = +1: [-0.9] -> kept (A > 0 does not floor a fall); mean -0.9
LOG_RATIO = np.array([[0.6, 0.0, 0.0], [-0.7, 0.6, 0.1], [-0.9, 0.0, 0.0]], np.float32)
SEQ_ADV = np.array([1.0, -2.0, 1.0], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
OLD = np.array([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0], [-0.7, -1.5, -2.5]], np.float32)
NEW = OLD + LOG_RATIO
ENT = jnp.zeros((3, 3))
KEPT = np.array([[0.4, 0.0], [-0.4, 0.6, 0.1], [-0.9]], dtype=object)
UNCLIPPED = np.array([[0, 1, 0], [0, 1, 1], [1, 0, 0]], bool)


def make(mask=MASK, loss_weights=None):
    return make_batch(
        prompt_tokens=np.zeros((3, 1)),
        prompt_mask=np.ones((3, 1)),
        completion_tokens=np.zeros((3, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0, 0]),
        rewards=np.zeros(3),
        old_logprobs=OLD,
        advantages=SEQ_ADV[:, None] * mask,
        loss_weights=loss_weights,
    )


def test_hand_loss_gradient_and_metrics():
    (loss, metrics), grad = jax.value_and_grad(gmpo(), has_aux=True)(jnp.array(NEW), ENT, make())
    seq_ratio = np.exp([np.mean(k) for k in KEPT])  # e^0.2, e^(0.3/3), e^-0.9
    np.testing.assert_allclose(loss, np.mean(-SEQ_ADV * seq_ratio), rtol=1e-5)
    # d l_i / d log pi_t = -A_i exp(mean c) / |y_i| on unclipped tokens, / 3 sequences.
    counts = MASK.sum(axis=1)
    expected = -(SEQ_ADV * seq_ratio / counts)[:, None] * UNCLIPPED / 3
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["gmpo/clip_frac"], 2 / 6)
    np.testing.assert_allclose(metrics["gmpo/seq_ratio_mean"], seq_ratio.mean(), rtol=1e-5)


def test_geometric_mean_resists_one_outlier_token():
    # One token with ratio e^3 among nine at 1: the arithmetic mean of ratios is ~3, the
    # geometric ~e^0.3 (unclipped): the outlier moves GMPO's sequence ratio far less.
    old = np.full((1, 10), -1.0, np.float32)
    new = old.copy()
    new[0, 0] += 3.0
    batch = make_batch(
        prompt_tokens=np.zeros((1, 1)),
        prompt_mask=np.ones((1, 1)),
        completion_tokens=np.zeros((1, 10)),
        completion_mask=np.ones((1, 10), bool),
        group_id=np.array([0]),
        rewards=np.zeros(1),
        old_logprobs=old,
        advantages=-np.ones((1, 10), np.float32),
    )
    _, metrics = gmpo(eps_low=10.0, eps_high=10.0)(jnp.array(new), jnp.zeros((1, 10)), batch)
    np.testing.assert_allclose(metrics["gmpo/seq_ratio_mean"], np.exp(0.3), rtol=1e-5)


def test_masked_garbage_and_empty_rows_drop_out():
    mask = MASK.copy()
    mask[2] = False
    new = NEW.copy()
    new[0, 2], new[2, 0] = np.nan, 1e4
    (loss, _), grad = jax.value_and_grad(gmpo(), has_aux=True)(jnp.array(new), ENT, make(mask))
    seq_ratio = np.exp([np.mean(KEPT[0]), np.mean(KEPT[1])])
    np.testing.assert_allclose(loss, np.mean(-SEQ_ADV[:2] * seq_ratio), rtol=1e-5)
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0)


def test_errors():
    with pytest.raises(ValueError, match="eps_low=-0.1"):
        gmpo(eps_low=-0.1)
    with pytest.raises(ValueError, match="valid modes"):
        gmpo(aggregation="sum")
