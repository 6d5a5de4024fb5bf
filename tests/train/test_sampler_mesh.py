"""The sampler on its own devices: the weights resharded every step, the same run."""

import jax
import numpy as np
import optax

from configs.grpo_addition import get_config
from rljax.algorithms import grpo
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import mesh_shardings, shard_params
from rljax.train.loop import train
from rljax.train.sampler_mesh import SamplerDevices
from rljax.train.steps import RolloutConfig
from rljax.train.timing import measures_the_machine


def test_reshard_moves_params_step_and_key_onto_the_sampler_devices():
    devices = jax.devices()
    assert len(devices) == 8  # tests/conftest.py
    cfg = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    graphdef, params = create_model(cfg, seed=0)
    trainer = make_mesh(1, -1, devices=devices[2:])  # FSDP over 6 devices
    params = shard_params(params, trainer)
    algorithm, optimizer = grpo(group_size=2), optax.adam(1e-3)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(3))
    state = jax.device_put(state, mesh_shardings(state, trainer))
    side = SamplerDevices(
        graphdef,
        optimizer,
        algorithm,
        RolloutConfig(max_new_tokens=3, n_samples=2, eos_id=1, pad_id=0),
        make_mesh(-1, devices=devices[:2]),
        params,
    )
    moved, seconds = side.reshard(state)
    assert seconds > 0 and moved.opt_state is None
    for a, b in zip(jax.tree.leaves(moved.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
        assert set(a.sharding.device_set) == set(devices[:2])
        assert set(b.sharding.device_set) == set(devices[2:])
    assert int(moved.step) == int(state.step)
    np.testing.assert_array_equal(moved.rng, state.rng)


def run(tmp_path, sampler_devices):
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.steps = 0
    config.task.eval_size = 8
    config.rollout.n_samples = 4
    config.train.update(steps=2, prompts_per_step=8, eval_every=2, checkpoint_every=2)
    config.train.update(learning_rate=1e-2, warmup_steps=1)
    config.algorithm.entropy_coef = 0.1  # the untrained model scores 0: entropy moves it
    config.mesh.sampler_devices = sampler_devices
    config.run_dir = str(tmp_path / f"s{sampler_devices}")
    return {r["step"]: r for r in train(config)}


def test_a_run_with_its_own_sampler_devices_trains_the_same(tmp_path):
    shared, split = run(tmp_path, 0), run(tmp_path, 4)
    assert split[2]["time/reshard_s"] > 0 and "time/reshard_s" not in shared[2]
    for step in (1, 2):
        for key, value in shared[step].items():
            if not measures_the_machine(key):
                np.testing.assert_allclose(split[step][key], value, rtol=1e-5, atol=1e-6)
