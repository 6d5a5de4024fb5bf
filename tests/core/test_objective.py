"""Tests for rljax.core.objective.sum_objectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.objective import sum_objectives


def tiny_batch():
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 2)),
        completion_mask=np.ones((2, 2)),
        group_id=np.zeros(2),
        rewards=np.zeros(2),
    )


def logp_sum(new_logprobs, new_entropy, batch):
    loss = jnp.sum(new_logprobs * batch.loss_weights)
    return loss, {"a/loss": loss}


def entropy_sq(new_logprobs, new_entropy, batch):
    loss = 2.0 * jnp.sum(new_entropy**2)
    return loss, {"b/loss": loss}


def test_sum_adds_losses_merges_metrics_and_grads():
    obj = sum_objectives(logp_sum, entropy_sq)
    logp = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    ent = jnp.array([[0.5, 0.0], [1.0, 0.0]])
    (loss, metrics), grads = jax.jit(jax.value_and_grad(obj, argnums=(0, 1), has_aux=True))(
        logp, ent, tiny_batch()
    )
    np.testing.assert_allclose(loss, 10.0 + 2.0 * 1.25)
    assert set(metrics) == {"a/loss", "b/loss"}
    np.testing.assert_allclose(grads[0], np.ones((2, 2)))
    np.testing.assert_allclose(grads[1], 4.0 * np.asarray(ent))


def test_single_and_nested():
    logp, ent = jnp.ones((2, 2)), jnp.ones((2, 2))
    np.testing.assert_allclose(sum_objectives(logp_sum)(logp, ent, tiny_batch())[0], 4.0)
    nested = sum_objectives(sum_objectives(logp_sum), entropy_sq)
    np.testing.assert_allclose(nested(logp, ent, tiny_batch())[0], 12.0)


def test_errors():
    with pytest.raises(ValueError, match="at least one"):
        sum_objectives()
    with pytest.raises(ValueError, match="a/loss"):
        sum_objectives(logp_sum, logp_sum)(jnp.ones((2, 2)), jnp.ones((2, 2)), tiny_batch())
