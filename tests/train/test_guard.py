"""The numerical guard: non-finite updates are skipped, counted, named, and stop the run."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.grpo_addition import get_config
from rljax.algorithms import grpo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train import loop
from rljax.train.collector import Collection, GroupCollector
from rljax.train.guard import SkipGuard, first_nonfinite, named_tensors, tensor_names
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
    assert names == tensor_names(batch, params, None)
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
    return before, state, metrics, tensor_names(batch, state.params, state.critic)


def assert_unchanged(before, state):
    after = jax.tree.map(np.asarray, (state.params, state.opt_state))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)


def test_nan_reward_skips_the_update_and_is_named(steps_and_batch):
    steps, state, batch = steps_and_batch
    rewards = batch.rewards.at[3].set(jnp.nan)
    before, after, metrics, names = update(steps, state, batch.replace(rewards=rewards))
    assert float(metrics["guard/skipped"]) == 1.0  # both minibatches
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


@pytest.mark.parametrize("masked_rows", [1, 8])  # an empty completion; an all-masked batch
def test_empty_completions_and_all_masked_batches_update_finitely(steps_and_batch, masked_rows):
    steps, state, batch = steps_and_batch
    mask = batch.completion_mask.at[:masked_rows].set(False)
    _, after, metrics, _ = update(steps, state, batch.replace(completion_mask=mask))
    assert float(metrics["guard/skipped"]) == 0.0
    assert int(metrics["guard/first_nonfinite"]) == -1
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(after.params))
    assert np.isfinite(float(metrics["loss"]))


def test_a_run_of_non_finite_updates_stops_with_the_step_and_tensor(tmp_path, monkeypatch):
    """Through the driver: every batch gets a NaN reward; the second skip in a row stops it."""
    collect = GroupCollector.collect

    def poisoned(self, state, step):
        fresh, replay, metrics = collect(self, state, step)
        rewards = fresh[0].rows["rewards"].copy()
        rewards[0] = np.nan
        return Collection([fresh[0].with_rows(rewards=rewards)], replay, metrics)

    monkeypatch.setattr(GroupCollector, "collect", poisoned)
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.steps = 0
    config.task.eval_size = 8
    config.rollout.n_samples = 2
    config.train.update(steps=4, prompts_per_step=8, max_consecutive_skips=2, log_samples=-1)
    config.run_dir = str(tmp_path / "run")
    with pytest.raises(
        FloatingPointError, match=r"^step 2: .*first non-finite tensor: batch.rewards"
    ):
        loop.train(config)
    lines = open(tmp_path / "run" / "samples.jsonl").read().splitlines()
    assert len(lines) == 2 * 8  # steps 1 and 2, every group logged
