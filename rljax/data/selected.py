"""Prompt batches chosen by a prompt selector (HeaPA, DARE, a curriculum) from a fixed pool,
with resumable state.

The default pipeline (`prompt_batches`) walks a shuffled split. A selector instead picks each
batch from a pool of prompts using what the rollouts said about them: `SelectedPromptBatches`
asks the selector for `batch_size` pool positions, reads those examples from the (unshuffled)
`prompt_dataset`, and after the rollout is scored takes the rewards (and the rollouts) back
through `feedback`.
Its `get_state()` is JSON, so the selector's state goes into the checkpoint with the data
iterator's and a resumed run selects exactly what a straight run does.

Selectors (`rljax.data.samplers`) work on pool positions 0..N-1 of this host's shard; every
batch carries them as "position" next to the task "index".
"""

from __future__ import annotations

from typing import Any, Protocol

import grain
import numpy as np

from rljax.data.row_buffer import RowBuffer, Rows
from rljax.data.samplers.curriculum import AccuracyCurriculum, CurriculumSettings
from rljax.data.samplers.dare import DARESelector, DARESettings
from rljax.data.samplers.heapa import HeaPAPool, HeaPASettings
from rljax.rollout.rescore import ROLLOUT_KEYS, LogprobsFn, rescore


class PromptSelector(Protocol):
    """What `SelectedPromptBatches` needs from a selector."""

    def select(self, step: int, k: int) -> np.ndarray:
        """[k] pool positions for batch number `step`."""
        ...

    def feedback(self, positions: np.ndarray, rewards: np.ndarray, rollouts: Rows) -> None:
        """Scores of the selected prompts: rewards [k, G] of their G samples, and the samples
        themselves (`rollouts`: [k * G] rows of `ROLLOUT_KEYS`, grouped by prompt)."""
        ...

    def metrics(self) -> dict[str, float]:
        """What to log about the selector after a step."""
        ...

    def state(self) -> dict[str, Any]: ...

    def load(self, state: dict[str, Any]) -> None: ...


class HeaPASelector:
    """HeaPA (arXiv 2601.22448) as a prompt selector: every pool position starts cold (so each
    prompt is scored once first), then batches come from the reward-median boundary; a selected
    prompt returns to the pool with its group's mean reward."""

    def __init__(self, pool_size: int, seed: int, low_fraction: float = 0.5):
        self.pool = HeaPAPool(HeaPASettings(capacity=pool_size, low_fraction=low_fraction), seed)
        self.pool.add(np.arange(pool_size))

    def select(self, step: int, k: int) -> np.ndarray:
        ids = self.pool.select(step, k)
        if len(ids) < k:
            raise ValueError(
                f"the HeaPA pool holds {len(ids)} prompts, fewer than a batch of {k}; raise "
                "prompt_selection.pool_size"
            )
        return ids

    def feedback(self, positions: np.ndarray, rewards: np.ndarray, rollouts: Rows) -> None:
        del rollouts
        self.pool.add(positions, np.asarray(rewards, np.float64).mean(axis=1))

    def metrics(self) -> dict[str, float]:
        """ "selection/cold": prompts not scored yet; "selection/boundary": the reward at the
        median boundary (mean of the low maximum and the high minimum; NaN before any score)."""
        low, high = self.pool.low.peek_max(), self.pool.high.peek_min()
        tops = [e[0] for e in (low, high) if e is not None]
        return {
            "selection/cold": float(len(self.pool.cold)),
            "selection/boundary": float(np.mean(tops)) if tops else float("nan"),
        }

    def state(self) -> dict[str, Any]:
        return self.pool.state()

    def load(self, state: dict[str, Any]) -> None:
        self.pool.load(state)


class CurriculumSelector:
    """The accuracy-gated curriculum (`rljax.data.samplers.curriculum`) as a prompt selector.

    Levels are the ranks of the pool prompts' difficulties (`difficulties`, e.g. from the
    task's `difficulty(index, split)`): the easiest difficulty is level 0. A prompt's accuracy
    is the share of its samples with reward >= 1.
    """

    def __init__(self, difficulties, seed: int, settings: CurriculumSettings):
        values = np.asarray(difficulties)
        levels = np.searchsorted(np.unique(values), values)
        self.curriculum = AccuracyCurriculum(settings, levels, seed)

    def select(self, step: int, k: int) -> np.ndarray:
        return self.curriculum.select(step, k)

    def feedback(self, positions: np.ndarray, rewards: np.ndarray, rollouts: Rows) -> None:
        del rollouts
        self.curriculum.update(positions, (np.asarray(rewards) >= 1.0).mean(axis=1))

    def metrics(self) -> dict[str, float]:
        """ "selection/frontier": the level being learned; "selection/frontier_accuracy": its
        accuracy EMA."""
        c = self.curriculum
        return {
            "selection/frontier": float(c.frontier),
            "selection/frontier_accuracy": float(c.ema[c.frontier]),
        }

    def state(self) -> dict[str, Any]:
        return self.curriculum.state()

    def load(self, state: dict[str, Any]) -> None:
        self.curriculum.load(state)


