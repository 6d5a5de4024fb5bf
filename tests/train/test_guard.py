"""The numerical guard: non-finite updates are skipped, counted, named, and stop the run."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from configs.grpo_addition import get_config
from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train import checkpoint, loop
from rljax.train.checkpoint import Checkpointer
from rljax.train.collector import Collection, GroupCollector
from rljax.train.guard import (
    SkipGuard,
    first_nonfinite,
    input_names,
    named_tensors,
    tensor_names,
)
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
ROLLOUT = RolloutConfig(max_new_tokens=5, n_samples=4, eos_id=1, pad_id=0)


def tiny_batch(rewards, completion_mask=None):
    tokens = jnp.ones((len(rewards), 3), jnp.int32)
    mask = jnp.ones((len(rewards), 3), bool) if completion_mask is None else completion_mask
    return make_batch(tokens, tokens > 0, tokens, mask, jnp.arange(len(rewards)) // 2, rewards)


def test_first_nonfinite_names_inputs_before_what_is_derived_from_them():
    batch = tiny_batch(jnp.asarray([1.0, jnp.nan, 0.0, 1.0]))
    batch = batch.replace(advantages=jnp.full((4, 3), jnp.nan))  # spoiled by the NaN reward
    params = {"w": jnp.ones(3)}
    grads = ({"w": jnp.full(3, jnp.inf)}, None)
    policy = {"logprobs": jnp.zeros((4, 3)), "entropy": jnp.zeros((4, 3))}
    tensors = named_tensors(batch, (params, None), policy, jnp.float32(1.0), grads)
    names = [name for name, _ in tensors]
    assert names == input_names(batch, params, None)
    assert names[int(first_nonfinite(tensors))] == "batch.rewards"

    clean = tiny_batch(jnp.asarray([1.0, 0.0, 0.0, 1.0]))
    tensors = named_tensors(clean, (params, None), policy, jnp.float32(1.0), grads)
    assert tensors[int(first_nonfinite(tensors))][0] == "grads/params['w']"
    no_nan = named_tensors(
        clean, (params, None), policy, jnp.float32(1.0), ({"w": params["w"]}, None)
    )
    assert int(first_nonfinite(no_nan)) == -1


def test_skip_guard_counts_resets_and_stops_naming_step_and_tensor():
    guard = SkipGuard(max_consecutive=2)
    names = lambda: ["batch.rewards", "loss"]  # noqa: E731
    skipped = {"guard/skipped": 1.0, "guard/first_nonfinite": 1}
    assert guard.check(1, skipped, names) == 1.0
    assert guard.check(2, {"guard/skipped": 0.0, "guard/first_nonfinite": -1}, names) == 0.0
    guard.check(3, skipped, names)
    assert (guard.consecutive, guard.total) == (1, 2)
    with pytest.raises(
        FloatingPointError, match=r"step 4: .*2 in a row.*first non-finite tensor: loss"
    ):
        guard.check(4, {**skipped, "guard/first_nonfinite": 1}, names)
    with pytest.raises(ValueError, match="max_consecutive_skips=0"):
        SkipGuard(0)


def test_skip_guard_names_a_rejected_update_and_the_first_cause_of_a_row():
    """A non-finite step is worded as the update's fault; the stop also names the row's first
    cause when the last skip only shows its consequences (NaN parameters -> NaN rollouts)."""
    guard = SkipGuard(max_consecutive=2)
    names = lambda: ["batch.rollout_logprobs", "update.params['w']"]  # noqa: E731
    guard.check(1, {"guard/skipped": 1.0, "guard/first_nonfinite": 1}, names)
    with pytest.raises(FloatingPointError) as stop:
        guard.check(2, {"guard/skipped": 1.0, "guard/first_nonfinite": 0}, names)
    assert str(stop.value).startswith(
        "step 2: update skipped for non-finite values (2 in a row, 2 in all); first non-finite "
        "tensor: batch.rollout_logprobs; at step 1, the first of the row: the update made "
        "update.params['w'] non-finite (learning rate too high?); stopping after "
        "train.max_consecutive_skips=2"
    )


@pytest.fixture(scope="module")
def steps_and_batch():
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm, optimizer = grpo(group_size=ROLLOUT.n_samples), optax.adam(1e-2)
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT, UpdateConfig(minibatches=2))
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)
    rollout = steps.rollout(state, prompts, prompts > 0)
    batch = make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        (rollout.completion_tokens[:, 0] % 2).astype(jnp.float32),
        rollout_logprobs=rollout.sampling_logprobs,
    )
    return steps, state, batch


def update(steps, state, batch):
    """(params before, state after, metrics, guard names); the update donates `state`."""
    before = jax.tree.map(np.asarray, (state.params, state.opt_state))
    state = jax.tree.map(jnp.copy, state)
    state, batch, _ = steps.prepare(state, batch)
    state, metrics = steps.update(state, batch)
    return before, state, metrics, tensor_names(batch, state)


def assert_unchanged(before, state):
    after = jax.tree.map(np.asarray, (state.params, state.opt_state))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)


def test_nan_reward_skips_the_update_and_is_named(steps_and_batch):
    steps, state, batch = steps_and_batch
    rewards = batch.rewards.at[3].set(jnp.nan)
    before, after, metrics, names = update(steps, state, batch.replace(rewards=rewards))
    assert float(metrics["guard/skipped"]) == 1.0  # both minibatches
    assert float(metrics["guard/update_nonfinite"]) == 0.0  # the inputs' fault, not the step's
    assert names[int(metrics["guard/first_nonfinite"])] == "batch.rewards"
    assert_unchanged(before, after)
    assert int(after.step) == int(state.step) + 1


def test_nan_logits_skip_the_update_and_name_the_parameter(steps_and_batch):
    steps, state, batch = steps_and_batch
    params = jax.tree.map(jnp.copy, state.params)
    params["embed"].value = params["embed"].value.at[5].set(jnp.nan)  # NaN logits downstream
    before, after, metrics, names = update(steps, state.replace(params=params), batch)
    assert float(metrics["guard/skipped"]) == 1.0
    assert names[int(metrics["guard/first_nonfinite"])] == "params['embed'].value"
    assert_unchanged(before, after)


@pytest.mark.parametrize(
    ("optimizer", "culprit"),
    [
        # A learning rate that overflows: every new parameter is infinite (or NaN).
        (optax.adam(jnp.inf), "update.params['embed'].value"),
        # Huge but finite gradients: Adam's second moment overflows, the parameters do not.
        (
            optax.chain(optax.scale(1e25), optax.adam(1e-2)),
            "update.opt_state[1][0].nu['embed'].value",
        ),
    ],
    ids=["params", "opt_state"],
)
def test_a_non_finite_step_of_finite_gradients_is_rolled_back_and_named(
    steps_and_batch, optimizer, culprit
):
    _, _, batch = steps_and_batch
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm = grpo(group_size=ROLLOUT.n_samples)
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT, UpdateConfig(minibatches=2))
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    before, after, metrics, names = update(steps, state, batch)
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert float(metrics["guard/skipped"]) == 1.0  # both minibatches
    assert float(metrics["guard/update_nonfinite"]) == 1.0
    assert names[int(metrics["guard/first_nonfinite"])] == culprit
    assert_unchanged(before, after)  # params and optimizer state, bit for bit
    with pytest.raises(FloatingPointError) as stop:
        SkipGuard(1).check(1, metrics, lambda: names)
    assert f"; the update made {culprit} non-finite (learning rate too high?); " in str(stop.value)


@pytest.mark.parametrize("masked_rows", [1, 8])  # an empty completion; an all-masked batch
def test_empty_completions_and_all_masked_batches_update_finitely(steps_and_batch, masked_rows):
    steps, state, batch = steps_and_batch
    mask = batch.completion_mask.at[:masked_rows].set(False)
    _, after, metrics, _ = update(steps, state, batch.replace(completion_mask=mask))
    assert float(metrics["guard/skipped"]) == 0.0
    assert float(metrics["guard/update_nonfinite"]) == 0.0
    assert int(metrics["guard/first_nonfinite"]) == -1
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(after.params))
    assert np.isfinite(float(metrics["loss"]))


def tiny_run(tmp_path):
    """A 4-step run of a tiny model in tmp_path/run that stops at 2 skipped steps in a row."""
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.steps = 0
    config.task.eval_size = 8
    config.rollout.n_samples = 2
    config.train.update(steps=4, prompts_per_step=8, max_consecutive_skips=2)
    config.run_dir = str(tmp_path / "run")
    return config


def test_a_run_of_non_finite_updates_stops_with_the_step_and_tensor(tmp_path, monkeypatch):
    """Through the driver: every batch gets a NaN reward; the second skip in a row stops it."""
    collect = GroupCollector.collect

    def poisoned(self, state, step):
        fresh, replay, metrics = collect(self, state, step)
        rewards = fresh[0].rows["rewards"].copy()
        rewards[0] = np.nan
        return Collection([fresh[0].with_rows(rewards=rewards)], replay, metrics)

    monkeypatch.setattr(GroupCollector, "collect", poisoned)
    config = tiny_run(tmp_path)
    config.train.log_samples = -1
    with pytest.raises(
        FloatingPointError, match=r"^step 2: .*first non-finite tensor: batch.rewards"
    ):
        loop.train(config)
    lines = open(tmp_path / "run" / "samples.jsonl").read().splitlines()
    assert len(lines) == 2 * 8  # steps 1 and 2, every group logged


def test_overflowing_updates_are_rolled_back_never_saved_and_stop_the_run(tmp_path, monkeypatch):
    """Through the driver: learning rate x weight decay overflows float32, so every step is
    rolled back (finite loss and gradients); the checkpoint of the skipped step 1 holds the
    finite state it kept, and a failing checkpointer close does not mask the stop."""
    config = tiny_run(tmp_path)
    config.train.update(learning_rate=1e30, weight_decay=1e30, warmup_steps=0, checkpoint_every=1)
    close = Checkpointer.close

    def failing_close(self):
        close(self)
        raise RuntimeError("orbax commit thread failed")

    monkeypatch.setattr(Checkpointer, "close", failing_close)
    warnings = []
    monkeypatch.setattr(
        checkpoint.logging, "warning", lambda message, *args: warnings.append(message % args)
    )
    with pytest.raises(
        FloatingPointError,
        match=r"^step 2: .*; the update made update\.params\['\w+'\]\S* non-finite "
        r"\(learning rate too high\?\); stopping after",
    ):
        loop.train(config)
    assert warnings[-1] == (  # after the step 1 skip's warning
        f"closing the checkpointer of {tmp_path}/run/checkpoints failed: orbax commit thread failed"
    )
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        step1 = [r for r in map(json.loads, f) if r["step"] == 1][0]
    assert step1["guard/skipped"] == 1.0 and step1["guard/update_nonfinite"] == 1.0
    saved = ocp.StandardCheckpointer().restore(tmp_path / "run" / "checkpoints" / "1" / "state")
    floats = [np.asarray(x) for x in jax.tree.leaves(saved) if np.issubdtype(x.dtype, np.floating)]
    assert len(floats) > 10 and all(np.isfinite(x).all() for x in floats)


def test_a_warm_start_that_leaves_non_finite_parameters_stops_the_run(tmp_path):
    """SFT has no guard of its own: its NaN parameters would make every RL step skip and a
    checkpoint save them; the driver stops before RL, naming the first one."""
    config = tiny_run(tmp_path)
    config.sft.update(steps=3, batch_size=8, learning_rate=1e30)
    with pytest.raises(
        FloatingPointError,
        match=r"^the SFT warm start made params\['\w+'\]\S* non-finite; lower sft\.learning_rate",
    ):
        loop.train(config)
    assert not os.path.exists(tmp_path / "run" / "checkpoints" / "1")
