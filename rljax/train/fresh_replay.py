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

import jax.numpy as jnp
import numpy as np

from rljax.core.batch import Batch
from rljax.data.samplers.fresh_per import FreshPERBuffer, FreshPERSettings
from rljax.entropy.uec import RowBuffer
from rljax.train.collect import groups_to_batch, informative_groups


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

    def add(self, step: int, batch: Batch) -> None:
        """Stores the informative groups of a fresh `batch` (B/G contiguous groups) at `step`."""
        g = self.group_size
        rewards = np.asarray(batch.rewards, np.float64)
        keep = informative_groups(rewards, g)
        if not keep.any():
            return
        flat = {
            "prompt_tokens": batch.prompt_tokens,
            "prompt_mask": batch.prompt_mask,
            "completion_tokens": batch.completion_tokens,
            "completion_mask": batch.completion_mask,
            "rollout_logprobs": batch.rollout_logprobs,
            "rewards": batch.rewards,
            "prompt_id": batch.extras["prompt_id"],
        }
        grouped = {k: np.asarray(v).reshape(-1, g, *np.shape(v)[1:])[keep] for k, v in flat.items()}
        grouped["prompt_id"] = grouped["prompt_id"][:, 0]  # one per group, as the collector's
        self.rows.add(grouped)
        priority = np.abs(grouped["rewards"].astype(np.float64)).mean(axis=1)
        self.buffer.add(step, grouped["prompt_id"], priority)

    def batch(self, step: int) -> tuple[Batch | None, dict[str, float]]:
        """The replay batch at `step` (None off the `every` schedule or while empty) and its
        metrics: "replay/buffer" (groups held), "replay/age_mean" (steps since the drawn groups
        were stored) and "replay/is_weight_mean"."""
        metrics = {"replay/buffer": float(len(self))}
        if step % self.every or not len(self):
            return None, metrics
        slots, _, weights = self.buffer.sample(step, self.groups)
        rows = {k: v[slots] for k, v in self.rows.rows.items()}
        batch = groups_to_batch(rows, self.group_size)
        is_weight = np.repeat(weights, self.group_size)[:, None] * np.ones(batch.loss_weights.shape)
        batch = batch.replace(
            extras={**batch.extras, "is_weight": jnp.asarray(is_weight, jnp.float32)}
        )
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
