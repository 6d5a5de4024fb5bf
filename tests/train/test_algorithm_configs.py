"""Every configs/<algo>_addition.py: 3 rollout/prepare/update iterations on a tiny model."""

import glob
import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.builders import (
    build_algorithm,
    build_optimizer,
    build_policy,
    build_rollout_config,
    build_train_state,
    build_update_config,
)
from rljax.train.steps import make_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs", "*_addition.py"))
)


@pytest.mark.parametrize("name", CONFIGS)
def test_three_updates_are_finite_and_move_the_params(name):
    config = importlib.import_module(f"configs.{name}").get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.rollout.update(n_samples=4, max_new_tokens=5)
    config.train.update(learning_rate=1e-2, warmup_steps=1, minibatches=1)
    tokenizer, model_config, graphdef, params = build_policy(config)
    assert isinstance(tokenizer, ByteTokenizer)
    algorithm = build_algorithm(config, model_config.vocab_size)
    optimizer = build_optimizer(config.train)
    state, critic_graphdef = build_train_state(config, model_config, params, algorithm, optimizer)
    steps = make_steps(
        graphdef,
        optimizer,
        algorithm,
        build_rollout_config(config, tokenizer),
        build_update_config(config),
        critic_graphdef=critic_graphdef,
    )
    start = jax.tree.map(np.asarray, state.params)
    prompts = jnp.asarray([[257, 49, 43, 50, 61], [257, 51, 43, 52, 61]], jnp.int32)  # 1+2= 3+4=
    # What the driver (rljax.train.draws) puts in every batch, and the greedy baseline.
    extras = {"prompt_id": jnp.repeat(jnp.arange(2, dtype=jnp.int32), 4)}
    if algorithm.greedy_baseline:
        extras["baseline_reward"] = jnp.full((8,), 0.5)
    critic_start = jax.tree.map(np.asarray, state.critic)
    for i in range(3):
        rollout = steps.rollout(state, prompts, jnp.ones_like(prompts, bool))
        # Binary rewards with both values in every group (pass@k needs binary rewards).
        rewards = jnp.asarray(np.tile([1.0, 0.0, 0.0, 1.0 - (i % 2)], 2), jnp.float32)
        if algorithm.collection is not None:  # UEC-RL's driver chooses advantages on the host
            extras["sequence_advantage"] = rewards - rewards.mean()
        if algorithm.needs_reward_components:  # the addition task's 3: correct, digits, length
            extras["reward_components"] = jnp.stack(
                [rewards, jnp.tile(jnp.asarray([1.0, 0.5, 0.0, 0.5]), 2), jnp.ones(8)], axis=1
            )
        if algorithm.needs_teacher:  # a stand-in teacher: the sampler's log-probs, shifted
            shift = jnp.where(rollout.completion_tokens % 2 == 0, 0.5, -0.5)
            extras["teacher_logprobs"] = rollout.sampling_logprobs + shift
        if algorithm.needs_teacher_top_k:  # a stand-in teacher's top 3: fixed, uneven tokens
            shape = (*rollout.completion_tokens.shape, 3)
            extras["teacher_topk_ids"] = jnp.broadcast_to(jnp.asarray([49, 50, 61]), shape)
            extras["teacher_topk_logprobs"] = jnp.broadcast_to(
                jnp.log(jnp.asarray([0.5, 0.3, 0.1])), shape
            )
        batch = make_batch(
            rollout.prompt_tokens,
            rollout.prompt_mask,
            rollout.completion_tokens,
            rollout.completion_mask,
            rollout.group_id,
            rewards,
            rollout_logprobs=rollout.sampling_logprobs,
            extras=extras,
        )
        state, batch, prepare_metrics = steps.prepare(state, batch)
        state, update_metrics = steps.update(state, batch)
        assert np.isfinite(float(update_metrics["loss"])), (name, i)
        assert all(np.isfinite(float(v)) for v in prepare_metrics.values()), name
    moved = [
        not np.allclose(a, b) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(state.params))
    ]
    assert any(moved), name
    if algorithm.value_loss is not None:  # the critic learns too
        head = state.critic["head"]["kernel"]
        assert not np.allclose(critic_start["head"]["kernel"], head), name
    assert int(state.step) == 3
