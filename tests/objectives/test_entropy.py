"""Tests for rljax.objectives.entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.entropy import entropy_bonus

ENT = np.array([[1.0, 2.0, 9.0], [0.5, 9.0, 9.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 0, 0]], bool)


def tiny_batch():
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=MASK,
        group_id=np.zeros(2),
        rewards=np.zeros(2),
    )


def test_token_mean_bonus():
    loss, metrics = jax.jit(entropy_bonus(0.01))(jnp.zeros((2, 3)), jnp.array(ENT), tiny_batch())
    np.testing.assert_allclose(loss, -0.01 * 3.5 / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["entropy/mean"], 3.5 / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["entropy/loss"], loss)


def test_seq_mean_token_mean_bonus_and_gradient_sign():
    obj = entropy_bonus(0.1, aggregation="seq-mean-token-mean")
    loss, _ = obj(jnp.zeros((2, 3)), jnp.array(ENT), tiny_batch())
    np.testing.assert_allclose(loss, -0.1 * (1.5 + 0.5) / 2, rtol=1e-6)
    grad = jax.grad(lambda e: obj(jnp.zeros((2, 3)), e, tiny_batch())[0])(jnp.array(ENT))
    assert np.all(np.asarray(grad)[MASK] < 0) and np.all(np.asarray(grad)[~MASK] == 0)


def test_errors():
    with pytest.raises(ValueError, match="valid modes"):
        entropy_bonus(0.1, aggregation="tokens")
