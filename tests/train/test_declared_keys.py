"""What the run keeps and computes follows from the algorithm's declared reads."""

import glob
import importlib
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.uec_rl_addition import get_config as uec_config
from rljax.core import keys
from rljax.core.batch import make_batch
from rljax.core.transform import chain, stateless
from rljax.train.builders import (
    ALGORITHMS,
    build_algorithm,
    build_optimizer,
    build_policy,
    build_rollout_config,
    build_train_state,
    build_update_config,
)
from rljax.train.statistics import TOKEN_STATISTICS, register_token_statistic
from rljax.train.steps import make_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs", "*_addition.py"))
)


def tiny(config):
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.rollout.update(n_samples=4, max_new_tokens=5)
    config.train.update(learning_rate=1e-2, warmup_steps=1, minibatches=1)
    return config


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_algorithm_builds_and_passes_the_check(name):
    # build_algorithm runs rljax.core.keys.check_algorithm.
    config = tiny(importlib.import_module(f"configs.{name}").get_config())
    algorithm = build_algorithm(config, vocab_size=259)
    keys.check_algorithm(algorithm)


# Required settings of presets without a default, for building every preset with its defaults.
REQUIRED = {
    "vocab_size": 259,
    "total_steps": 10,
    "k": 2,
    "num_dimensions": 2,
    "target_entropy": 1.0,
    "max_len": 8,
    "cache_len": 2,
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_preset_with_its_defaults_passes_the_check(name):
    preset = ALGORITHMS[name]
    params = inspect.signature(preset).parameters
    empty = inspect.Parameter.empty
    kwargs = {k: v for k, v in REQUIRED.items() if k in params and params[k].default is empty}
    keys.check_algorithm(preset(group_size=4, **kwargs))


def test_uec_rl_default_kl_keeps_and_measures_against_the_reference():
    config = tiny(uec_config())
    del config.algorithm["kl_coef"]  # the preset's own default (0.01) applies
    tokenizer, model_config, graphdef, params = build_policy(config)
    algorithm = build_algorithm(config, model_config.vocab_size)
    assert algorithm.needs_reference
    optimizer = build_optimizer(config.train)
    state, _ = build_train_state(config, model_config, params, algorithm, optimizer)
    assert state.ref_params is not None
    steps = make_steps(
        graphdef,
        optimizer,
        algorithm,
        build_rollout_config(config, tokenizer),
        build_update_config(config),
    )
    prompts = jnp.asarray([[257, 49, 43, 50, 61], [257, 51, 43, 52, 61]], jnp.int32)
    initial = state

    def prepared(state):
        rollout = steps.rollout(state, prompts, jnp.ones_like(prompts, bool))
        rewards = jnp.asarray([1.0, 0.0, 0.0, 1.0] * 2, jnp.float32)
        batch = make_batch(
            rollout.prompt_tokens,
            rollout.prompt_mask,
            rollout.completion_tokens,
            rollout.completion_mask,
            rollout.group_id,
            rewards,
            rollout_logprobs=rollout.sampling_logprobs,
            extras={"sequence_advantage": rewards - rewards.mean()},
        )
        return steps.prepare(state, batch)

    for _ in range(2):  # the warm-up's first step has learning rate 0
        state, batch, _ = prepared(state)
        state, metrics = steps.update(state, batch)
        assert np.isfinite(float(metrics["kl/mean"]))
    state, batch, prepare_metrics = prepared(state)
    initial_logprobs = steps.logprobs(
        initial,
        batch.prompt_tokens,
        batch.prompt_mask,
        batch.completion_tokens,
        batch.completion_mask,
    )
    # The reference is the initial policy, not the policy before this update.
    np.testing.assert_allclose(batch.ref_logprobs, initial_logprobs, atol=1e-5)
    mask = np.asarray(batch.completion_mask)
    gap = np.abs(np.asarray(batch.ref_logprobs - batch.old_logprobs))[mask]
    assert gap.max() > 1e-4
    _, metrics = steps.update(state, batch)
    assert float(metrics["kl/mean"]) > 0
    # On-policy "auto" (train.old_logprobs) measures kl_to_ref in the update, else prepare does.
    assert float({**prepare_metrics, **metrics}["kl_to_ref"]) > 0


def test_a_registered_statistic_is_computed_only_when_read():
    name = "old_max_logprob_test"
    register_token_statistic(
        name,
        lambda s: jnp.where(s.batch.completion_mask, s.old_stats.logprobs, 0.0).max(axis=1),
        doc="max over tokens of log pi_old(y_t)",
        shape="[B] f32",
    )
    try:
        config = tiny(importlib.import_module("configs.grpo_addition").get_config())
        tokenizer, model_config, graphdef, params = build_policy(config)
        base = build_algorithm(config, model_config.vocab_size)
        reader = stateless(lambda b, c: (b, {}), reads={keys.extra(name)}, writes=())
        algorithms = {"base": base, "reads": base._replace(transform=chain(base.transform, reader))}
        assert algorithms["reads"].batch_stats == (name,)
        optimizer = build_optimizer(config.train)
        prompts = jnp.asarray([[257, 49, 43, 50, 61], [257, 51, 43, 52, 61]], jnp.int32)
        for label, algorithm in algorithms.items():
            state, _ = build_train_state(config, model_config, params, algorithm, optimizer)
            steps = make_steps(
                graphdef, optimizer, algorithm, build_rollout_config(config, tokenizer)
            )
            rollout = steps.rollout(state, prompts, jnp.ones_like(prompts, bool))
            batch = make_batch(
                rollout.prompt_tokens,
                rollout.prompt_mask,
                rollout.completion_tokens,
                rollout.completion_mask,
                rollout.group_id,
                jnp.asarray([1.0, 0.0, 0.0, 1.0] * 2, jnp.float32),
            )
            _, out, _ = steps.prepare(state, batch)
            assert (name in out.extras) == (label == "reads")
        mask = np.asarray(out.completion_mask)
        want = np.where(mask, np.asarray(out.old_logprobs), 0.0).max(axis=1)
        np.testing.assert_allclose(out.extras[name], want, atol=1e-6)
    finally:
        TOKEN_STATISTICS.pop(name)
        keys.KEYS.pop(keys.extra(name))


def test_state_without_reference_fails_loudly_when_the_algorithm_reads_it():
    config = tiny(uec_config())
    tokenizer, model_config, graphdef, params = build_policy(config)
    algorithm = build_algorithm(config, model_config.vocab_size)
    optimizer = build_optimizer(config.train)
    state, _ = build_train_state(config, model_config, params, algorithm, optimizer)
    steps = make_steps(graphdef, optimizer, algorithm, build_rollout_config(config, tokenizer))
    prompts = jnp.asarray([[257, 49, 43, 50, 61]], jnp.int32)
    rollout = steps.rollout(state, prompts, jnp.ones_like(prompts, bool))
    rewards = jnp.zeros(rollout.group_id.shape, jnp.float32)
    batch = make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        rewards,
        extras={"sequence_advantage": rewards},
    )
    with pytest.raises(ValueError, match="no reference policy"):
        steps.prepare(state.replace(ref_params=None), batch)
    jax.block_until_ready(steps.prepare(state, batch)[1].ref_logprobs)
