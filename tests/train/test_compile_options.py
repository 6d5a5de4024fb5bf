"""The update's XLA:CPU compile options: chosen for the CPU only, left to the user's XLA_FLAGS,
and the update they compile equals XLA's default one to float rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train import steps as steps_module
from rljax.train.compile_options import CPU_DOT_FUSIONS, update_compiler_options
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)


def test_the_dot_fusions_are_for_the_cpu_and_yield_to_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert update_compiler_options("cpu") == CPU_DOT_FUSIONS
    assert update_compiler_options("gpu") is None and update_compiler_options("tpu") is None
    flag = "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
    monkeypatch.setenv("XLA_FLAGS", flag)
    assert update_compiler_options("cpu") is None


def parameter_change(monkeypatch, options):
    """Parameters after - before one SGD update of a fixed batch, compiled with `options`."""
    monkeypatch.setattr(steps_module, "update_compiler_options", lambda platform: options)
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm, optimizer = grpo(group_size=4), optax.sgd(1.0)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(
        graphdef,
        optimizer,
        algorithm,
        RolloutConfig(6, 4, eos_id=1, pad_id=0),
        UpdateConfig(microbatches=2),
    )
    rng = np.random.default_rng(0)
    batch = make_batch(
        rng.integers(2, 40, (8, 5)),
        np.ones((8, 5), bool),
        rng.integers(2, 40, (8, 6)),
        np.arange(6)[None] < rng.integers(1, 7, (8, 1)),
        np.repeat(np.arange(2), 4),
        rng.random(8),
    )
    state, batch, _ = steps.prepare(state, batch)
    new_state, metrics = steps.update(state, batch)
    return jax.tree.map(jnp.subtract, new_state.params, params), metrics


def test_the_update_with_dot_fusions_equals_the_default_one(monkeypatch):
    fused, fused_metrics = parameter_change(monkeypatch, dict(CPU_DOT_FUSIONS))
    plain, plain_metrics = parameter_change(monkeypatch, None)
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(fused_metrics[key], plain_metrics[key], rtol=1e-5)
    scale = max(float(np.abs(p).max()) for p in jax.tree.leaves(plain))
    assert scale > 0
    for f, p in zip(jax.tree.leaves(fused), jax.tree.leaves(plain)):
        np.testing.assert_allclose(f, p, rtol=1e-5, atol=1e-6 * scale)
