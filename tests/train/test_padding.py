"""Padding that follows the data: the trimmed batch keeps the used columns, rounded up, and the
update on it equals the update on the full padded batch to float rounding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.grpo_addition import get_config
from rljax.algorithms import grpo
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train.host_batch import HostBatch
from rljax.train.loop import train
from rljax.train.padding import bucket, trim_padding, used_widths
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32)
GROUP = 4


def test_bucket_rounds_up_to_the_multiple_within_one_and_the_full_width():
    assert [bucket(w, 4, 16) for w in (0, 1, 4, 5, 13, 16)] == [1, 4, 4, 8, 16, 16]
    assert bucket(3, 8, 5) == 5  # never past the full width
    assert bucket(3, 0, 16) == 16  # 0: off


def host_batch(prompt_lens, completion_lens, p=8, t=9, seed=0, **extras) -> HostBatch:
    """Rows with left-padded prompts and right-padded completions of the given real lengths."""
    rng = np.random.default_rng(seed)
    b = len(prompt_lens)
    prompt_mask = np.arange(p)[None] >= p - np.asarray(prompt_lens)[:, None]
    completion_mask = np.arange(t)[None] < np.asarray(completion_lens)[:, None]
    rows = dict(
        prompt_tokens=np.where(prompt_mask, rng.integers(2, 30, (b, p)), 0).astype(np.int32),
        prompt_mask=prompt_mask,
        completion_tokens=np.where(completion_mask, rng.integers(2, 30, (b, t)), 0).astype(
            np.int32
        ),
        completion_mask=completion_mask,
        rollout_logprobs=np.where(completion_mask, -rng.random((b, t)), 0).astype(np.float32),
        rewards=rng.integers(0, 2, b).astype(np.float32),
        prompt_id=np.repeat(np.arange(b // GROUP), GROUP),
        **extras,
    )
    return HostBatch(rows, GROUP)


def test_trim_keeps_the_used_columns_of_every_field():
    b, p, t = 4, 6, 7
    token_rewards = np.arange(b * t, dtype=np.float32).reshape(b, t)
    routes = np.arange(b * (p + t) * 2).reshape(b, p + t, 2, 1)
    batch = host_batch([3, 1, 2, 3], [5, 2, 0, 4], p, t, token_rewards=token_rewards, routes=routes)
    np.testing.assert_array_equal(used_widths(batch), [3, 5])
    out = trim_padding(batch, 2)  # widths 3 -> 4 and 5 -> 6
    rows = out.rows
    np.testing.assert_array_equal(rows["prompt_tokens"], batch.rows["prompt_tokens"][:, 2:])
    np.testing.assert_array_equal(rows["prompt_mask"], batch.rows["prompt_mask"][:, 2:])
    for key in ("completion_tokens", "completion_mask", "rollout_logprobs", "token_rewards"):
        np.testing.assert_array_equal(rows[key], batch.rows[key][:, :6])
    np.testing.assert_array_equal(rows["routes"], routes[:, 2 : p + 6])
    np.testing.assert_array_equal(rows["rewards"], batch.rows["rewards"])
    # Every dropped column was padding in every row.
    assert (
        batch.rows["prompt_mask"][:, :2].sum() == 0
        and batch.rows["completion_mask"][:, 6:].sum() == 0
    )
    assert trim_padding(batch, 0) is batch
    # Given widths (the widest process's) win over the batch's own.
    assert trim_padding(batch, 2, np.asarray([6, 7])).rows["prompt_tokens"].shape == (b, p)
    with pytest.raises(ValueError, match="not in"):
        batch.trimmed(0, 3)


def learn(model_config, host: HostBatch, update: UpdateConfig):
    """(metrics, parameter change) of prepare + update on `host` from the same initial state.

    Plain SGD, so the change is the (summed) gradient, which float rounding moves by a relative
    1e-7 or so; Adam would divide a near-zero gradient entry by its own magnitude."""
    graphdef, params = create_model(model_config, seed=0)
    algorithm = grpo(group_size=GROUP)
    optimizer = optax.sgd(1.0)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    rollout = RolloutConfig(
        max_new_tokens=host.rows["completion_tokens"].shape[1], n_samples=GROUP, eos_id=1, pad_id=0
    )
    steps = make_steps(graphdef, optimizer, algorithm, rollout, update)
    state, batch, prepared = steps.prepare(state, host.to_batch())
    state, metrics = steps.update(state, batch)
    return {**prepared, **metrics}, jax.tree.map(jnp.subtract, state.params, params)


def assert_same_change(got, want):
    """Equal to float32 rounding of sums of terms of the gradient's own scale."""
    scale = max(float(np.abs(w).max()) for w in jax.tree.leaves(want))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize(
    "update",
    [UpdateConfig(microbatches=2), UpdateConfig(minibatches=2, old_logprobs="recompute")],
    ids=["auto-on-policy", "recompute-two-minibatches"],
)
def test_the_update_on_the_trimmed_batch_equals_the_padded_one(update):
    host = host_batch([2, 5, 3, 1, 4, 2, 3, 3], [1, 3, 2, 4, 3, 1, 2, 4])
    trimmed = trim_padding(host, 2)
    assert (
        trimmed.rows["prompt_tokens"].shape[1] == 6
        and trimmed.rows["completion_tokens"].shape[1] == 4
    )
    full_metrics, full_params = learn(CONFIG, host, update)
    metrics, params = learn(CONFIG, trimmed, update)
    for key in ("loss", "entropy", "grad_norm"):
        np.testing.assert_allclose(metrics[key], full_metrics[key], rtol=1e-5, atol=1e-7)
    assert_same_change(params, full_params)


