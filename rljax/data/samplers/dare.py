"""DARE: prompt selection by importance-sampled difficulty estimates over a replay (host side).

DARE (arXiv 2605.09188; authors' code EtaYang10th/DARE, `verl/trainer/ppo/is_data_selector.py`)
re-estimates each prompt's success rate under the CURRENT policy from old rollouts kept in a
FIFO replay, instead of rolling the prompt out again:

  log w_i = clip(sum_t log pi_cur(y_it) - log pi_beh(y_it), -C, C)     (one weight per rollout)
  s_hat_q = sum_i w_i 1[r_i > 0] / sum_i w_i, clamped to [0, 1]          (self-normalised IS)
  ESS_q   = (sum_i w_i)^2 / sum_i w_i^2; if ESS_q < 2 use the raw mean of 1[r_i > 0]

It then samples prompts without replacement from softmax((a - 1) log x + (b - 1) log(1 - x)),
a = b = 1 + kappa / 2 (a Beta(a, b) log-density, peaked at x = 0.5: prompts the policy solves
about half the time carry the most learning signal), and gives harder prompts more rollouts
(difficulty tiers by failure rate 1 - x).

The caller keeps the rollouts themselves (tokens) in the same FIFO order as `records()`, scores
them under the current policy, and passes the per-rollout log-prob sums to `estimate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class DARESettings:
    """DARE's estimator and sampler settings (defaults: the authors' code unless noted).

    Attributes:
      capacity: the most rollout records the FIFO replay holds.
      clip: C, log IS weights are clipped to [-C, C] (code default 5; the paper uses 4).
      ess_threshold: below this effective sample size the raw success rate is used (2).
      kappa: Beta concentration; a = b = 1 + kappa / 2 (code default 20; the paper uses 100).
      eps: estimated rates are clipped to [eps, 1 - eps] before taking logs, so prompts with
        rate exactly 0 or 1 get a finite (very low) logit instead of -inf and the softmax stays
        defined even when every prompt is solved or failed (interpretation; the code does not
        say how it handles log 0).
      default_rate: the rate of prompts without any record in the replay (0.5, the code's
        `default_label`: unseen prompts sit at the peak).
      d_easy: failure rate below which a prompt is easy (0.3).
      d_hard: failure rate above which a prompt is hard (0.8).
      tier_rollouts: rollouts per prompt for the (easy, medium, hard) tiers (4, 8, 16).
    """

    capacity: int = 4096
    clip: float = 5.0
    ess_threshold: float = 2.0
    kappa: float = 20.0
    eps: float = 1e-6
    default_rate: float = 0.5
    d_easy: float = 0.3
    d_hard: float = 0.8
    tier_rollouts: tuple[int, int, int] = (4, 8, 16)

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"DARE capacity={self.capacity} must be >= 1 rollout records")
        if self.clip <= 0:
            raise ValueError(f"DARE clip={self.clip} must be > 0")
        if self.kappa < 0:
            raise ValueError(f"DARE kappa={self.kappa} must be >= 0 (0 gives uniform sampling)")
        if not 0 < self.eps < 0.5:
            raise ValueError(f"DARE eps={self.eps} must be in (0, 0.5)")
        if not 0 <= self.d_easy <= self.d_hard <= 1:
            raise ValueError(
                f"DARE tiers need 0 <= d_easy <= d_hard <= 1, got d_easy={self.d_easy}, "
                f"d_hard={self.d_hard}"
            )
        if len(self.tier_rollouts) != 3 or min(self.tier_rollouts) < 1:
            raise ValueError(
                f"tier_rollouts={self.tier_rollouts} must be three positive counts "
                "(easy, medium, hard)"
            )


def snis_success(
    prompt_ids: np.ndarray,
    log_ratio_sums: np.ndarray,
    rewards: np.ndarray,
    num_prompts: int,
    clip: float = 5.0,
    ess_threshold: float = 2.0,
    default_rate: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt success rates under the current policy by self-normalised IS (DARE).

    Args:
      prompt_ids: [R] int prompt of each replayed rollout, in [0, num_prompts).
      log_ratio_sums: [R] sum over the rollout's tokens of log pi_cur - log pi_behaviour.
      rewards: [R] rollout rewards; a rollout succeeded when its reward is > 0.
      num_prompts: P, the dataset size.
      clip: log weights are clipped to [-clip, clip].
      ess_threshold: prompts whose ESS is below this get the raw mean success instead.
      default_rate: the rate of prompts without records.

    Returns:
      (rates [P] in [0, 1], ess [P]; 0 for prompts without records).
    """
    ids = np.asarray(prompt_ids, np.int64)
    log_w = np.clip(np.asarray(log_ratio_sums, np.float64), -clip, clip)
    success = (np.asarray(rewards) > 0).astype(np.float64)
    if not ids.shape == log_w.shape == success.shape or ids.ndim != 1:
        raise ValueError(
            f"prompt_ids {ids.shape}, log_ratio_sums {log_w.shape} and rewards {success.shape} "
            "must be equal [R] vectors"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= num_prompts):
        raise ValueError(f"prompt ids must lie in [0, {num_prompts}); got {ids.min()}..{ids.max()}")
    # Subtract each prompt's largest log weight: ESS and s_hat are scale-free, exp stays finite.
    top = np.full(num_prompts, -np.inf)
    np.maximum.at(top, ids, log_w)
    w = np.exp(log_w - top[ids])
    count = np.bincount(ids, minlength=num_prompts)
    w_sum = np.bincount(ids, w, minlength=num_prompts)
    w_sq = np.bincount(ids, w * w, minlength=num_prompts)
    w_hit = np.bincount(ids, w * success, minlength=num_prompts)
    hits = np.bincount(ids, success, minlength=num_prompts)
    seen = count > 0
    ess = np.zeros(num_prompts)
    ess[seen] = w_sum[seen] ** 2 / w_sq[seen]
    rates = np.full(num_prompts, float(default_rate))
    snis = np.clip(w_hit[seen] / w_sum[seen], 0.0, 1.0)
    raw = hits[seen] / count[seen]
    rates[seen] = np.where(ess[seen] < ess_threshold, raw, snis)
    return rates, ess


