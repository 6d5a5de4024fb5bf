"""FreshPER replay of whole prompt groups in the driver (host side).

FreshPER (arXiv 2604.16918, `rljax.data.samplers.fresh_per`) replays stored rollouts with
priority (|r| + eps) * exp(-age / tau), so fresh, rewarding rollouts come back most often and
stale ones fade without any update. Group-relative algorithms need whole groups, so the items
here are prompt groups (interpretation):

- only informative groups are stored (rewards not all equal; an all-equal group has zero
  group-relative advantage and replaying it changes nothing);
- an item's r is its group's mean |reward|;
- every `every` steps, `groups` items are drawn with replacement and trained on as one more
  update after the fresh one. Their advantages are recomputed by the algorithm from the stored
  rewards; the PER importance weight of each item multiplies the per-token loss through
  `extras["is_weight"]` (with a mismatch correction configured, e.g. TIS, the stored sampler
  log-probs also correct for the policy having moved since).

The buffer is part of the checkpoint (`state`/`load`), so a resumed run replays exactly what a
straight run does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.core.state import TrainState
from rljax.data.row_buffer import RowBuffer
from rljax.data.samplers.fresh_per import FreshPERBuffer, FreshPERSettings
from rljax.train.collector import Collection, Collector
from rljax.train.host_batch import SAMPLE_FIELDS, HostBatch
from rljax.train.lockstep import gather_batch, own_batch
from rljax.train.scoring import informative_groups


class FreshReplay:
    """A FreshPER buffer of prompt groups and the replay batches drawn from it.

    Args:
      settings: FreshPER's settings (`capacity` counts groups).
      group_size: G, samples per group.
      groups: groups per replay batch (the fresh batch's prompt count keeps one shape).
      every: replay every this many steps.
      seed: with the step, seeds the sampling.
    """

    def __init__(
        self, settings: FreshPERSettings, group_size: int, groups: int, every: int, seed: int
    ):
        if groups < 1 or every < 1:
            raise ValueError(f"replay groups={groups} and every={every} must be >= 1")
        self.group_size, self.groups, self.every = group_size, groups, every
        self.buffer = FreshPERBuffer(settings, seed)
        self.rows = RowBuffer(settings.capacity)

    def __len__(self) -> int:
        return len(self.buffer)

    def add(self, step: int, batch: HostBatch) -> None:
        """Stores the informative groups of a fresh `batch` (G = group_size) at `step`."""
        if batch.group_size != self.group_size:
            raise ValueError(f"batch of groups of {batch.group_size}, replay of {self.group_size}")
        keep = informative_groups(np.asarray(batch.rows["rewards"], np.float64), self.group_size)
        if not keep.any():
            return
        grouped = batch.take_groups(keep).grouped()
        stored = {k: grouped[k] for k in SAMPLE_FIELDS}
        stored["prompt_id"] = grouped["prompt_id"][:, 0]  # one per group
        self.rows.add(stored)
        priority = np.abs(stored["rewards"].astype(np.float64)).mean(axis=1)
        self.buffer.add(step, stored["prompt_id"], priority)

    def batch(self, step: int) -> tuple[HostBatch | None, dict[str, float]]:
        """The replay batch at `step` (None off the `every` schedule or while empty) and its
        metrics: "replay/buffer" (groups held), "replay/age_mean" (steps since the drawn groups
        were stored) and "replay/is_weight_mean"."""
        metrics = {"replay/buffer": float(len(self))}
        if step % self.every or not len(self):
            return None, metrics
        slots, _, weights = self.buffer.sample(step, self.groups)
        g = self.group_size
        groups = {k: v[slots] for k, v in self.rows.rows.items()}
        groups["prompt_id"] = np.repeat(groups["prompt_id"][:, None], g, axis=1)
        t = groups["completion_tokens"].shape[-1]
        is_weight = np.repeat(weights, g)[:, None] * np.ones((len(weights) * g, t))
        batch = HostBatch.from_groups(groups, g).with_rows(is_weight=is_weight)
        metrics["replay/age_mean"] = float((step - self.buffer.stored_steps[slots]).mean())
        metrics["replay/is_weight_mean"] = float(weights.mean())
        return batch, metrics

    def state(self) -> dict[str, Any]:
        """The buffer and its groups, for the checkpoint."""
        return {"buffer": self.buffer.state(), "rows": self.rows.state()}

    def load(self, state: dict[str, Any]) -> None:
        """Restores the replay saved by `state`."""
        self.buffer.load(state.get("buffer", {}))
        self.rows.load(state.get("rows", {}))


class ReplayCollector:
    """A collector whose fresh batch also feeds a FreshPER replay of prompt groups.

    Each step: the inner collector's batches, then (on the replay's schedule) one replayed
    batch of groups stored at earlier steps; the fresh batch's informative groups go in after.
    With several processes the buffer holds every process's groups, equal everywhere, and
    each process replays its block of the drawn batch.

    Args:
      inner: the collector of fresh batches (one per step).
      replay: the FreshPER buffer and its schedule.
    """

    def __init__(self, inner: Collector, replay: FreshReplay):
        self.inner = inner
        self.replay = replay

    def collect(self, state: TrainState, step: int) -> Collection:
        fresh, replayed, metrics = self.inner.collect(state, step)
        batch, replay_metrics = self.replay.batch(step)
        for rows in fresh:  # every process stores every process's groups: one equal buffer
            self.replay.add(step, gather_batch(rows))
        mine = [] if batch is None else [own_batch(batch)]  # ... and replays its block
        return Collection(fresh, [*replayed, *mine], {**metrics, **replay_metrics})

    def state(self) -> dict[str, Any]:
        return {**self.inner.state(), "replay": self.replay.state()}

    def load(self, state: dict[str, Any]) -> None:
        self.inner.load(state)
        self.replay.load(state["replay"])
