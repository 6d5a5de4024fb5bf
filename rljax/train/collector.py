"""Collectors: how a step turns prompts into the batches the trainer learns from.

  Collector.collect(state, step) -> Collection(fresh, replay, metrics)
  Collector.state() / load(state)                     (host state, part of every checkpoint)

`GroupCollector` draws prompt batches through a `Draw` (rollout + rewards, with hooks such as
a prompt selector's feedback, LoPE's rescue or ReMax's greedy baseline: `rljax.train.draws`)
and, with DAPO's dynamic sampling, draws again until the batch holds informative groups.
Wrappers add what a method needs on top (FreshPER replay: `rljax.train.fresh_replay`); UEC-RL
has its own collector (`rljax.train.uec`). The driver only learns each batch it is handed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from rljax.advantages.reward_components import REWARD_COMPONENTS
from rljax.core.state import TrainState
from rljax.parallel.distributed import allgather
from rljax.train.host_batch import HostBatch
from rljax.train.scoring import informative_groups, rollout_metrics
from rljax.train.staleness import Policies, SamplerPolicy


class Drawn(NamedTuple):
    """One drawn prompt batch: its prompts (as the data pipeline gives them), its scored
    rollouts and host metrics (summed over the draws of a step)."""

    prompts: dict[str, np.ndarray]
    rows: HostBatch
    metrics: dict[str, float]


class Draw(Protocol):
    """Draws one prompt batch, samples and scores it; `attempt` salts refill draws."""

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn: ...

    def step_metrics(self) -> dict[str, float]:
        """Metrics reported once per step (e.g. a prompt selector's statistics)."""
        ...


class Collection(NamedTuple):
    """What one step learns from: fresh batches (each one update, metrics averaged), replayed
    batches (metrics under "replay/"), and host metrics."""

    fresh: list[HostBatch]
    replay: list[HostBatch]
    metrics: dict[str, float]


class Collector(Protocol):
    """Turns a step's prompts into batches; its host state is checkpointed."""

    def collect(self, state: TrainState, step: int) -> Collection: ...

    def state(self) -> dict[str, Any]:
        """Host state to checkpoint ({}: none)."""
        ...

    def load(self, state: dict[str, Any]) -> None: ...


def refill(
    draw: Callable[[int], Drawn], max_refill_rounds: int, group_size: int
) -> tuple[HostBatch, dict[str, float]]:
    """A batch of informative groups: DAPO's dynamic sampling with refill.

    "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476):
    groups whose rewards are all equal carry no signal, so more prompt batches are drawn until
    the batch holds as many informative groups as one draw has prompts (at most
    `max_refill_rounds` extra draws; if still short, all-equal groups fill the rest and the
    dynamic-sampling transform masks them out). 0 rounds keeps the first draw as it is.

    With several processes each draws its own rows, and whether to draw again is decided on
    the counts of all of them (one small allgather per round), so every process calls the
    rollout as often as the others; each then fills its rows from its own draws (a process
    short of informative groups takes all-equal ones even when another has spare).

    Args:
      draw: `attempt -> Drawn` (attempt 0 is the step's first draw).
      max_refill_rounds: extra draws allowed (>= 0).
      group_size: G.

    Returns:
      The batch and the draws' metrics summed, plus with refill "refill/rounds",
      "refill/informative_frac" (of the first draw) and "refill/short_groups".
    """
    if max_refill_rounds < 0:
        raise ValueError(f"max_refill_rounds={max_refill_rounds} must be >= 0")
    kept: list[HostBatch] = []
    spare: list[HostBatch] = []
    metrics: dict[str, float] = {}
    wanted = 0
    for attempt in range(max_refill_rounds + 1):
        drawn = draw(attempt)
        for k, v in drawn.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v
        rows = drawn.rows
        wanted = rows.num_groups
        if max_refill_rounds == 0:
            return rows, metrics
        good = informative_groups(
            rows.rows.get(REWARD_COMPONENTS, rows.rows["rewards"]), group_size
        )
        if attempt == 0:
            metrics["refill/informative_frac"] = float(good.mean())
        kept.append(rows.take_groups(good))
        spare.append(rows.take_groups(~good))
        metrics["refill/rounds"] = float(attempt)
        have = allgather(np.asarray([[sum(k.num_groups for k in kept), wanted]])).sum(0)
        if have[0] >= have[1]:  # every process's informative groups against all it wants
            break
    batch = HostBatch.concat(kept)
    short = wanted - batch.num_groups
    if short > 0:
        batch = HostBatch.concat([batch, *spare])
    metrics["refill/short_groups"] = float(max(short, 0))
    return batch.take_groups(np.arange(wanted)), metrics


class GroupCollector:
    """G samples for each of a batch of prompts, one update per step (GRPO and its kin).

    Args:
      draw: draws and scores one prompt batch (`rljax.train.draws`).
      group_size: G, samples per prompt.
      policy: which parameters sample (bounded staleness, the sampler's devices).
      max_refill_rounds: DAPO's extra draws (0: off).
      component_names: the names of the K reward components the draw keeps
        ("reward_components" [B, K]), each logged as "reward/<name>" (its mean).
    """

    def __init__(
        self,
        draw: Draw,
        group_size: int,
        policy: SamplerPolicy | None = None,
        max_refill_rounds: int = 0,
        component_names: tuple[str, ...] = (),
    ):
        if max_refill_rounds < 0:
            raise ValueError(f"max_refill_rounds={max_refill_rounds} must be >= 0")
        self.draw = draw
        self.group_size = group_size
        self.policy = policy or SamplerPolicy()
        self.max_refill_rounds = max_refill_rounds
        self.component_names = component_names

    def collect(self, state: TrainState, step: int) -> Collection:
        """One batch of `G x prompts` rows: host metrics of the kept rows (reward, accuracy,
        lengths), reward-function failures, refill counts and the draw hooks' metrics."""
        policies, metrics = self.policy.for_step(state)
        collection = self.draw_batch(policies, step)
        batch = collection.fresh[0]
        if self.policy.stale.max_staleness:  # the sampler's policy version, per sample
            version = np.full(len(batch), int(state.step) - policies.lag, np.int32)
            batch = batch.with_rows(policy_version=version)
        return Collection([batch], [], {**metrics, **collection.metrics})

    def draw_batch(self, policies: Policies, step: int) -> Collection:
        """`collect`'s batch and metrics, sampled with `policies` (an overlapped run's sampler
        thread calls this with its own, `rljax.train.overlap`)."""
        draw = functools.partial(self.draw, policies, step)
        batch, drawn = refill(draw, self.max_refill_rounds, self.group_size)
        rows = batch.rows
        host = rollout_metrics(np.asarray(rows["rewards"]), np.asarray(rows["completion_mask"]))
        if self.component_names:
            means = np.asarray(rows[REWARD_COMPONENTS]).mean(axis=0)
            host.update({f"reward/{n}": float(m) for n, m in zip(self.component_names, means)})
        failures = {k: v for k, v in drawn.items() if k.startswith("reward/failures_")}
        others = {k: v for k, v in drawn.items() if k not in failures}
        host = {**others, **host, **failures}
        if jax.process_count() > 1:  # this process's rows -> statistics of the whole batch
            host = global_host_metrics(host, batch)
        return Collection([batch], [], {**host, **self.draw.step_metrics()})

    def state(self) -> dict[str, Any]:
        return {"sampler": self.policy.state()} if self.policy.stale.max_staleness else {}

    def load(self, state: dict[str, Any]) -> None:
        if self.policy.stale.max_staleness:
            self.policy.load(state["sampler"])


def global_host_metrics(local: dict[str, float], batch: HostBatch) -> dict[str, float]:
    """Host metrics of the whole batch from every process's rows: reward/accuracy/length
    statistics recomputed over all rows, counts (reward failures, refill's short groups)
    summed, the rest averaged."""
    keys = sorted(local)
    values = allgather(np.asarray([[float(local[k]) for k in keys]], np.float64))
    summed = lambda k: k.startswith("reward/failures_") or k == "refill/short_groups"  # noqa: E731
    out = {
        k: float(values[:, i].sum() if summed(k) else values[:, i].mean())
        for i, k in enumerate(keys)
    }
    rewards = allgather(np.asarray(batch.rows["rewards"]))
    out.update(rollout_metrics(rewards, allgather(np.asarray(batch.rows["completion_mask"]))))
    return out
