"""The UEC-RL collector: hard-prompt exploration, a batch buffer and replay (host side).

One call of `UECCollector.collect` is one generation round of UEC-RL ("Unified Entropy Control
for Reinforcement Learning", arXiv 2604.14646; rules in `rljax.entropy.uec`): sample
`n_samples` per prompt, give the hard prompts extra samples at a higher temperature, keep the
samples whose advantage clears the thresholds, and return the full batches now in the batch
buffer (often one, sometimes none or two), plus the replay update's batches every
`replay_every` steps. The buffers are part of the checkpoint (`state`/`load`),
so a resumed run continues exactly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.group import grpo_advantages
from rljax.core.state import TrainState
from rljax.data.row_buffer import RowBuffer, Rows
from rljax.data.tasks import Task
from rljax.entropy.uec import UECSettings, hard_prompts, keep_samples, truncated_rows
from rljax.models.tokenizer import Tokenizer
from rljax.rewards import score_completions
from rljax.rollout.sampler import Rollout
from rljax.train.collector import Collection
from rljax.train.host_batch import HostBatch
from rljax.train.lockstep import own_batch
from rljax.train.scoring import Scorer, rollout_metrics, score_rollout
from rljax.train.timing import add_time, timed

# (state, prompt_tokens [N, P], prompt_mask [N, P], attempt) -> Rollout of N * samples rows.
RolloutFn = Callable[[TrainState, jax.Array, jax.Array, int], Rollout]


def bucket_size(n: int, multiple: int, limit: int) -> int:
    """How many prompts to explore for n hard ones: the next power of two >= n, rounded up to
    a multiple of `multiple` (the mesh's batch split), at most `limit`. Few distinct shapes
    means few compilations."""
    size = max(1 << max(n - 1, 0).bit_length(), multiple)
    return min(-(-size // multiple) * multiple, limit)


class UECCollector:
    """Collects UEC-RL batches of exactly `batch_rows` samples (a `Collector`).

    Args:
      settings: UEC-RL's thresholds and buffer sizes.
      data: prompt batches, whole: with several processes every process reads, samples and
        buffers every row (the same choices everywhere), and learns from its block of each
        batch (`rljax.train.lockstep`).
      rollout: the sampler with `n_samples` per prompt at the run's temperature, over prompts
        every process holds whole (`rljax.train.lockstep.shared_rollout`).
      explore_rollout: the same with `explore_samples` per prompt at `explore_temperature`.
      task: scores completions.
      tokenizer: decodes completions; its EOS id marks untruncated completions.
      n_samples: G, ordinary samples per prompt (EFRame: 5).
      batch_rows: rows per update batch (prompts_per_step * n_samples).
      seed: seeds the replay sampling (with the step).
      prompt_multiple: the number of explored prompts is padded to a multiple of this (the
        devices the rollout's rows are split over).
      scorer: how the task's reward is run over completions (`rljax.train.scoring.Scorer`).
    """

    def __init__(
        self,
        settings: UECSettings,
        data: Iterator[dict[str, Any]],
        rollout: RolloutFn,
        explore_rollout: RolloutFn,
        task: Task,
        tokenizer: Tokenizer,
        n_samples: int,
        batch_rows: int,
        seed: int,
        prompt_multiple: int = 1,
        scorer: Scorer = score_completions,
    ):
        self.settings = settings
        self.data = data
        self.rollout = rollout
        self.explore_rollout = explore_rollout
        self.task = task
        self.tokenizer = tokenizer
        self.n_samples = n_samples
        self.batch_rows = batch_rows
        self.seed = seed
        self.prompt_multiple = prompt_multiple
        self.scorer = scorer
        self.batch_buffer = RowBuffer(2 * batch_rows)
        self.replay_buffer = RowBuffer(int(settings.replay_capacity * batch_rows))

    def _sample(
        self, rollout: Callable[..., Rollout], prompts: dict, samples: int, times: dict
    ) -> tuple[Rows, dict[str, int]]:
        """Rows of `samples` completions per prompt with their GRPO advantages; the sampling
        and scoring seconds are added to `times`."""
        out, seconds = timed(rollout, prompts["prompt_tokens"], prompts["prompt_mask"])
        add_time(times, "time/rollout_s", seconds)
        start = time.perf_counter()
        rewards, failures = score_rollout(
            self.task,
            self.tokenizer,
            prompts,
            out.completion_tokens,
            out.completion_mask,
            samples,
            self.scorer,
        )
        advantages = np.asarray(grpo_advantages(jnp.asarray(rewards), samples), np.float32)
        rows = HostBatch.from_rollout(out, prompts["index"], rewards, samples).rows
        add_time(times, "time/reward_s", time.perf_counter() - start)
        return {**rows, "sequence_advantage": advantages}, failures

    def _kept(self, rows: Rows, threshold: float) -> tuple[Rows, np.ndarray]:
        truncated = truncated_rows(
            rows["completion_tokens"], rows["completion_mask"], self.tokenizer.eos_id
        )
        keep = keep_samples(
            rows["sequence_advantage"],
            truncated,
            threshold,
            self.settings.drop_truncated_positive,
        )
        positive = rows["sequence_advantage"] > threshold
        dropped = truncated & positive & self.settings.drop_truncated_positive
        return {k: v[keep] for k, v in rows.items()}, dropped

    def collect(self, state: TrainState, step: int) -> Collection:
        """One generation round with `state`'s policy: the full batches popped from the batch
        buffer (their high-|A| samples also enter the replay buffer), the replay update's
        batches on its schedule, and metrics: the ordinary samples' reward/accuracy/length
        statistics (comparable to other algorithms') and "uec/..." counts.

        The step salts the rollouts' keys (a step without an update keeps `state.step`).
        """
        rollout = functools.partial(self.rollout, state, attempt=2 * step)
        explore_rollout = functools.partial(self.explore_rollout, state, attempt=2 * step + 1)
        s, g = self.settings, self.n_samples
        prompts = next(self.data)
        times: dict[str, float] = {}
        rows, failures = self._sample(rollout, prompts, g, times)
        metrics = rollout_metrics(rows["rewards"], rows["completion_mask"])
        metrics.update({f"reward/failures_{k}": float(v) for k, v in failures.items()})
        hard = hard_prompts(rows["rewards"], g, s.hard_reward_threshold)
        kept, dropped = self._kept(rows, s.keep_threshold)
        metrics["uec/hard_frac"] = float(hard.mean())
        metrics["uec/kept_frac"] = len(kept["rewards"]) / len(rows["rewards"])
        self.batch_buffer.add(kept)
        explored = 0
        if hard.any():
            ids = np.flatnonzero(hard)
            n_prompts = len(hard)
            padded = np.resize(
                ids, bucket_size(len(ids), self.prompt_multiple, n_prompts)
            )  # repeats ids to fill
            extra, _ = self._sample(
                explore_rollout,
                {k: np.asarray(v)[padded] for k, v in prompts.items()},
                s.explore_samples,
                times,
            )
            real = np.repeat(np.arange(len(padded)) < len(ids), s.explore_samples)
            extra = {k: v[real] for k, v in extra.items()}
            metrics["uec/explore_accuracy"] = float((extra["rewards"] >= 1.0).mean())
            extra_kept, extra_dropped = self._kept(extra, s.explore_keep_threshold)
            dropped = np.concatenate([dropped, extra_dropped])
            explored = len(extra_kept["rewards"])
            self.batch_buffer.add(extra_kept)
        metrics["uec/explore_kept"] = float(explored)
        metrics["uec/truncated_positive_dropped"] = float(dropped.sum())
        batches = []
        while len(self.batch_buffer) >= self.batch_rows:
            ready = self.batch_buffer.pop(self.batch_rows)
            high = np.abs(ready["sequence_advantage"]) > s.replay_threshold
            self.replay_buffer.add({k: v[high] for k, v in ready.items()})
            batches.append(rows_to_batch(ready))
        metrics["uec/updates"] = float(len(batches))
        metrics["uec/batch_buffer"] = float(len(self.batch_buffer))
        metrics["uec/replay_buffer"] = float(len(self.replay_buffer))
        replays = self.replay_batches(step)
        metrics["uec/replay_updates"] = float(len(replays))
        return Collection(
            [own_batch(b) for b in batches], [own_batch(b) for b in replays], {**metrics, **times}
        )

    def replay_batches(self, step: int) -> list[HostBatch]:
        """The replay update's batches at `step` (every `replay_every` steps, else none).

        As in EFRame: a full buffer is replayed whole; otherwise as many whole batches as it
        holds are drawn from it without replacement.
        """
        buffer, b = self.replay_buffer, self.batch_rows
        if step % self.settings.replay_every or len(buffer) < b:
            return []
        n = (len(buffer) // b) * b
        if len(buffer) == buffer.capacity:
            rows = {k: v[:n] for k, v in buffer.rows.items()}
        else:
            rows = buffer.sample(n, np.random.default_rng((self.seed, step)))
        return [rows_to_batch({k: v[i : i + b] for k, v in rows.items()}) for i in range(0, n, b)]

    def state(self) -> dict[str, Any]:
        """Both buffers, for the checkpoint."""
        return {"batch": self.batch_buffer.state(), "replay": self.replay_buffer.state()}

    def load(self, state: dict[str, Any]) -> None:
        """Restores the buffers saved by `state`."""
        self.batch_buffer.load(state.get("batch", {}))
        self.replay_buffer.load(state.get("replay", {}))


def rows_to_batch(rows: Rows) -> HostBatch:
    """UEC sample rows as a HostBatch; each row is its own group (advantages come from the
    host, in "sequence_advantage")."""
    return HostBatch(dict(rows), 1)