def selection_logits(rates: np.ndarray, kappa: float, eps: float = 1e-6) -> np.ndarray:
    """[P] DARE's sampling logits (a - 1) log x + (b - 1) log(1 - x), a = b = 1 + kappa / 2.

    x is the estimated success rate clipped to [eps, 1 - eps]. The maximum is at x = 0.5.
    """
    x = np.clip(np.asarray(rates, np.float64), eps, 1.0 - eps)
    a_minus_1 = kappa / 2.0
    return a_minus_1 * np.log(x) + a_minus_1 * np.log1p(-x)


def selection_probs(rates: np.ndarray, kappa: float, eps: float = 1e-6) -> np.ndarray:
    """[P] softmax of `selection_logits`: the probability of each prompt being the first pick."""
    logits = selection_logits(rates, kappa, eps)
    z = np.exp(logits - logits.max())
    return z / z.sum()


def rollout_tiers(
    rates: np.ndarray,
    d_easy: float = 0.3,
    d_hard: float = 0.8,
    tier_rollouts: tuple[int, int, int] = (4, 8, 16),
) -> np.ndarray:
    """[P] int rollouts per prompt from its failure rate f = 1 - x (DARE's difficulty tiers).

    Interpretation of the boundaries: easy when f < d_easy, hard when f > d_hard, medium
    otherwise (so f = d_easy and f = d_hard are medium).
    """
    fail = 1.0 - np.asarray(rates, np.float64)
    tier = np.where(fail < d_easy, 0, np.where(fail > d_hard, 2, 1))
    return np.asarray(tier_rollouts, np.int64)[tier]


