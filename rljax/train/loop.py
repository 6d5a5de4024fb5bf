"""The driver: data -> rollout -> rewards (host) -> prepare -> update -> metrics -> checkpoint.

It only orchestrates: everything numerical runs in the jitted steps of `rljax.train.steps`,
and every object comes from the config through `rljax.train.builders`. Resuming restores the
TrainState and the data-iterator state from the newest complete checkpoint, so a run continued
after a crash produces the same metrics as one never stopped.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.data import decode_answers, decode_prompts, prompt_batches, prompt_dataset, sft_dataset
from rljax.data.tasks import Task
from rljax.metrics.writers import MetricsWriter
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import mesh_shardings, shard_params
from rljax.rewards import score_completions
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams
from rljax.train.builders import (
    build_algorithm,
    build_optimizer,
    build_policy,
    build_rollout_config,
    build_task,
    build_update_config,
    prompt_format,
    validate_config,
)
from rljax.train.checkpoint import Checkpointer
from rljax.train.sft import run_sft
from rljax.train.steps import make_steps


@dataclasses.dataclass(frozen=True)
class Prompts:
    """How a run turns task prompts into model input (shared by training, SFT and eval)."""

    tokenizer: Tokenizer
    max_len: int
    format_prompt: Callable[[str], str] | None
    add_bos: bool

    def dataset(self, task: Task, split: str, **kwargs):
        return prompt_dataset(
            task,
            split,
            self.tokenizer,
            self.max_len,
            format_prompt=self.format_prompt,
            add_bos=self.add_bos,
            **kwargs,
        )


def decode_completions(tokenizer: Tokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Completion texts, without the EOS and padding."""
    return [
        tokenizer.decode([int(t) for t, m in zip(row, keep) if m])
        for row, keep in zip(tokens, mask)
    ]


def evaluate(
    graphdef, params, task: Task, prompts: Prompts, config: ConfigDict
) -> dict[str, float]:
    """Greedy accuracy and mean reward on the first `task.eval_size` held-out problems."""
    size, tokenizer = config.task.eval_size, prompts.tokenizer
    dataset = prompts.dataset(
        task, "test", seed=None, num_examples=size, shard_index=0, shard_count=1
    )
    rewards = []
    for batch in prompt_batches(dataset, min(size, config.train.prompts_per_step), num_epochs=1):
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
        "response_length/clip_frac": float((lengths == completion_mask.shape[1]).mean()),
    }
    metrics.update({f"reward/failures_{k}": float(v) for k, v in failures.items()})
    return metrics


def train(config: ConfigDict) -> list[dict[str, float]]:
    """Runs (or resumes) SFT warm start + RL as the config says; returns the logged records."""
    validate_config(config)
    t, n_samples = config.train, config.rollout.n_samples
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    batch_split = mesh.shape["data"] * mesh.shape["fsdp"]
    if t.prompts_per_step % batch_split:
        raise ValueError(
            f"train.prompts_per_step={t.prompts_per_step} is not "
            f"divisible by mesh data x fsdp = {batch_split}"
        )
    task = build_task(config)
    tokenizer, _, graphdef, params = build_policy(config)
    prompts = Prompts(tokenizer, config.task.max_prompt_len, *prompt_format(config, tokenizer))
    params = shard_params(params, mesh)
    algorithm, optimizer = build_algorithm(config), build_optimizer(t)

    run_dir = os.path.abspath(config.run_dir)
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), t.max_checkpoints)
    writer = MetricsWriter(run_dir)
    records: list[dict[str, float]] = []

    def log(step: int, metrics: dict[str, Any]) -> None:
        records.append({"step": step, **writer.write(step, metrics)})

    data = prompt_batches(prompts.dataset(task, "train", seed=config.seed), t.prompts_per_step)
    rng, keep_reference = jax.random.PRNGKey(config.seed), config.algorithm.get("kl_coef", 0) > 0
    start = checkpointer.latest_step()
    if start is None:
        if config.sft.steps > 0:
            params = _warm_start(graphdef, params, task, prompts, config, log)
        state = init_train_state(params, optimizer, algorithm.transform, rng, keep_reference)
        start = 0
        log(0, evaluate(graphdef, state.params, task, prompts, config))
    else:
        like = init_train_state(params, optimizer, algorithm.transform, rng, keep_reference)
        state, data_state = checkpointer.restore(start, like)
        data.set_state(data_state)
        logging.info("resumed from %s at step %d", checkpointer.directory, start)

    shardings = mesh_shardings(state, mesh)
    state = jax.device_put(state, shardings)
    steps = make_steps(
        graphdef,
        optimizer,
        algorithm,
        build_rollout_config(config, tokenizer),
        build_update_config(config),
        mesh,
        shardings,
    )
    bar = tqdm(
        range(start, t.steps),
        desc=config.algorithm.name,
        unit="step",
        initial=start,
        total=t.steps,
        dynamic_ncols=True,
    )
    last_eval = {k: v for k, v in records[-1].items() if k.startswith("eval/")} if records else {}
    for step in bar:
        tick = time.perf_counter()
        batch_in = next(data)
        rollout = steps.rollout(
            state, jnp.asarray(batch_in["prompt_tokens"]), jnp.asarray(batch_in["prompt_mask"])
        )
        completion_mask = np.asarray(rollout.completion_mask)
        completions = decode_completions(
            tokenizer, np.asarray(rollout.completion_tokens), completion_mask
        )
        repeat = lambda xs: [x for x in xs for _ in range(n_samples)]
        rewards, failures = score_completions(
            lambda p, c, a: task.reward(c, a),
            repeat(decode_prompts(batch_in, tokenizer)),
            completions,
            repeat(decode_answers(batch_in)),
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
            last_eval = evaluate(graphdef, state.params, task, prompts, config)
            metrics.update(last_eval)
        log(done, metrics)
        shown = {**{k: records[-1][k] for k in ("reward/mean", "entropy")}, **last_eval}
        bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if k != "eval/reward"})
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


def _warm_start(
    graphdef, params, task: Task, prompts: Prompts, config: ConfigDict, log
) -> nnx.State:
    """SFT on the task's targets; logs its loss under sft/loss at negative steps."""
    s = config.sft
    dataset = sft_dataset(
        task,
        "train",
        prompts.tokenizer,
        prompts.max_len,
        config.rollout.max_new_tokens,
        seed=config.seed + 1,
        format_prompt=prompts.format_prompt,
        add_bos=prompts.add_bos,
    )
    return run_sft(
        graphdef,
        params,
        prompt_batches(dataset, s.batch_size),
        s.steps,
        optax.adam(s.learning_rate),
        config.train.vocab_chunk,
        on_step=lambda i, loss: log(i - s.steps, {"sft/loss": loss}),
    )
