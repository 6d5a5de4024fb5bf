"""The driver: data -> rollout -> rewards (host) -> prepare -> update -> metrics -> checkpoint.

It only orchestrates: everything numerical runs in the jitted steps of `rljax.train.steps`,
and every object comes from the config through `rljax.train.builders`. Resuming restores the
TrainState and the data-iterator state from the newest complete checkpoint, so a run continued
after a crash produces the same metrics as one never stopped.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from rljax.config import validate_config
from rljax.data import HostRows, decode_answers, prompt_batches, prompt_dataset, sft_dataset
from rljax.data.samplers.curriculum import CurriculumSettings
from rljax.data.selected import (
    CurriculumSelector,
    DAREPromptSelector,
    HeaPASelector,
    SelectedPromptBatches,
)
from rljax.data.tasks import Task
from rljax.metrics.writers import MetricsWriter, SamplesWriter, to_scalars
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.distributed import allgather, fetch, to_global, to_local
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import DEFAULT_RULES, mesh_shardings, shard_params
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams
from rljax.train.builders import (
    build_algorithm,
    build_dare_settings,
    build_explore_rollout_config,
    build_lope,
    build_lope_rollout_config,
    build_mesh,
    build_optimizer,
    build_policy,
    build_replay,
    build_rollout_config,
    build_scorer,
    build_task,
    build_train_state,
    build_update_config,
    prompt_format,
    token_level_rewards,
)
from rljax.train.checkpoint import Checkpointer
from rljax.train.collect import collect_batch, decode_completions, rollout_metrics
from rljax.train.faults import maybe_kill
from rljax.train.guard import SkipGuard, tensor_names
from rljax.train.sampler_mesh import SamplerDevices
from rljax.train.sft import run_sft
from rljax.train.steps import make_steps
from rljax.train.uec import UECDriver


@dataclasses.dataclass(frozen=True)
class Prompts:
    """How a run turns task prompts into model input (shared by training, SFT and eval)."""

    tokenizer: Tokenizer
    max_len: int
    max_answer_len: int
    format_prompt: Callable[[str], str] | None
    add_bos: bool

    @classmethod
    def from_config(cls, config: ConfigDict, tokenizer: Tokenizer) -> Prompts:
        """The prompt settings of a run: `task.max_prompt_len`, `task.max_answer_len`, the
        chat template and BOS of the tokenizer (`builders.prompt_format`)."""
        return cls(
            tokenizer,
            config.task.max_prompt_len,
            config.task.get("max_answer_len", 32),
            *prompt_format(config, tokenizer),
        )

    def dataset(self, task: Task, split: str, **kwargs):
        return prompt_dataset(
            task,
            split,
            self.tokenizer,
            self.max_len,
            max_answer_len=self.max_answer_len,
            format_prompt=self.format_prompt,
            add_bos=self.add_bos,
            **kwargs,
        )


def evaluate(
    graphdef, params, task: Task, prompts: Prompts, config: ConfigDict, mesh: Mesh | None = None
) -> dict[str, float]:
    """Greedy accuracy and mean reward on the first `task.eval_size` held-out problems.

    With `mesh` (a multi-process run) every process feeds the whole, identical batch as a
    replicated global array and reads all outputs back, so all report the same numbers.
    """
    size, tokenizer = config.task.eval_size, prompts.tokenizer
    dataset = prompts.dataset(
        task, "test", seed=None, num_examples=size, shard_index=0, shard_count=1
    )
    rewards = []
    for batch in prompt_batches(dataset, min(size, config.train.prompts_per_step), num_epochs=1):
        tokens, mask = batch["prompt_tokens"], batch["prompt_mask"]
        if mesh is not None:
            tokens, mask = to_global((tokens, mask), mesh, PartitionSpec())
        out = generate(
            graphdef,
            params,
            jnp.asarray(tokens),
            jnp.asarray(mask),
            jax.random.PRNGKey(0),
            max_new_tokens=config.rollout.max_new_tokens,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            sampling=SamplingParams(greedy=True),
        )
        texts = decode_completions(
            tokenizer, fetch(out.completion_tokens), fetch(out.completion_mask)
        )
        rewards += [task.reward(c, a) for c, a in zip(texts, decode_answers(batch))]
    rewards = np.asarray(rewards, np.float32)
    return {"eval/accuracy": float((rewards >= 1.0).mean()), "eval/reward": float(rewards.mean())}


def train(config: ConfigDict) -> list[dict[str, float]]:
    """Runs (or resumes) SFT warm start + RL as the config says; returns the logged records."""
    config = validate_config(config)
    t, n_samples = config.train, config.rollout.n_samples
    sampler_devices = config.mesh.get("sampler_devices", 0)
    mesh = build_mesh(config)  # its fit to the devices and batch sizes: validate_config
    batch_split = mesh.shape["data"] * mesh.shape["fsdp"]
    multi = jax.process_count() > 1
    if multi:
        _check_multi_process(config)
    rows = PartitionSpec(DEFAULT_RULES["batch"])  # batch rows over the mesh's batch axes
    lead = jax.process_index() == 0  # writes metrics and shows progress
    task = build_task(config)
    tokenizer, model_config, graphdef, params = build_policy(config)
    prompts = Prompts.from_config(config, tokenizer)
    params = shard_params(params, mesh)
    algorithm = build_algorithm(config, model_config.vocab_size)
    optimizer = build_optimizer(t)
    scorer = build_scorer(config)
    token_level = token_level_rewards(config)
    if token_level and not hasattr(task, "token_rewards"):
        raise ValueError(
            f"reward.token_level=True needs a task with token_rewards(); task "
            f"{config.task.name!r} has none"
        )

    run_dir = os.path.abspath(config.run_dir)
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), t.max_checkpoints)
    start = checkpointer.latest_step()
    # Logs continue from the checkpoint; what a crashed run logged after it is dropped.
    writer = MetricsWriter(run_dir, resume_step=start) if lead else None
    if lead:  # the settings of the run beside its logs (rljax report shows them)
        with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as f:
            f.write(config.to_json_best_effort(indent=2, sort_keys=True))
    samples_logged = t.get("log_samples", 0)
    samples = SamplesWriter(run_dir, resume_step=start) if lead and samples_logged else None
    guard = SkipGuard(t.get("max_consecutive_skips", 5))
    records: list[dict[str, float]] = []

    def log(step: int, metrics: dict[str, Any]) -> None:
        scalars = writer.write(step, metrics) if writer else to_scalars(metrics)
        records.append({"step": step, **scalars})

    def run_eval(params) -> dict[str, float]:
        return evaluate(graphdef, params, task, prompts, config, mesh if multi else None)

    data = _train_prompts(config, task, prompts)
    selected = isinstance(data, SelectedPromptBatches)
    replay = build_replay(config)
    lope = build_lope(config, task, tokenizer, batch_split)
    driver_state = None
    if start is None:
        if config.sft.steps > 0:
            params = _warm_start(graphdef, params, task, prompts, config, log, mesh)
        state, critic_graphdef = build_train_state(
            config, model_config, params, algorithm, optimizer
        )
        start = 0
        log(0, run_eval(state.params))
    else:
        like, critic_graphdef = build_train_state(
            config, model_config, params, algorithm, optimizer
        )
        # Restore straight into the mesh's shardings (no cross-host transfer afterwards).
        like = jax.device_put(like, mesh_shardings(like, mesh))
        state, data_state = checkpointer.restore(start, like)
        if algorithm.collection is not None or replay is not None:
            driver_state = checkpointer.restore_driver(start)
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
        critic_graphdef=critic_graphdef,
    )
    rollout_mesh, rollout_steps, sampler_side = mesh, steps, None
    if sampler_devices:  # the sampler on its own devices; weights resharded every step
        sampler_side = SamplerDevices(
            graphdef,
            optimizer,
            algorithm,
            build_rollout_config(config, tokenizer),
            make_mesh(-1, devices=jax.devices()[:sampler_devices]),
            state.params,
        )
        rollout_mesh, rollout_steps = sampler_side.mesh, sampler_side.steps
    if replay is not None and driver_state is not None:
        replay.load(driver_state)
    if lope is not None:
        lope_rollout = make_steps(
            graphdef,
            optimizer,
            algorithm,
            build_lope_rollout_config(config, tokenizer, lope.settings),
            mesh=mesh,
            state_shardings=shardings,
        ).rollout
    bar = tqdm(
        range(start, t.steps),
        desc=config.algorithm.name,
        unit="step",
        initial=start,
        total=t.steps,
        dynamic_ncols=True,
        disable=not lead,
    )
    last_eval = {k: v for k, v in records[-1].items() if k.startswith("eval/")} if records else {}
    uec = None
    if algorithm.collection is not None:  # UEC-RL: exploration rollouts and a replay buffer
        uec = UECDriver(
            algorithm.collection,
            task,
            tokenizer,
            n_samples,
            t.prompts_per_step * n_samples,
            config.seed,
            prompt_multiple=batch_split,
            scorer=scorer,
        )
        if driver_state is not None:
            uec.load(driver_state)
        explore = make_steps(
            graphdef,
            optimizer,
            algorithm,
            build_explore_rollout_config(config, tokenizer, algorithm.collection),
            mesh=mesh,
            state_shardings=shardings,
        )

    def rollout(state, tokens, mask, attempt=0):
        """The sampler on this process's prompt rows -> this process's sample rows."""
        tokens, mask = to_global((np.asarray(tokens), np.asarray(mask)), rollout_mesh, rows)
        out = rollout_steps.rollout(state, tokens, mask, attempt)
        maybe_kill(done, "rollout", checkpointer.wait)
        return to_local(out, rollout_mesh, rows)

    def learn(state, batch):
        batch = to_global(batch, mesh, rows)  # this process's rows -> the global batch
        transform_state = state.transform_state
        state, batch, prepare_metrics = steps.prepare(state, batch)
        state, update_metrics = steps.update(state, batch)
        maybe_kill(done, "update", checkpointer.wait)
        metrics = {**prepare_metrics, **update_metrics}
        names = functools.partial(tensor_names, batch, state.params, state.critic)
        skipped = guard.check(done, metrics, names)
        if skipped == 1.0:  # no update at all: the transforms' statistics stay as they were
            state = state.replace(transform_state=transform_state)
        return state, metrics

    sampler = StalePolicy(t.get("max_staleness", 0))
    for step in bar:
        tick = time.perf_counter()
        done = step + 1
        if uec is None:
            sampler_state, lag = sampler.state_for(state)
            logprobs = functools.partial(steps.logprobs, state)
            if selected:  # DARE scores fed-back rollouts with the parameters that sampled them
                data.set_policy(logprobs, functools.partial(steps.logprobs, sampler_state))
            if sampler_side is not None:
                sampler_state, reshard_s = sampler_side.reshard(sampler_state)
            rescue = None
            if lope is not None:
                rescue = functools.partial(
                    lope, done, functools.partial(lope_rollout, state), logprobs
                )
            batch, metrics = collect_batch(
                functools.partial(rollout, sampler_state),
                data,
                task,
                tokenizer,
                n_samples,
                config.rollout.get("max_refill_rounds", 0),
                _greedy_decoder(graphdef, state, config, tokenizer, algorithm),
                scorer,
                data.feedback if selected else None,
                rescue,
                token_level,
            )
            if multi:  # host metrics of this process's rows -> of the whole batch
                metrics = _global_host_metrics(metrics, batch)
            if samples is not None:
                samples.write(done, _sample_groups(batch, tokenizer, n_samples, samples_logged))
            if sampler.max_staleness:  # the sampler's policy version, per sample
                version = jnp.full(batch.group_id.shape, int(state.step) - lag, jnp.int32)
                batch = batch.replace(extras={**batch.extras, "policy_version": version})
                metrics["staleness/versions"] = float(lag)
            if sampler_side is not None:
                metrics["time/reshard_s"] = reshard_s
            state, learned = learn(state, batch)
            metrics.update(learned)
            if selected:
                metrics.update(data.metrics())
            tokens = float(allgather(np.asarray(batch.completion_mask)).sum())
            if replay is not None:  # groups of earlier steps, then this step's go in
                replayed, replay_metrics = replay.batch(done)
                if replayed is not None:
                    state, learned = learn(state, replayed)
                    metrics.update({f"replay/{k}": v for k, v in learned.items()})
                metrics.update(replay_metrics)
                replay.add(done, batch)
        else:
            # The loop step salts the rollout key: a step without an update keeps state.step.
            batches, metrics = uec.collect(
                functools.partial(steps.rollout, state, attempt=2 * done),
                functools.partial(explore.rollout, state, attempt=2 * done + 1),
                data,
            )
            updates, replays = [], []
            for batch in batches:
                state, learned = learn(state, batch)
                updates.append(learned)
            for batch in uec.replay_batches(done):
                state, learned = learn(state, batch)
                replays.append(learned)
            metrics.update(_mean_metrics(updates))
            metrics.update({f"replay/{k}": v for k, v in _mean_metrics(replays).items()})
            metrics["uec/replay_updates"] = float(len(replays))
            tokens = float(sum(np.asarray(b.completion_mask).sum() for b in batches))
        jax.block_until_ready(state.step)
        seconds = time.perf_counter() - tick
        metrics.update({"time/step_s": seconds, "time/tokens_per_s": tokens / seconds})
        if done % t.eval_every == 0 or done == t.steps:
            last_eval = run_eval(state.params)
            metrics.update(last_eval)
        log(done, metrics)
        shown = {k: records[-1][k] for k in ("reward/mean", "entropy") if k in records[-1]}
        shown.update(last_eval)
        bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if k != "eval/reward"})
        if done % t.checkpoint_every == 0 or done == t.steps:
            host = uec if uec is not None else replay  # drivers with host-side state
            checkpointer.save(done, state, data.get_state(), None if host is None else host.state())
            maybe_kill(done, "checkpoint")  # crash-safety tests: mid-write ...
            maybe_kill(done, "saved", checkpointer.wait)  # ... or once it is on disk
    checkpointer.wait()
    checkpointer.close()
    for sink in (writer, samples):
        if sink is not None:
            sink.close()
    return records


class StalePolicy:
    """Bounded staleness: the sampler uses the policy of up to `max_staleness` updates ago.

    The schedule of asynchronous RL (rollouts from a policy K versions old while the trainer
    moves on), run in order so it is reproducible: each step samples with the oldest of the
    last K + 1 parameter versions (fewer at the start of a run, and after a resume, which
    starts the queue afresh). K = 0 is the synchronous loop, unchanged. The gap between
    sampler and trainer shows in the `mismatch/*` metrics, and the rollout corrections
    (`rollout_correction.name=tis|mis|ais`) correct it as they do quantized rollouts.

    Args:
      max_staleness: K >= 0 versions.
    """

    def __init__(self, max_staleness: int):
        if max_staleness < 0:
            raise ValueError(f"train.max_staleness={max_staleness} must be >= 0")
        self.max_staleness = max_staleness
        self.versions: collections.deque = collections.deque()

    def state_for(self, state):
        """(the state to sample with, how many versions older than `state` its params are)."""
        if not self.max_staleness:
            return state, 0
        # A copy: the update donates the state's buffers.
        self.versions.append(jax.tree.map(jnp.copy, state.params))
        while len(self.versions) > self.max_staleness + 1:
            self.versions.popleft()
        return state.replace(params=self.versions[0]), len(self.versions) - 1


def _check_multi_process(config: ConfigDict) -> None:
    """What a multi-process run supports so far, checked before anything is compiled.

    Every jitted step is one program across all processes, so each must call it in lockstep;
    features that decide on host-local data whether to sample or score again (refill, LoPE,
    UEC-RL's exploration, DARE's rescoring, replay) would not, and ReMax's greedy decoder is
    not placed on the global mesh yet.
    """
    off = {
        "rollout.max_refill_rounds": config.rollout.get("max_refill_rounds", 0) != 0,
        "prompt_selection.name": config.get("prompt_selection", {}).get("name", "none") != "none",
        "replay.name": config.get("replay", {}).get("name", "none") != "none",
        "lope.num_perturbed": config.get("lope", {}).get("num_perturbed", 0) != 0,
        "algorithm.name": config.algorithm.name in ("uec_rl", "remax"),
        "mesh.sampler_devices": config.mesh.get("sampler_devices", 0) != 0,
    }
    unsupported = [key for key, on in off.items() if on]
    if unsupported:
        raise ValueError(
            f"{unsupported} are not supported with {jax.process_count()} processes yet; run them "
            "on one host (any number of its devices)"
        )


def _global_host_metrics(local: dict[str, Any], batch) -> dict[str, float]:
    """Host-side metrics of the whole batch from every process's rows: reward/accuracy/length
    statistics recomputed over all rows, reward-failure counts summed, the rest averaged."""
    keys = sorted(local)
    values = allgather(np.asarray([[float(local[k]) for k in keys]], np.float64))
    out = {
        k: float(values[:, i].sum() if k.startswith("reward/failures_") else values[:, i].mean())
        for i, k in enumerate(keys)
    }
    rewards = allgather(np.asarray(batch.rewards))
    out.update(rollout_metrics(rewards, allgather(np.asarray(batch.completion_mask))))
    return out


def _train_prompts(config: ConfigDict, task: Task, prompts: Prompts):
    """The training prompt batches: the shuffled split, or a `prompt_selection` selector's
    picks (HeaPA, DARE, or the curriculum over the task's difficulty levels) from a pool of the
    split's first `prompt_selection.pool_size` prompts."""
    batch_size = config.train.prompts_per_step
    selection = config.get("prompt_selection")
    if selection is None or selection.name == "none":
        dataset = prompts.dataset(task, "train", seed=config.seed, shard_index=0, shard_count=1)
        return HostRows(
            prompt_batches(dataset, batch_size), jax.process_index(), jax.process_count()
        )
    size = task.split_size("train")
    pool_size = selection.get("pool_size", 0) or size
    if pool_size is None:
        raise ValueError(
            f"task {config.task.name!r} has an unbounded train split; set "
            "prompt_selection.pool_size to the number of prompts the selector chooses from"
        )
    pool = prompts.dataset(task, "train", seed=None, num_examples=pool_size)
    if selection.name == "heapa":
        selector = HeaPASelector(len(pool), config.seed, selection.get("low_fraction", 0.5))
    elif selection.name == "dare":
        rows = batch_size * config.rollout.n_samples
        selector = DAREPromptSelector(len(pool), config.seed, build_dare_settings(config), rows)
    else:
        if not hasattr(task, "difficulty"):
            raise ValueError(
                f"prompt_selection.name='curriculum' needs a task with difficulty levels; "
                f"task {config.task.name!r} has no difficulty(index, split)"
            )
        indices = [int(pool[i]["index"]) for i in range(len(pool))]
        difficulties = [task.difficulty(i, "train") for i in indices]
        keys = ("threshold", "decay", "review", "min_updates")
        settings = CurriculumSettings(**{k: selection[k] for k in keys if k in selection})
        selector = CurriculumSelector(difficulties, config.seed, settings)
    return SelectedPromptBatches(pool, selector, batch_size)


def _greedy_decoder(graphdef, state, config: ConfigDict, tokenizer: Tokenizer, algorithm):
    """ReMax's greedy decoder of the current policy, or None when the algorithm needs none."""
    if not algorithm.greedy_baseline:
        return None
    return functools.partial(
        generate,
        graphdef,
        state.params,
        rng=jax.random.PRNGKey(0),
        max_new_tokens=config.rollout.max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        sampling=SamplingParams(greedy=True),
    )


def _sample_groups(batch, tokenizer: Tokenizer, n_samples: int, groups: int) -> list[dict]:
    """The first `groups` prompt groups of a batch (all for -1) as samples-log records."""
    fields = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask", "rewards")
    prompt, prompt_mask, tokens, mask, rewards = (np.asarray(getattr(batch, f)) for f in fields)
    ids = np.asarray(batch.extras["prompt_id"])
    total = len(ids) // n_samples
    count = total if groups < 0 else min(groups, total)
    texts = decode_completions(tokenizer, tokens[: count * n_samples], mask[: count * n_samples])
    out = []
    for g in range(count):
        rows = slice(g * n_samples, (g + 1) * n_samples)
        first = g * n_samples
        out.append(
            {
                "prompt_id": int(ids[first]),
                "prompt": tokenizer.decode(prompt[first][prompt_mask[first]].tolist()),
                "completions": texts[rows],
                "rewards": rewards[rows].astype(float).tolist(),
            }
        )
    return out


def _mean_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per-key means over the updates of one step (UEC-RL runs zero, one or more)."""
    if not records:
        return {}
    return {k: float(np.mean([float(r[k]) for r in records])) for k in records[0]}


def _warm_start(
    graphdef, params, task: Task, prompts: Prompts, config: ConfigDict, log, mesh: Mesh
) -> nnx.State:
    """SFT on the task's targets; logs its loss under sft/loss at negative steps. Each process
    feeds its rows of the global batches, split over the mesh's batch axes."""
    s = config.sft
    dataset = sft_dataset(
        task,
        "train",
        prompts.tokenizer,
        prompts.max_len,
        config.rollout.max_new_tokens,
        seed=config.seed + 1,
        shard_index=0,
        shard_count=1,
        format_prompt=prompts.format_prompt,
        add_bos=prompts.add_bos,
    )
    rows = PartitionSpec(DEFAULT_RULES["batch"])
    local = HostRows(
        prompt_batches(dataset, s.batch_size), jax.process_index(), jax.process_count()
    )
    return run_sft(
        graphdef,
        params,
        (to_global(b, mesh, rows) for b in local),
        s.steps,
        optax.adam(s.learning_rate),
        config.train.vocab_chunk,
        on_step=lambda i, loss: log(i - s.steps, {"sft/loss": loss}),
    )