class DARESelector:
    """DARE's FIFO rollout replay, difficulty estimator and prompt sampler.

    A host loop per step: `rates = sel.estimate(current_sums)` (current-policy log-prob sums of
    the rollouts in `records()` order), `ids = sel.select(step, k, rates)`,
    `g = sel.rollouts(ids, rates)`, roll out, then `sel.add(ids_per_rollout, beh_sums, rewards)`.

    Args:
      settings: DARE's settings.
      num_prompts: P, the dataset size; prompt ids are in [0, P).
      seed: with the step, seeds the sampling, so a resumed run selects what a straight one does.
    """

    def __init__(self, settings: DARESettings, num_prompts: int, seed: int):
        if num_prompts < 1:
            raise ValueError(f"num_prompts={num_prompts} must be >= 1")
        self.settings = settings
        self.num_prompts = int(num_prompts)
        self.seed = int(seed)
        self._records = {
            "prompt_id": np.zeros(0, np.int64),
            "behaviour_logprob_sum": np.zeros(0, np.float64),
            "reward": np.zeros(0, np.float64),
        }

    def __len__(self) -> int:
        return len(self._records["prompt_id"])

    def records(self) -> dict[str, np.ndarray]:
        """The replay, oldest first: prompt_id [R], behaviour_logprob_sum [R], reward [R]."""
        return {k: v.copy() for k, v in self._records.items()}

    def add(self, prompt_ids, behaviour_logprob_sums, rewards) -> None:
        """Appends rollout records ([R'] each), dropping the oldest beyond `capacity`."""
        new = {
            "prompt_id": np.asarray(prompt_ids, np.int64).reshape(-1),
            "behaviour_logprob_sum": np.asarray(behaviour_logprob_sums, np.float64).reshape(-1),
            "reward": np.asarray(rewards, np.float64).reshape(-1),
        }
        if len({len(v) for v in new.values()}) != 1:
            raise ValueError(
                "prompt_ids, behaviour_logprob_sums and rewards must have one entry per rollout; "
                f"got {[len(v) for v in new.values()]}"
            )
        ids = new["prompt_id"]
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_prompts):
            raise ValueError(f"prompt ids must lie in [0, {self.num_prompts})")
        cap = self.settings.capacity
        self._records = {k: np.concatenate([self._records[k], new[k]])[-cap:] for k in new}

    def estimate(self, current_logprob_sums) -> np.ndarray:
        """[P] estimated success rates; `current_logprob_sums` is [R] in `records()` order."""
        cur = np.asarray(current_logprob_sums, np.float64).reshape(-1)
        if cur.shape[0] != len(self):
            raise ValueError(
                f"got {cur.shape[0]} current log-prob sums for a replay of {len(self)} records; "
                "score exactly the rollouts of records(), in order"
            )
        s = self.settings
        rates, _ = snis_success(
            self._records["prompt_id"],
            cur - self._records["behaviour_logprob_sum"],
            self._records["reward"],
            self.num_prompts,
            s.clip,
            s.ess_threshold,
            s.default_rate,
        )
        return rates

    def select(self, step: int, k: int, rates: np.ndarray) -> np.ndarray:
        """[k] distinct prompt ids drawn without replacement from `selection_probs(rates)`.

        Successive sampling without replacement is drawn as the top k of logits + Gumbel noise
        (the Gumbel-top-k trick; its first pick has exactly the softmax probabilities).
        """
        rates = np.asarray(rates, np.float64)
        if rates.shape != (self.num_prompts,):
            raise ValueError(f"rates {rates.shape} must be [{self.num_prompts}] (one per prompt)")
        if not 1 <= k <= self.num_prompts:
            raise ValueError(f"cannot select k={k} distinct prompts out of {self.num_prompts}")
        rng = np.random.default_rng((self.seed, step))
        logits = selection_logits(rates, self.settings.kappa, self.settings.eps)
        keys = logits + rng.gumbel(size=self.num_prompts)
        return np.argsort(-keys, kind="stable")[:k]

    def rollouts(self, prompt_ids: np.ndarray, rates: np.ndarray) -> np.ndarray:
        """Rollouts to draw for each of `prompt_ids`, from its tier."""
        s = self.settings
        tiers = rollout_tiers(rates, s.d_easy, s.d_hard, s.tier_rollouts)
        return tiers[np.asarray(prompt_ids, np.int64)]

    def state(self) -> dict[str, Any]:
        """The replay records for a checkpoint (an empty dict when the replay is empty)."""
        return {} if len(self) == 0 else {k: v.copy() for k, v in self._records.items()}

    def load(self, state: dict[str, Any]) -> None:
        """Restores the replay saved by `state`."""
        if state:
            self._records = {
                "prompt_id": np.asarray(state["prompt_id"], np.int64),
                "behaviour_logprob_sum": np.asarray(state["behaviour_logprob_sum"], np.float64),
                "reward": np.asarray(state["reward"], np.float64),
            }
        else:
            self._records = {k: v[:0] for k, v in self._records.items()}