def test_moe_routes_are_trimmed_with_the_positions():
    moe = dataclasses.replace(CONFIG, num_experts=4, experts_per_token=2)
    graphdef, params = create_model(moe, seed=0)
    algorithm, optimizer = grpo(group_size=GROUP), optax.sgd(1.0)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(graphdef, optimizer, algorithm, RolloutConfig(6, GROUP, eos_id=1, pad_id=0))
    prompts = jnp.asarray([[0, 0, 0, 0, 5, 6], [0, 0, 0, 7, 8, 9]], jnp.int32)
    out = steps.rollout(state, prompts, prompts > 0)
    host = HostBatch.from_rollout(out, np.arange(2), np.asarray([1.0, 0, 1, 0] * 2), GROUP)
    trimmed = trim_padding(host, 1)
    assert (
        trimmed.rows["routes"].shape[1]
        == trimmed.rows["prompt_tokens"].shape[1] + trimmed.rows["completion_tokens"].shape[1]
    )
    assert trimmed.rows["prompt_tokens"].shape[1] == 3
    full_metrics, full_params = learn(moe, host, UpdateConfig())
    metrics, params = learn(moe, trimmed, UpdateConfig())
    np.testing.assert_allclose(metrics["loss"], full_metrics["loss"], rtol=1e-5, atol=1e-7)
    assert_same_change(params, full_params)


def test_a_run_trims_by_default_and_logs_the_same_metrics(tmp_path):
    """The driver's trimming (default train.pad_multiple) against none, on prompts padded to
    16 and completions to 12: the same first step, fewer positions, a positive MFU."""
    records = {}
    for multiple in (16, 0):
        config = get_config()
        config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
        config.sft.steps = 0
        config.task.update(eval_size=8, max_prompt_len=24)
        config.rollout.update(n_samples=2, max_new_tokens=20)
        config.train.update(steps=1, prompts_per_step=8, pad_multiple=multiple)
        config.run_dir = str(tmp_path / f"run{multiple}")
        records[multiple] = train(config)[-1]
    trimmed, full = records[16], records[0]
    assert full["perf/row_positions"] == 44 and trimmed["perf/row_positions"] < 44
    for key in ("loss", "entropy", "reward/mean", "grad_norm"):
        assert trimmed[key] == pytest.approx(full[key], rel=1e-5, abs=1e-7), key
    assert 0 < trimmed["perf/mfu"] < 10 and 0 < full["perf/mfu"] < 10
