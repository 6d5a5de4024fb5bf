"""The driver: collect -> learn each batch -> log -> checkpoint.

It only orchestrates. Every object comes from the config through the builders of the policy's
kind (`model.kind`, `rljax.train.kinds`: a causal LM's `rljax.train.builders`, steps and
collectors, or a masked-diffusion LM's `rljax.diffusion.engine`), everything numerical runs in
the jitted steps, and what a step learns from is the collector's business. A checkpoint
holds (train state, data-iterator state, collector state), so a run resumed after a crash
produces the same metrics as one never stopped.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.sharding import PartitionSpec
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from rljax.config import validate_config
from rljax.core.state import TrainState
from rljax.metrics.backends import build_backends, parse_backends
from rljax.metrics.flops import MatmulProbe, model_flops
from rljax.metrics.writers import MetricsWriter, SamplesWriter, to_scalars
from rljax.models.lora import merged_params
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.distributed import allgather, to_global
from rljax.parallel.rules import DEFAULT_RULES, mesh_shardings, shard_params
from rljax.rewards.pool import close_shared_pools
from rljax.train.builders import build_mesh, build_optimizer, build_task
from rljax.train.checkpoint import Checkpointer
from rljax.train.collection import check_multi_process, reward_component_names
from rljax.train.collector import Collector
from rljax.train.compile_cache import enable_compilation_cache
from rljax.train.disk import DiskFullErrors
from rljax.train.faults import maybe_kill, maybe_poison
from rljax.train.guard import SkipGuard, check_warm_start, tensor_names
from rljax.train.host_batch import HostBatch
from rljax.train.kinds import policy_kind
from rljax.train.overlap import OverlappedCollector, check_overlap
from rljax.train.padding import trim_padding, used_widths
from rljax.train.prompts import Prompts, train_prompts
from rljax.train.run_dir import RunDir
from rljax.train.scoring import decode_completions
from rljax.train.signals import Stopped, StoppedInWarmStart, StopSignals
from rljax.train.timing import STEP_PHASES, CompileClock, add_time, timed


def train(
    config: ConfigDict, wrap_collector: Callable[[Collector], Collector] | None = None
) -> list[dict[str, float]]:
    """Runs (or resumes) SFT warm start + RL as the config says; returns the logged records.

    Args:
      config: the run config (`configs/grpo_addition.py` documents every key).
      wrap_collector: your own collector around the one the config builds (e.g. a replay or
        a filter of your method); its `state()` is checkpointed with the run.
    """
    config = validate_config(config)
    with contextlib.ExitStack() as opened:  # closed on success and on any error alike
        return _train(config, wrap_collector, opened)


def _train(
    config: ConfigDict,
    wrap_collector: Callable[[Collector], Collector] | None,
    opened: contextlib.ExitStack,
) -> list[dict[str, float]]:
    """`train` on a validated config; what it opens (checkpointer, logs) goes on `opened`."""
    t = config.train
    run_dir = os.path.abspath(config.run_dir)
    run = opened.enter_context(RunDir(run_dir, config))  # one writer; before anything is built
    stop = opened.enter_context(StopSignals())  # SIGINT/SIGTERM: save this step, then stop
    opened.callback(close_shared_pools)  # the reward workers (`reward.kind`) end with the run
    enable_compilation_cache(t.compilation_cache)
    mesh = build_mesh(config)  # its fit to the devices and batch sizes: validate_config
    multi = jax.process_count() > 1
    if multi:
        check_multi_process(config)
    lead = jax.process_index() == 0  # writes metrics and shows progress
    kind = policy_kind(config)  # "causal" or "diffusion": the builders below
    task = build_task(config)
    tokenizer, model_config, graphdef, params = kind.build_policy(config)
    prompts = Prompts.from_config(config, tokenizer)
    params = shard_params(params, mesh)
    algorithm = kind.build_algorithm(config, model_config)
    reward_component_names(config, task, algorithm)  # its config errors before the warm start
    check_overlap(config, task, algorithm)
    optimizer = build_optimizer(t)

    # A full disk: one DiskFull after everything below is closed (hence entered first).
    disk = opened.enter_context(DiskFullErrors(run_dir, lambda: None))
    checkpointer = Checkpointer(
        os.path.join(run_dir, "checkpoints"),
        t.max_checkpoints,
        allow_unverified=t.allow_unverified_checkpoint,
    )
    opened.enter_context(checkpointer)  # on an error, closed without masking it
    disk.latest_step = checkpointer.latest_step
    start = checkpointer.latest_step()
    run.begin(start)  # a resumed run's config against the stored one; config.json, configs.jsonl
    # Logs continue from the checkpoint; what a crashed run logged after it is dropped.
    writer = metrics_writer(config, run_dir, start) if lead else None
    samples_logged = t.log_samples
    samples = SamplesWriter(run_dir, resume_step=start) if lead and samples_logged else None
    for sink in (writer, samples):
        if sink is not None:
            opened.callback(sink.close)
    guard = SkipGuard(t.max_consecutive_skips)
    records: list[dict[str, float]] = []

    def log(step: int, metrics: dict[str, Any]) -> None:
        scalars = writer.write(step, metrics) if writer else to_scalars(metrics)
        records.append({"step": step, **scalars})
        if step < 0:  # the SFT warm start logs at steps -sft.steps .. -1: stop there too
            signum = stop_signal(stop)
            if signum:
                raise StoppedInWarmStart(signum, config.sft.steps + step + 1, config.sft.steps)

    def run_eval(params) -> dict[str, float]:
        return kind.evaluate(graphdef, params, task, prompts, config, mesh if multi else None)

    data = train_prompts(config, task, prompts)
    if start is None:
        if config.sft.steps > 0:
            params = kind.warm_start(graphdef, params, task, prompts, config, log, mesh)
            check_warm_start(params)
        state, critic_graphdef = kind.build_train_state(
            config, model_config, params, algorithm, optimizer
        )
        start = 0
        log(0, run_eval(merged_params(state)))
    else:
        like, critic_graphdef = kind.build_train_state(
            config, model_config, params, algorithm, optimizer
        )
        # Restore straight into the mesh's shardings (no cross-host transfer afterwards).
        like = jax.device_put(like, mesh_shardings(like, mesh))
        state, data_state = checkpointer.restore(start, like)
        data.set_state(data_state)
        logging.info("resumed from %s at step %d", checkpointer.directory, start)

    shardings = mesh_shardings(state, mesh)
    state = jax.device_put(state, shardings)
    steps = kind.make_steps(
        config, tokenizer, graphdef, optimizer, algorithm, mesh, shardings, critic_graphdef
    )
    collector = kind.build_collector(
        config, task, tokenizer, data, algorithm, graphdef, optimizer, mesh, state, steps
    )
    if isinstance(collector, OverlappedCollector):  # its sampler thread stops with the run
        opened.callback(collector.close)
    if wrap_collector is not None:
        collector = wrap_collector(collector)
    if start and collector.state():  # a collector with host state: buffers, queues
        collector.load(checkpointer.restore_driver(start))
    rows = PartitionSpec(DEFAULT_RULES["batch"])  # batch rows over the mesh's batch axes
    pad_multiple = t.pad_multiple if kind.trims_padding else 0
    peak = matmul_peak(config, model_config, mesh.devices.size)

    def learn(state: TrainState, host: HostBatch, phases: dict[str, float]):
        """One update on a host batch -> (state, metrics); its seconds added to `phases`."""
        host = maybe_poison(done, host)  # crash-safety tests: a non-finite update at `done`
        if pad_multiple:  # every process keeps the widest process's columns
            host = trim_padding(host, pad_multiple, allgather(used_widths(host)[None]).max(0))
        batch = to_global(host.to_batch(), mesh, rows)  # this process's rows -> global batch
        transform_state = state.transform_state
        (state, batch, prepare_metrics), seconds = timed(steps.prepare, state, batch)
        add_time(phases, "time/old_logprobs_s", seconds)
        (state, update_metrics), seconds = timed(steps.update, state, batch)
        add_time(phases, "time/update_s", seconds)
        n, prompt_width = batch.prompt_tokens.shape
        completion_width = batch.completion_tokens.shape[1]
        flops = model_flops(model_config, n, prompt_width, completion_width)
        update_metrics["perf/mfu"] = t.epochs * flops["model"] / seconds / peak
        update_metrics["perf/row_positions"] = prompt_width + completion_width
        maybe_kill(done, "update", checkpointer.wait)
        metrics = {**prepare_metrics, **update_metrics}
        names = functools.partial(tensor_names, batch, state)
        skipped = guard.check(done, metrics, names)
        if skipped == 1.0:  # no update at all: the transforms' statistics stay as they were
            state = state.replace(transform_state=transform_state)
        return state, metrics

    def learn_all(state: TrainState, batches: list[HostBatch], phases: dict[str, float]):
        """One update per batch; the per-key means of their metrics."""
        learned = []
        for host in batches:
            state, metrics = learn(state, host, phases)
            learned.append(to_scalars(metrics))
        means = {k: float(np.mean([m[k] for m in learned])) for k in learned[0]} if learned else {}
        return state, means

    def save(step: int, state: TrainState) -> None:
        """Starts a checkpoint; the collector's state first (an overlapped sampler pauses at
        a batch boundary there, so the data iterator's state matches its queue)."""
        driver = collector.state() or None
        checkpointer.save(step, state, data.get_state(), driver)

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
    with CompileClock() as compile_clock:
        for step in bar:
            tick = time.perf_counter()
            compile_clock.take()  # from here on: this step's compilations
            done = step + 1
            fresh, replay, metrics = collector.collect(state, done)
            maybe_kill(done, "rollout", checkpointer.wait)
            if samples is not None and fresh:
                samples.write(done, sample_groups(fresh[0], tokenizer, samples_logged))
            phases = {k: metrics.pop(k, 0.0) for k in ("time/rollout_s", "time/reward_s")}
            state, learned = learn_all(state, fresh, phases)
            metrics.update(learned)
            state, learned = learn_all(state, replay, phases)
            metrics.update({f"replay/{k}": v for k, v in learned.items()})
            tokens = sum(float(allgather(b.rows["completion_mask"]).sum()) for b in fresh)
            jax.block_until_ready(state.step)
            seconds = time.perf_counter() - tick
            metrics.update({k: phases.get(k, 0.0) for k in STEP_PHASES})
            metrics["time/other_s"] = seconds - sum(phases.values())
            metrics.update({"time/step_s": seconds, "time/tokens_per_s": tokens / seconds})
            metrics["time/compile_s"] = compile_clock.take()
            if done % t.eval_every == 0 or done == t.steps:
                last_eval, metrics["time/eval_s"] = timed(run_eval, merged_params(state))
                metrics.update(last_eval)
            saving = done % t.checkpoint_every == 0 or done == t.steps
            if saving:  # asynchronous: the time the loop waits for the write to start
                start_save = time.perf_counter()
                save(done, state)
                metrics["time/checkpoint_s"] = time.perf_counter() - start_save
            log(done, metrics)
            shown = {k: records[-1][k] for k in ("reward/mean", "entropy") if k in records[-1]}
            shown.update({k: v for k, v in last_eval.items() if k == "eval/accuracy"})
            bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()})
            if saving:
                maybe_kill(done, "checkpoint")  # crash-safety tests: mid-write ...
                maybe_kill(done, "saved", checkpointer.wait)  # ... or once it is on disk
            signum = stop_signal(stop)
            if signum is not None and done < t.steps:
                if not saving:
                    save(done, state)
                checkpointer.wait()
                raise Stopped(signum, done)
    checkpointer.wait()
    return records


