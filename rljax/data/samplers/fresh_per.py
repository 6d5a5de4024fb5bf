"""FreshPER: prioritised experience replay whose priorities decay with the sample's age (host side).

FreshPER (arXiv 2604.16918; authors' code Vision-CAIR/Freshness-Aware-PER,
`roll/agentic/replay_buffer/priority_functions.py`, `reward_fresh_priority`) replays stored
rollouts with

  p_i = (|r_i| + 1e-6) * exp(-age_i / tau),  age_i = max(0, step - stored_step_i)
  P(i) = p_i^alpha / sum_j p_j^alpha                                   (alpha = 0.6)
  w_i  = (N P(i))^-beta / max_j w_j                                    (beta: 0.4 -> 1)

so fresh (less off-policy) and high-|reward| rollouts are replayed more often; the ages are
recomputed from the step at every call, so priorities decay without any update. The freshness
factor halves every tau ln 2 steps. The max in w runs over the sampled batch (Schaul et al.
2016, Algorithm 1; interpretation: the spec does not say batch or buffer).

The buffer stores opaque item ids (the caller's rollout rows) with their reward and the step
they were stored at; `sample` draws buffer slots with replacement (standard PER).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class FreshPERSettings:
    """FreshPER's replay settings (defaults: the paper's).

    Attributes:
      capacity: the most items the FIFO buffer holds.
      tau: the age decay constant in steps (500; 1000 for FrozenLake).
      alpha: the priority exponent of the sampling distribution (0.6).
      beta_start: the IS exponent at step 0 (0.4).
      beta_end: the IS exponent once annealed (1.0).
      beta_steps: steps over which beta is annealed linearly from beta_start to beta_end.
      eps: added to |r| so zero-reward items keep a (freshness-only) priority (1e-6).
    """

    capacity: int = 10000
    tau: float = 500.0
    alpha: float = 0.6
    beta_start: float = 0.4
    beta_end: float = 1.0
    beta_steps: int = 1000
    eps: float = 1e-6

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"FreshPER capacity={self.capacity} must be >= 1")
        if self.tau <= 0:
            raise ValueError(f"FreshPER tau={self.tau} must be > 0 steps")
        if self.alpha < 0:
            raise ValueError(f"FreshPER alpha={self.alpha} must be >= 0")
        if self.beta_steps < 1:
            raise ValueError(f"FreshPER beta_steps={self.beta_steps} must be >= 1")
        if self.eps <= 0:
            raise ValueError(f"FreshPER eps={self.eps} must be > 0 so every priority is > 0")


def fresh_priority(rewards: np.ndarray, ages: np.ndarray, tau: float, eps: float = 1e-6):
    """[N] priorities (|r| + eps) * exp(-max(age, 0) / tau)."""
    ages = np.maximum(np.asarray(ages, np.float64), 0.0)
    return (np.abs(np.asarray(rewards, np.float64)) + eps) * np.exp(-ages / tau)


def sampling_probs(priorities: np.ndarray, alpha: float) -> np.ndarray:
    """[N] P(i) = p_i^alpha / sum_j p_j^alpha."""
    z = np.asarray(priorities, np.float64) ** alpha
    return z / z.sum()


def is_weights(probs: np.ndarray, num_items: int, beta: float) -> np.ndarray:
    """[B] IS weights (N P(i))^-beta of sampled items, divided by their maximum.

    Args:
      probs: [B] sampling probabilities of the sampled items.
      num_items: N, the number of items in the buffer.
      beta: the IS exponent.
    """
    w = (num_items * np.asarray(probs, np.float64)) ** (-beta)
    return w / w.max()


def beta_schedule(step: int, start: float = 0.4, end: float = 1.0, steps: int = 1000) -> float:
    """beta at `step`: linear from `start` (step 0) to `end` (step >= `steps`)."""
    frac = min(max(step, 0) / steps, 1.0)
    return start + (end - start) * frac


class FreshPERBuffer:
    """FreshPER's FIFO replay with freshness-decayed priorities and checkpointable state.

    Args:
      settings: FreshPER's settings.
      seed: with the step, seeds the sampling.
    """

    def __init__(self, settings: FreshPERSettings, seed: int):
        self.settings = settings
        self.seed = int(seed)
        self.item_ids = np.zeros(0, np.int64)
        self.rewards = np.zeros(0, np.float64)
        self.stored_steps = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.item_ids)

    def add(self, step: int, item_ids, rewards) -> None:
        """Stores items ([M] ids and rewards) at `step`, dropping the oldest beyond capacity."""
        ids = np.asarray(item_ids, np.int64).reshape(-1)
        r = np.asarray(rewards, np.float64).reshape(-1)
        if ids.shape != r.shape:
            raise ValueError(f"item_ids {ids.shape} and rewards {r.shape} must match")
        cap = self.settings.capacity
        self.item_ids = np.concatenate([self.item_ids, ids])[-cap:]
        self.rewards = np.concatenate([self.rewards, r])[-cap:]
        self.stored_steps = np.concatenate([self.stored_steps, np.full(ids.shape, step, np.int64)])[
            -cap:
        ]

    def update(self, slots, rewards) -> None:
        """Sets new rewards for buffer `slots` (as returned by `sample`, before the next `add`);
        their stored step (age) is unchanged, as in the code's reward-only priority update."""
        self.rewards[np.asarray(slots, np.int64)] = np.asarray(rewards, np.float64)

    def probabilities(self, step: int) -> np.ndarray:
        """[N] sampling probabilities at `step`."""
        s = self.settings
        p = fresh_priority(self.rewards, step - self.stored_steps, s.tau, s.eps)
        return sampling_probs(p, s.alpha)

    def sample(self, step: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draws k slots with replacement from P at `step`.

        Returns:
          (slots [k] buffer positions, item_ids [k], weights [k] IS weights at beta(step)).
        """
        if len(self) == 0:
            raise ValueError("cannot sample from an empty FreshPER buffer; add items first")
        if k < 1:
            raise ValueError(f"k={k} must be >= 1")
        s = self.settings
        probs = self.probabilities(step)
        rng = np.random.default_rng((self.seed, step))
        slots = rng.choice(len(self), size=k, replace=True, p=probs)
        beta = beta_schedule(step, s.beta_start, s.beta_end, s.beta_steps)
        return slots, self.item_ids[slots], is_weights(probs[slots], len(self), beta)

    def state(self) -> dict[str, Any]:
        """The buffer for a checkpoint (an empty dict when the buffer is empty)."""
        if len(self) == 0:
            return {}
        return {
            "item_ids": self.item_ids.copy(),
            "rewards": self.rewards.copy(),
            "stored_steps": self.stored_steps.copy(),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Restores a buffer saved by `state`."""
        self.item_ids = np.asarray(state.get("item_ids", np.zeros(0)), np.int64)
        self.rewards = np.asarray(state.get("rewards", np.zeros(0)), np.float64)
        self.stored_steps = np.asarray(state.get("stored_steps", np.zeros(0)), np.int64)
