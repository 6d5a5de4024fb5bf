"""The driver: data -> rollout -> rewards (host) -> prepare -> update -> metrics -> checkpoint.

It only orchestrates: everything numerical runs in the jitted steps of `rljax.train.steps`.
Resuming restores the TrainState and the data-iterator state from the newest complete
checkpoint, so a run continued after a crash produces the same metrics as one never stopped.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from rljax import algorithms
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.data import decode_answers, decode_prompts, get_task, prompt_batches, prompt_dataset
from rljax.data.pipeline import sft_batches
from rljax.metrics.writers import MetricsWriter
from rljax.models.config import TransformerConfig
from rljax.models.hf import load_hf_checkpoint
from rljax.models.tokenizer import ByteTokenizer, Tokenizer
from rljax.models.transformer import create_model
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import mesh_shardings, shard_params
from rljax.rewards import score_completions
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams
from rljax.train.checkpoint import Checkpointer
from rljax.train.sft import run_sft
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

ALGORITHMS = {"grpo": algorithms.grpo}


def validate_config(config: ConfigDict) -> None:
    """One-line errors naming the key, before anything is built or compiled."""
    t, r = config.train, config.rollout
    if config.algorithm.name not in ALGORITHMS:
        raise ValueError(
            f"algorithm.name={config.algorithm.name!r} is unknown; "
            f"choose one of {sorted(ALGORITHMS)}"
        )
    if r.n_samples < 2:
        raise ValueError(
            f"rollout.n_samples={r.n_samples}: group-relative advantages need "
            "at least 2 samples per prompt"
        )
    rows = t.prompts_per_step * r.n_samples
    if rows % (t.minibatches * t.microbatches):
        raise ValueError(
            f"train.prompts_per_step x rollout.n_samples = {rows} rows is not divisible by "
            f"train.minibatches x train.microbatches = {t.minibatches} x {t.microbatches}"
        )
    for key in ("steps", "prompts_per_step", "eval_every", "checkpoint_every"):
        if t[key] < 1:
            raise ValueError(f"train.{key}={t[key]} must be >= 1")
    if r.max_new_tokens < 1:
        raise ValueError(f"rollout.max_new_tokens={r.max_new_tokens} must be >= 1")


def build_policy(config: ConfigDict, tokenizer: Tokenizer):
    """(TransformerConfig, graphdef, params): from a local HF checkpoint or from scratch."""
    m = config.model
    if m.checkpoint:
        return load_hf_checkpoint(m.checkpoint, dtype=m.dtype, param_dtype=m.param_dtype)
    model_config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        n_kv_heads=m.n_kv_heads,
        d_ff=m.d_ff,
        rope_theta=m.rope_theta,
        dtype=m.dtype,
        param_dtype=m.param_dtype,
        tie_embeddings=True,
    )
    graphdef, params = create_model(model_config, seed=config.seed)
    return model_config, graphdef, params


def build_optimizer(t: ConfigDict) -> optax.GradientTransformation:
    """AdamW with linear warm-up and gradient clipping; non-finite updates are skipped."""
    schedule = optax.linear_schedule(0.0, t.learning_rate, max(t.warmup_steps, 1))
    return optax.apply_if_finite(
        optax.chain(
            optax.clip_by_global_norm(t.max_grad_norm),
            optax.adamw(schedule, weight_decay=t.weight_decay),
        ),
        max_consecutive_errors=10,
    )


def decode_completions(tokenizer: Tokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Completion texts, without the EOS and padding."""
    return [
        tokenizer.decode([int(t) for t, m in zip(row, keep) if m])
        for row, keep in zip(tokens, mask)
    ]


def evaluate(graphdef, params, task, tokenizer, config: ConfigDict) -> dict[str, float]:
    """Greedy accuracy and mean reward on the first `task.eval_size` held-out problems."""
    size = config.task.eval_size
    dataset = prompt_dataset(
        task,
        "test",
        tokenizer,
        config.task.max_prompt_len,
        seed=None,
        num_examples=size,
        shard_index=0,
        shard_count=1,
    )
    batches = prompt_batches(dataset, min(size, 256), num_epochs=1)
    rewards = []
    for batch in batches:
        out = generate(
            graphdef,
            params,
            jnp.asarray(batch["prompt_tokens"]),
            jnp.asarray(batch["prompt_mask"]),
            jax.random.PRNGKey(0),
            max_new_tokens=config.rollout.max_new_tokens,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            sampling=SamplingParams(greedy=True),
        )
        texts = decode_completions(
            tokenizer, np.asarray(out.completion_tokens), np.asarray(out.completion_mask)
        )
        rewards += [task.reward(c, a) for c, a in zip(texts, decode_answers(batch))]
    rewards = np.asarray(rewards, np.float32)
    return {"eval/accuracy": float((rewards >= 1.0).mean()), "eval/reward": float(rewards.mean())}


def _rollout_metrics(rewards, completion_mask, failures) -> dict[str, float]:
    lengths = completion_mask.sum(axis=1)
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "accuracy": float((rewards >= 1.0).mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
    }
    metrics.update({f"reward/failures_{k}": float(v) for k, v in failures.items()})
    return metrics


