"""The jitted train steps on a (2, 2, 2) mesh give the single-device results."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import mesh_shardings, shard_params
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")

CONFIG = TransformerConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32)
ROLLOUT = RolloutConfig(max_new_tokens=4, n_samples=4, eos_id=1, pad_id=0)


def one_iteration(mesh, minibatches=2):
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm, optimizer = grpo(group_size=4), optax.adam(1e-2)
    if mesh is not None:
        params = shard_params(params, mesh)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    shardings = None
    if mesh is not None:
        shardings = mesh_shardings(state, mesh)
        state = jax.device_put(state, shardings)
    steps = make_steps(
        graphdef,
        optimizer,
        algorithm,
        ROLLOUT,
        UpdateConfig(minibatches=minibatches),
        mesh,
        shardings,
    )
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9], [0, 0, 4], [3, 2, 11]], jnp.int32)
    rollout = steps.rollout(state, prompts, prompts > 0)
    rewards = (rollout.completion_tokens[:, 0] % 3 == 0).astype(jnp.float32)
    batch = make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        rewards,
        rollout_logprobs=rollout.sampling_logprobs,
    )
    state, batch, prepare_metrics = steps.prepare(state, batch)
    state, update_metrics = steps.update(state, batch)
    return rollout, state, {**prepare_metrics, **update_metrics}


# 2 minibatches: the old log-probs from prepare's pass; 1: on-policy "auto", from the update's.
@pytest.mark.parametrize("minibatches", [2, 1])
def test_sharded_iteration_matches_single_device(minibatches):
    rollout_1, state_1, metrics_1 = one_iteration(None, minibatches)
    rollout_8, state_8, metrics_8 = one_iteration(make_mesh(2, 2, 2), minibatches)
    np.testing.assert_array_equal(rollout_1.completion_tokens, rollout_8.completion_tokens)
    for key in metrics_1:
        np.testing.assert_allclose(metrics_8[key], metrics_1[key], atol=1e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(state_1.params), jax.tree.leaves(state_8.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # The state stayed on the mesh with the parameters split.
    (q,) = jax.tree.leaves(state_8.params["layers"]["attn"]["q_proj"])  # [layers, d, h, hd]
    assert len(q.sharding.device_set) == 8
    assert q.addressable_shards[0].data.shape == (q.shape[0], 8, 1, 8)
