"""A masked-diffusion policy on the one driver: what `rljax.train.loop.train` builds when
`model.kind = "diffusion"` (`rljax.train.kinds.DIFFUSION`).

  policy      a bidirectional transformer from scratch (`model.*` sizes) with a MASK id
              appended after the byte tokenizer's vocabulary (`diffusion_config`)
  algorithm   `algorithm.name` in `DIFFUSION_ALGORITHMS`, the `algorithm.*` settings
  warm start  LLaDA's masked-token SFT (`rljax.diffusion.sft`)
  steps       `make_diffusion_steps` (block-wise sampler, estimates, objective)
  collector   `GroupCollector` over a `DiffusionDraw` (Block-R1 sizes, DAPO refill)
  evaluation  greedy (temperature 0) decoding of the first `task.eval_size` test problems

Sampler settings: `rollout.max_new_tokens` (gen_length), `rollout.block_size` (0: one block),
`rollout.steps_per_block` (0: one token per step), `rollout.remasking`,
`rollout.temperature`, `rollout.block_sizes` (Block-R1's candidates; () off).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from ml_collections import ConfigDict

from rljax.core.state import TrainState, init_train_state
from rljax.data import prompt_batches
from rljax.data.tasks import Task
from rljax.diffusion.algorithms import DIFFUSION_ALGORITHMS, DiffusionAlgorithm
from rljax.diffusion.collect import DiffusionDraw, decode_visible, sharded_rollout
from rljax.diffusion.policy import create_diffusion_model, diffusion_config
from rljax.diffusion.sampler import diffusion_generate
from rljax.diffusion.steps import DiffusionRolloutConfig, make_diffusion_steps
from rljax.models.config import TransformerConfig
from rljax.models.tokenizer import ByteTokenizer, Tokenizer
from rljax.parallel.distributed import fetch, to_global
from rljax.train.builders import (
    build_scorer,
    build_update_config,
    preset_arguments,
    preset_settings,
)
from rljax.train.collector import Collector, GroupCollector
from rljax.train.prompts import Prompts
from rljax.train.scoring import eval_metrics, score_rollout
from rljax.train.staleness import SamplerPolicy
from rljax.train.steps import Steps


def build_diffusion_policy(
    config: ConfigDict,
) -> tuple[Tokenizer, TransformerConfig, nnx.GraphDef, nnx.State]:
    """(tokenizer, model config, graphdef, params) of a byte-level diffusion LM from scratch.

    The MASK id is the tokenizer's vocabulary size (`diffusion_config`), so the model has one
    more vocabulary entry than the tokenizer emits. Embeddings are untied.
    """
    m, tokenizer = config.model, ByteTokenizer()
    dconfig = diffusion_config(
        tokenizer.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        n_kv_heads=m.n_kv_heads,
        d_ff=m.d_ff,
        rope_theta=m.rope_theta,
        dtype=m.dtype,
        param_dtype=m.param_dtype,
        attention_impl=m.attention_impl,
    )
    graphdef, params = create_diffusion_model(dconfig, config.seed)
    return tokenizer, dconfig.model, graphdef, params


def mask_id(tokenizer: Tokenizer) -> int:
    """The MASK id of a diffusion policy built for `tokenizer` (`diffusion_config`)."""
    return tokenizer.vocab_size


def _blocks(rollout: ConfigDict) -> tuple[int, int]:
    """(block_size, steps_per_block) of `rollout.*`: 0 block size is one block of the whole
    completion; 0 steps per block is one token per step."""
    block = rollout.block_size or rollout.max_new_tokens
    return block, rollout.steps_per_block or block


def build_diffusion_rollout_config(
    config: ConfigDict, tokenizer: Tokenizer
) -> DiffusionRolloutConfig:
    """The sampler's settings from `rollout.*` and the tokenizer's EOS and MASK ids."""
    r = config.rollout
    block, steps_per_block = _blocks(r)
    return DiffusionRolloutConfig(
        gen_length=r.max_new_tokens,
        block_size=block,
        steps_per_block=steps_per_block,
        n_samples=r.n_samples,
        mask_id=mask_id(tokenizer),
        eos_id=tokenizer.eos_id,
        temperature=r.temperature,
        remasking=r.remasking,
    )


def build_diffusion_algorithm(config: ConfigDict, model_config: Any = None) -> DiffusionAlgorithm:
    """The `algorithm.name` diffusion preset with the `algorithm.*` settings; G = n_samples.

    A preset that takes `num_steps` (DACA's progress scores) gets the sampler's S.
    """
    del model_config
    a = config.algorithm
    preset = DIFFUSION_ALGORITHMS[a.name]
    values: dict[str, Any] = {k: v for k, v in a.items() if k != "name"}
    if "num_steps" in preset_settings(preset) and "num_steps" not in values:
        block, steps_per_block = _blocks(config.rollout)
        values["num_steps"] = config.rollout.max_new_tokens // block * steps_per_block
    try:
        kwargs = preset_arguments(preset, values)
        return preset(group_size=config.rollout.n_samples, **kwargs)
    except TypeError as err:
        raise ValueError(f"algorithm settings do not fit algorithm.name={a.name!r}: {err}") from err


def build_diffusion_train_state(
    config: ConfigDict,
    model_config: Any,
    params: nnx.State,
    algorithm: DiffusionAlgorithm,
    optimizer: optax.GradientTransformation,
) -> tuple[TrainState, None]:
    """A fresh TrainState; the reference policy (the SFT policy) is kept when the algorithm
    reads it (a KL with beta > 0, or RSPO's log-ratio). No critic."""
    del model_config
    state = init_train_state(
        params,
        optimizer,
        algorithm.transform,
        jax.random.PRNGKey(config.seed),
        algorithm.needs_reference,
    )
    return state, None


def build_diffusion_steps(
    config: ConfigDict,
    tokenizer: Tokenizer,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    algorithm: DiffusionAlgorithm,
    mesh: Mesh,
    shardings: TrainState,
    critic_graphdef: None = None,
) -> Steps:
    """`make_diffusion_steps` with the run's sampler and update settings, on its mesh."""
    del critic_graphdef
    return make_diffusion_steps(
        graphdef,
        optimizer,
        algorithm,
        build_diffusion_rollout_config(config, tokenizer),
        build_update_config(config),
        mesh,
        shardings,
    )


def build_diffusion_collector(
    config: ConfigDict,
    task: Task,
    tokenizer: Tokenizer,
    data: Iterator[dict[str, Any]],
    algorithm: DiffusionAlgorithm,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state: TrainState,
    steps: Steps,
) -> Collector:
    """G samples per prompt from a `DiffusionDraw` (Block-R1's `rollout.block_sizes`), with
    DAPO's refill (`rollout.max_refill_rounds`)."""
    del algorithm, graphdef, optimizer, state
    r = config.rollout
    draw = DiffusionDraw(
        data,
        sharded_rollout(steps.rollout, mesh),
        task,
        tokenizer,
        r.n_samples,
        build_scorer(config),
        tuple(r.block_sizes),
    )
    return GroupCollector(draw, r.n_samples, SamplerPolicy(), r.max_refill_rounds)


def diffusion_greedy_eval(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    mesh: Mesh | None = None,
) -> dict[str, float]:
    """Greedy (temperature 0) accuracy and mean reward on the first `task.eval_size` test
    problems, decoded in one batch at `rollout.block_size`, specials visible, scored by the
    run's contained scorer (failures counted in `eval/reward_failures_*`). With `mesh`
    (several processes) every process feeds the whole batch replicated and reads all outputs
    back."""
    size, tokenizer = config.task.eval_size, prompts.tokenizer
    rc = build_diffusion_rollout_config(config, tokenizer)
    dataset = prompts.dataset(
        task, "test", seed=None, num_examples=size, shard_index=0, shard_count=1
    )
    batch = next(prompt_batches(dataset, size, num_epochs=1))
    tokens, mask = batch["prompt_tokens"], batch["prompt_mask"]
    if mesh is not None:
        tokens, mask = to_global((tokens, mask), mesh, PartitionSpec())
    out = diffusion_generate(
        graphdef,
        params,
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jax.random.PRNGKey(0),
        gen_length=rc.gen_length,
        block_size=rc.block_size,
        steps_per_block=rc.steps_per_block,
        mask_id=rc.mask_id,
        temperature=0.0,
        remasking=rc.remasking,
        eos_id=rc.eos_id,
    )
    scores, failures = score_rollout(
        task,
        tokenizer,
        batch,
        fetch(out.completion_tokens),
        fetch(out.completion_mask),
        1,
        build_scorer(config),
        grouped=False,
        decode=decode_visible,
    )
    return eval_metrics(scores, failures)