def train(config: ConfigDict) -> list[dict[str, float]]:
    """Runs (or resumes) SFT warm start + RL as the config says; returns the logged records."""
    validate_config(config)
    tokenizer = ByteTokenizer()
    task_kwargs = {
        k: v for k, v in config.task.items() if k not in ("name", "max_prompt_len", "eval_size")
    }
    task = get_task(config.task.name, seed=config.seed, **task_kwargs)
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    batch_split = mesh.shape["data"] * mesh.shape["fsdp"]
    if config.train.prompts_per_step % batch_split:
        raise ValueError(
            f"train.prompts_per_step={config.train.prompts_per_step} is not "
            f"divisible by mesh data x fsdp = {batch_split}"
        )
    _, graphdef, params = build_policy(config, tokenizer)
    params = shard_params(params, mesh)

    t, r = config.train, config.rollout
    algorithm = ALGORITHMS[config.algorithm.name](
        group_size=r.n_samples,
        clip_eps=config.algorithm.clip_eps,
        clip_eps_high=config.algorithm.clip_eps_high,
        kl_coef=config.algorithm.kl_coef,
        kl_estimator=config.algorithm.kl_estimator,
        entropy_coef=config.algorithm.entropy_coef,
        normalize_std=config.algorithm.normalize_std,
        aggregation=config.algorithm.aggregation,
    )
    optimizer = build_optimizer(t)
    rollout_config = RolloutConfig(
        max_new_tokens=r.max_new_tokens,
        n_samples=r.n_samples,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        sampling=SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p),
    )
    update_config = UpdateConfig(
        epochs=t.epochs,
        minibatches=t.minibatches,
        microbatches=t.microbatches,
        vocab_chunk=t.vocab_chunk,
    )

    run_dir = os.path.abspath(config.run_dir)
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), t.max_checkpoints)
    writer = MetricsWriter(run_dir)
    records: list[dict[str, float]] = []

    def log(step: int, metrics: dict[str, Any]) -> None:
        records.append({"step": step, **writer.write(step, metrics)})

    dataset = prompt_dataset(task, "train", tokenizer, config.task.max_prompt_len, seed=config.seed)
    data = prompt_batches(dataset, t.prompts_per_step)
    keep_reference = config.algorithm.kl_coef > 0
    start = checkpointer.latest_step()
    if start is None:
        if config.sft.steps > 0:
            params = _warm_start(graphdef, params, task, tokenizer, config, log)
        state = init_train_state(
            params, optimizer, algorithm.transform, jax.random.PRNGKey(config.seed), keep_reference
        )
        start = 0
        log(0, evaluate(graphdef, state.params, task, tokenizer, config))
    else:
        like = init_train_state(
            params, optimizer, algorithm.transform, jax.random.PRNGKey(config.seed), keep_reference
        )
        state, data_state = checkpointer.restore(start, like)
        data.set_state(data_state)
        logging.info("resumed from %s at step %d", checkpointer.directory, start)

    shardings = mesh_shardings(state, mesh)
    state = jax.device_put(state, shardings)
    steps = make_steps(
        graphdef, optimizer, algorithm, rollout_config, update_config, mesh, shardings
    )
    bar = tqdm(
        range(start, t.steps),
        desc="grpo",
        unit="step",
        initial=start,
        total=t.steps,
        dynamic_ncols=True,
    )
    for step in bar:
        tick = time.perf_counter()
        prompts = next(data)
        rollout = steps.rollout(
            state, jnp.asarray(prompts["prompt_tokens"]), jnp.asarray(prompts["prompt_mask"])
        )
        completion_mask = np.asarray(rollout.completion_mask)
        completions = decode_completions(
            tokenizer, np.asarray(rollout.completion_tokens), completion_mask
        )
        repeat = lambda xs: [x for x in xs for _ in range(r.n_samples)]  # noqa: E731
        rewards, failures = score_completions(
            lambda p, c, a: task.reward(c, a),
            repeat(decode_prompts(prompts, tokenizer)),
            completions,
            repeat(decode_answers(prompts)),
        )
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
        metrics = {
            **_rollout_metrics(rewards, completion_mask, failures),
            **prepare_metrics,
            **update_metrics,
        }
        jax.block_until_ready(state.step)
        seconds = time.perf_counter() - tick
        metrics.update(
            {"time/step_s": seconds, "time/tokens_per_s": float(completion_mask.sum()) / seconds}
        )
        done = step + 1
        if done % t.eval_every == 0 or done == t.steps:
            metrics.update(evaluate(graphdef, state.params, task, tokenizer, config))
        log(done, metrics)
        bar.set_postfix(
            {
                k: f"{records[-1][k]:.3f}"
                for k in ("reward/mean", "entropy", "eval/accuracy")
                if k in records[-1]
            }
        )
        if done % t.checkpoint_every == 0 or done == t.steps:
            checkpointer.save(done, state, data.get_state())
            if done == t.kill_at_step:  # crash-safety tests: die hard once this is on disk
                checkpointer.wait()
                writer.close()
                os.kill(os.getpid(), signal.SIGKILL)
    checkpointer.wait()
    checkpointer.close()
    writer.close()
    return records


def _warm_start(graphdef, params, task, tokenizer, config, log) -> nnx.State:
    """SFT on the task's targets; logs its loss under sft/loss at negative steps."""
    s = config.sft
    batches = sft_batches(
        task,
        "train",
        tokenizer,
        config.task.max_prompt_len,
        config.rollout.max_new_tokens,
        s.batch_size,
        seed=config.seed + 1,
    )
    optimizer = optax.adam(s.learning_rate)
    return run_sft(
        graphdef,
        params,
        batches,
        s.steps,
        optimizer,
        config.train.vocab_chunk,
        on_step=lambda i, loss: log(i - s.steps, {"sft/loss": loss}),
    )
