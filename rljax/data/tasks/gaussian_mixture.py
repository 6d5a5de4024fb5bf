"""Gaussian-mixture regression: predict a quantity drawn from a stated 1-D mixture.

Each prompt describes a mixture of `num_components` Gaussians (weights, means and standard
deviations, written as decimals) and asks for a value of Y. The answer is JSON holding those
parameters and one realised target y drawn from the mixture, so the best a model can do is to
sample from (or summarise) the predictive distribution: this is the test bed for
distribution-aware rewards such as CRPS over a group of numeric answers (arXiv 2605.20740),
which read `mixture(answer)` and `target(answer)`.

The per-completion `reward` is exp(-|x - y| / reward_scale) for the completion's final number
x (1.0 at x = y, decaying with the absolute error; 0.0 when no number is found). With
reward_mode="crps" the driver scores each group of samples together (`group_rewards`): the
group's numbers are an empirical predictive distribution, and each sample gets its
leave-one-out CRPS credit (`rljax.rewards.crps.crps_credit`). Train and test are disjoint: a
fixed hash of the prompt text puts each mixture in one split.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from rljax.data.tasks.generated import GeneratedSplits
from rljax.data.tasks.split_hash import unit_hash
from rljax.rewards.crps import crps_credit
from rljax.rewards.math import final_number

_MAX_DRAWS = 1000
_MAX_COMPONENTS = 10
REWARD_MODES = ("distance", "crps")


@dataclasses.dataclass(frozen=True)
class GaussianMixtureTask(GeneratedSplits):
    """Predict Y ~ sum_k w_k N(mu_k, sigma_k^2) from its stated parameters.

    Attributes:
      num_components: K, the number of mixture components (1 to 10).
      mean_range: means are drawn uniformly from [-mean_range, mean_range], rounded to 2
        decimals.
      min_std, max_std: standard deviations are drawn uniformly from [min_std, max_std] and
        rounded to 2 decimals (at least 0.01).
      reward_scale: the error scale of `reward`, exp(-|x - y| / reward_scale).
      reward_mode: how training rollouts are scored: "distance" (each sample by `reward`) or
        "crps" (each group by `group_rewards`).
      crps_penalty: the CRPS-mode reward of a sample with no number.
      seed: seeds generation of mixtures and targets; splits stay the same for every seed.
      test_fraction: share of mixtures (by prompt hash) held out for the test split.
      test_size: examples in the finite test split (train is unbounded).

    Weights are whole percentages, each at least 1: K + a multinomial draw of the other
    100 - K percent with Dirichlet(1, ..., 1) probabilities. The rounded values written in the
    prompt are the exact parameters y is drawn from.
    """

    num_components: int = 2
    mean_range: float = 10.0
    min_std: float = 0.5
    max_std: float = 3.0
    reward_scale: float = 1.0
    reward_mode: str = "distance"
    crps_penalty: float = -1.0
    seed: int = 0
    test_fraction: float = 0.1
    test_size: int = 500

    def __post_init__(self):
        if not 1 <= self.num_components <= _MAX_COMPONENTS:
            raise ValueError(
                f"num_components={self.num_components} must be in [1, {_MAX_COMPONENTS}]"
            )
        if not self.mean_range > 0:
            raise ValueError(f"mean_range={self.mean_range} must be positive")
        if not 0.01 <= self.min_std <= self.max_std:
            raise ValueError(
                f"min_std={self.min_std}, max_std={self.max_std}: need 0.01 <= min_std <= max_std"
            )
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale={self.reward_scale} must be positive")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode={self.reward_mode!r} must be one of {REWARD_MODES}")
        self.check_split_settings()

    def in_test_split(self, prompt: str) -> bool:
        """Whether the mixture with this prompt text belongs to the test split."""
        return unit_hash(*prompt.encode("utf-8")) < self.test_fraction

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=mixture in words, answer=JSON {weights, means, stds, y})."""
        rng = self.example_rng(index, split)
        k = self.num_components
        for _ in range(_MAX_DRAWS):
            percents = 1 + rng.multinomial(100 - k, rng.dirichlet(np.ones(k)))
            weights = [int(p) / 100 for p in percents]
            means = [round(float(m), 2) for m in rng.uniform(-self.mean_range, self.mean_range, k)]
            stds = [
                max(round(float(s), 2), 0.01) for s in rng.uniform(self.min_std, self.max_std, k)
            ]
            parts = [
                f"with probability {w:.2f}, a normal distribution with mean {m:.2f} and "
                f"standard deviation {s:.2f}"
                for w, m, s in zip(weights, means, stds)
            ]
            prompt = (
                f"Y is drawn from a mixture of {k} normal distribution"
                f"{'s' if k > 1 else ''}: " + "; ".join(parts) + ". Predict the value of Y. "
                "Give your answer as a number."
            )
            if self.in_test_split(prompt) != (split == "test"):
                continue
            component = int(rng.choice(k, p=np.asarray(percents) / 100))
            y = float(rng.normal(means[component], stds[component]))
            answer = {"weights": weights, "means": means, "stds": stds, "y": y}
            return {"prompt": prompt, "answer": json.dumps(answer)}
        raise ValueError(f"no {split} mixture found in {_MAX_DRAWS} draws for {self}")

    def mixture(self, answer: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(weights [K], means [K], stds [K]) of the mixture in `answer`."""
        spec = json.loads(answer)
        return tuple(
            np.asarray(spec[key], dtype=np.float64) for key in ("weights", "means", "stds")
        )

    def target(self, answer: str) -> float:
        """The realised target y of `answer`."""
        return float(json.loads(answer)["y"])

    def reward(self, completion: str, answer: str) -> float:
        """exp(-|x - y| / reward_scale) for the completion's final number x; 0.0 if none."""
        x = final_number(completion)
        if x is None:
            return 0.0
        return math.exp(-abs(float(x) - self.target(answer)) / self.reward_scale)

    def group_rewards(self, completions: list[str], answer: str) -> np.ndarray:
        """Rewards [G] of one prompt's G samples, scored together.

        "distance": `reward` of each sample. "crps": the samples' final numbers form an
        empirical distribution X, and sample i gets CRPS(X_-i, y) - CRPS(X, y), its
        leave-one-out credit (arXiv 2605.20740); a sample with no number gets `crps_penalty`.
        """
        if self.reward_mode == "distance":
            return np.asarray([self.reward(c, answer) for c in completions], np.float64)
        values = [final_number(c) for c in completions]
        return crps_credit(values, self.target(answer), penalty=self.crps_penalty)

    def sft_target(self, answer: str) -> str:
        """The realised target to 2 decimals: a warm start on such draws teaches sampling."""
        return f"{self.target(answer):.2f}"