def metrics_writer(config: ConfigDict, run_dir: str, start: int | None) -> MetricsWriter:
    """metrics.jsonl, and TensorBoard, W&B and MLflow as `log.backends` asks (W&B and MLflow
    name their run `log.name`, else the run directory's name)."""
    names = parse_backends(config.log.backends)
    name = config.log.name or os.path.basename(run_dir)
    more = build_backends(names, run_dir, config.to_dict(), config.log.project, name)
    return MetricsWriter(run_dir, "tensorboard" in names, resume_step=start, backends=more)


def matmul_peak(config: ConfigDict, model_config: Any, devices: int) -> float:
    """FLOP/s of `devices` devices on a matmul of the update's shape ([micro-batch rows x
    positions, d_model] x [d_model, 4 d_model] in the compute dtype), measured once per run:
    the denominator of `perf/mfu`."""
    t = config.train
    rows = t.prompts_per_step * config.rollout.n_samples
    rows //= t.minibatches * t.microbatches * devices
    positions = config.task.max_prompt_len + config.rollout.max_new_tokens
    probe = MatmulProbe(max(rows, 1) * positions, model_config.d_model, model_config.dtype)
    return devices * probe.flops_per_s()


def stop_signal(stop: StopSignals) -> int | None:
    """The signal the run stops on after this step, or None. Every process gets the same
    answer (any one's signal stops all at the same step; the others would otherwise wait in a
    collective): one small allgather per step, free with one process."""
    signals = allgather(np.asarray([stop.received or 0], np.int32))
    return int(signals.max()) or None


def sample_groups(batch: HostBatch, tokenizer: Tokenizer, groups: int) -> list[dict]:
    """The first `groups` prompt groups of a batch (all for -1) as samples-log records."""
    g, rows = batch.group_size, batch.rows
    count = batch.num_groups if groups < 0 else min(groups, batch.num_groups)
    texts = decode_completions(
        tokenizer, rows["completion_tokens"][: count * g], rows["completion_mask"][: count * g]
    )
    out = []
    for i in range(count):
        first = i * g
        prompt, prompt_mask = rows["prompt_tokens"][first], rows["prompt_mask"][first]
        out.append(
            {
                "prompt_id": int(rows["prompt_id"][first]) % 2**31,
                "prompt": tokenizer.decode(prompt[np.asarray(prompt_mask, bool)].tolist()),
                "completions": texts[first : first + g],
                "rewards": np.asarray(rows["rewards"][first : first + g]).astype(float).tolist(),
            }
        )
    return out
