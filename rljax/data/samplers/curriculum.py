"""An accuracy-gated easy-to-hard curriculum over prompt difficulty levels (host side).

Prompts carry a difficulty level 0..L-1 (0 easiest). The curriculum has a frontier level f,
starting at 0. Each selected prompt's level is drawn from

  P(level = f) = 1 - review           (all of it when f = 0)
  P(level = j) = review / f           for each j < f (revisiting mastered levels)
  P(level = j) = 0                    for j > f

and the prompt uniformly among that level's prompts. After each update, the accuracy EMA of
every level seen in the batch moves towards the batch's mean accuracy on it,
ema <- decay * ema + (1 - decay) * acc (starting from 0), and the frontier advances by one when
the frontier level's EMA reaches `threshold` after at least `min_updates` updates of that level.
This is our own simple rule (no paper): a threshold on a running accuracy, so the data move from
easy to hard as fast as the policy masters them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class CurriculumSettings:
    """The curriculum's settings.

    Attributes:
      threshold: the frontier's accuracy EMA at which the next level unlocks.
      decay: the EMA's decay per update (its memory is about 1 / (1 - decay) updates).
      review: the share of prompts drawn from levels below the frontier.
      min_updates: updates of the frontier level before it may advance.
    """

    threshold: float = 0.7
    decay: float = 0.9
    review: float = 0.2
    min_updates: int = 5

    def __post_init__(self):
        if not 0 < self.threshold <= 1:
            raise ValueError(f"curriculum threshold={self.threshold} must be in (0, 1]")
        if not 0 <= self.decay < 1:
            raise ValueError(f"curriculum decay={self.decay} must be in [0, 1)")
        if not 0 <= self.review < 1:
            raise ValueError(f"curriculum review={self.review} must be in [0, 1)")
        if self.min_updates < 1:
            raise ValueError(f"curriculum min_updates={self.min_updates} must be >= 1")


def level_probs(frontier: int, num_levels: int, review: float) -> np.ndarray:
    """[L] the level distribution for a frontier level (see the module docstring)."""
    p = np.zeros(num_levels)
    if frontier == 0:
        p[0] = 1.0
    else:
        p[:frontier] = review / frontier
        p[frontier] = 1.0 - review
    return p


class AccuracyCurriculum:
    """Samples prompts by level and advances the frontier by accuracy; checkpointable.

    Args:
      settings: threshold, EMA decay, review share and minimum updates.
      prompt_levels: [P] int level of each prompt (levels 0..L-1, each with at least one prompt).
      seed: with the step, seeds the sampling.
    """

    def __init__(self, settings: CurriculumSettings, prompt_levels, seed: int):
        levels = np.asarray(prompt_levels, np.int64)
        if levels.ndim != 1 or levels.size == 0 or levels.min() < 0:
            raise ValueError("prompt_levels must be a non-empty [P] vector of levels >= 0")
        self.num_levels = int(levels.max()) + 1
        counts = np.bincount(levels, minlength=self.num_levels)
        if np.any(counts == 0):
            raise ValueError(f"levels {np.flatnonzero(counts == 0).tolist()} have no prompts")
        self.settings = settings
        self.prompt_levels = levels
        self.seed = int(seed)
        self._members = [np.flatnonzero(levels == j) for j in range(self.num_levels)]
        self.frontier = 0
        self.ema = np.zeros(self.num_levels)
        self.updates = np.zeros(self.num_levels, np.int64)

    def probs(self) -> np.ndarray:
        """[L] the current level distribution."""
        return level_probs(self.frontier, self.num_levels, self.settings.review)

    def select(self, step: int, k: int) -> np.ndarray:
        """[k] prompt ids: levels drawn from `probs()`, prompts uniformly within a level."""
        rng = np.random.default_rng((self.seed, step))
        drawn = rng.choice(self.num_levels, size=k, p=self.probs())
        return np.asarray([self._members[j][rng.integers(len(self._members[j]))] for j in drawn])

    def update(self, prompt_ids, accuracies) -> None:
        """Feeds back [k] accuracies in [0, 1] (e.g. a group's mean correctness) of `prompt_ids`.

        Each level seen gets one EMA step with its mean accuracy over the batch; then the
        frontier advances at most one level.
        """
        ids = np.asarray(prompt_ids, np.int64).reshape(-1)
        acc = np.asarray(accuracies, np.float64).reshape(-1)
        if ids.shape != acc.shape:
            raise ValueError(f"prompt_ids {ids.shape} and accuracies {acc.shape} must match")
        s = self.settings
        levels = self.prompt_levels[ids]
        for j in np.unique(levels):
            mean = acc[levels == j].mean()
            self.ema[j] = s.decay * self.ema[j] + (1.0 - s.decay) * mean
            self.updates[j] += 1
        f = self.frontier
        if (
            f + 1 < self.num_levels
            and self.updates[f] >= s.min_updates
            and self.ema[f] >= s.threshold
        ):
            self.frontier = f + 1

    def state(self) -> dict[str, Any]:
        """Frontier, EMAs and update counts for a checkpoint."""
        return {"frontier": self.frontier, "ema": self.ema.copy(), "updates": self.updates.copy()}

    def load(self, state: dict[str, Any]) -> None:
        """Restores the state saved by `state`."""
        ema = np.asarray(state["ema"], np.float64)
        if ema.shape != (self.num_levels,):
            raise ValueError(
                f"saved curriculum has {ema.shape[0]} levels, this one {self.num_levels}"
            )
        self.frontier = int(state["frontier"])
        self.ema = ema.copy()
        self.updates = np.asarray(state["updates"], np.int64).copy()