class DAREPromptSelector:
    """DARE (arXiv 2605.09188) as a prompt selector: the success rate of every pool prompt
    under the CURRENT policy is estimated by self-normalised importance sampling over a FIFO
    replay of earlier rollouts, and prompts near rate 0.5 are drawn most
    (`rljax.data.samplers.dare`).

    Both log-prob sums of a record come from the trainer's model (`set_policy`): the
    behaviour sum when the rollout is fed back, with the parameters that sampled it (older
    ones under bounded staleness), the current sum at every `select`, so a fresh record of a
    synchronous run has weight exactly 1 whatever the sampler's temperature or weight format.
    The replay keeps the rollouts' tokens for that rescoring; its cost is one teacher-forced
    pass over `capacity` rollouts per step.

    Not used here (interpretation): DARE's per-tier rollout counts; every prompt gets the
    run's G samples, so batch shapes stay fixed.

    Args:
      pool_size: prompts in the pool (prompt ids are pool positions).
      seed: with the step, seeds the sampling.
      settings: DARE's settings (`capacity` counts rollouts).
      chunk_rows: rows per rescoring call (e.g. the rollout batch's row count).
    """

    def __init__(self, pool_size: int, seed: int, settings: DARESettings, chunk_rows: int):
        self.dare = DARESelector(settings, pool_size, seed)
        self.rollouts = RowBuffer(settings.capacity)
        self.chunk_rows = int(chunk_rows)
        self.policy: LogprobsFn | None = None
        self.behaviour: LogprobsFn | None = None
        self.rates = np.full(pool_size, settings.default_rate)

    def set_policy(self, logprobs: LogprobsFn, behaviour: LogprobsFn | None = None) -> None:
        """The current policy's log-prob function, and the sampler's (None: the same); set
        before each step's `select`."""
        self.policy = logprobs
        self.behaviour = logprobs if behaviour is None else behaviour

    def _sums(self, rows: Rows, policy: LogprobsFn | None) -> np.ndarray:
        if policy is None:
            raise ValueError("DAREPromptSelector needs set_policy(...) before scoring rollouts")
        return rescore(policy, rows, self.chunk_rows).sum(axis=1)

    def select(self, step: int, k: int) -> np.ndarray:
        if len(self.dare):
            self.rates = self.dare.estimate(self._sums(self.rollouts.rows, self.policy))
        return self.dare.select(step, k, self.rates)

    def feedback(self, positions: np.ndarray, rewards: np.ndarray, rollouts: Rows) -> None:
        rewards = np.asarray(rewards, np.float64)
        rows = {key: np.asarray(rollouts[key]) for key in ROLLOUT_KEYS}
        ids = np.repeat(np.asarray(positions, np.int64), rewards.shape[1])
        self.dare.add(ids, self._sums(rows, self.behaviour), rewards.reshape(-1))
        self.rollouts.add(rows)

    def metrics(self) -> dict[str, float]:
        """ "selection/rate_mean": the mean estimated success rate over the pool (at the last
        `select`); "selection/seen_frac": share of pool prompts with a record in the replay;
        "selection/replay": records in the replay."""
        seen = np.unique(self.dare.records()["prompt_id"])
        return {
            "selection/rate_mean": float(self.rates.mean()),
            "selection/seen_frac": len(seen) / len(self.rates),
            "selection/replay": float(len(self.dare)),
        }

    def state(self) -> dict[str, Any]:
        return {
            "replay": self.dare.state(),
            "rollouts": self.rollouts.state(),
            "rates": self.rates.copy(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.dare.load(state.get("replay", {}))
        self.rollouts.load(state.get("rollouts", {}))
        self.rates = np.asarray(state["rates"], np.float64)


def _to_json(tree):
    """numpy arrays and scalars -> lists and Python numbers (exact for float64 and ints)."""
    if isinstance(tree, dict):
        return {k: _to_json(v) for k, v in tree.items()}
    if isinstance(tree, np.ndarray):
        return {"__array__": tree.tolist(), "dtype": str(tree.dtype)}
    if isinstance(tree, np.generic):
        return tree.item()
    return tree


def _from_json(tree):
    if isinstance(tree, dict):
        if "__array__" in tree:
            return np.asarray(tree["__array__"], tree["dtype"])
        return {k: _from_json(v) for k, v in tree.items()}
    return tree


class SelectedPromptBatches:
    """An iterator of prompt batches whose prompts a `PromptSelector` picks.

    Args:
      dataset: the pool, e.g. `prompt_dataset(task, "train", ..., seed=None,
        num_examples=pool_size)`; position i is `dataset[i]`.
      selector: picks positions and takes the rewards back.
      batch_size: prompts per batch.
    """

    def __init__(self, dataset: grain.MapDataset, selector: PromptSelector, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.dataset = dataset
        self.selector = selector
        self.batch_size = batch_size
        self.step = 0

    def __iter__(self) -> SelectedPromptBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        positions = self.selector.select(self.step, self.batch_size)
        self.step += 1
        rows = [self.dataset[int(i)] for i in positions]
        batch = {k: np.stack([row[k] for row in rows]) for k in rows[0]}
        batch["position"] = np.asarray(positions, np.int64)
        return batch

    def feedback(self, prompts: dict[str, np.ndarray], rewards: np.ndarray, rollouts: Rows) -> None:
        """Hands the rewards [n_prompts, G] and the rollouts of a batch from this iterator back."""
        self.selector.feedback(prompts["position"], rewards, rollouts)

    def set_policy(self, logprobs: LogprobsFn, behaviour: LogprobsFn | None = None) -> None:
        """Gives a selector that rescores rollouts (DARE) the current policy and the sampler's
        (None: the same); others ignore them."""
        if hasattr(self.selector, "set_policy"):
            self.selector.set_policy(logprobs, behaviour)

    def metrics(self) -> dict[str, float]:
        return self.selector.metrics()

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable state: the batch counter and the selector's state."""
        return {"step": self.step, "selector": _to_json(self.selector.state())}

    def set_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.selector.load(_from_json(state["selector"]))
