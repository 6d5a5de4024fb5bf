"""ReCrit: a transition-aware reward for critic interactions (answer, user criticism, answer).

"ReCrit" (black-yt/ReCrit; abstract in ../shared/seeds/abstracts.txt) scores how a model's
correctness changes between turns rather than only the final answer: after the user
criticises an answer, a model should fix a wrong answer and keep a right one, not give in.
Each pair of consecutive turns (s_k, s_{k+1}) of correctness flags falls in one quadrant:

  Correction  wrong -> right   +w_correction  (the best case)
  Robustness  right -> right   +w_robustness
  Sycophancy  right -> wrong   -w_sycophancy  (the worst case: a valid answer abandoned)
  Boundary    wrong -> wrong   -w_boundary    (a weak penalty: beyond the model's ability)

and the reward of a rollout is the mean of its pair rewards over its N - 1 consecutive turn
pairs (N = 2 for the usual initial / after-criticism interaction). The abstract gives the four
quadrants and their signs only; the weights (1.0, 0.6, 1.0, 0.1) and the chained mean over
turn pairs follow the authors' code (`reward.py`, `compute_critic_rewards`; `config.py`). The
code's auxiliary terms (repetition, overlong and format penalties) are separate rewards and
not part of this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Quadrant codes, indexable by 2 * s_k + s_{k+1} (s = 1 when the answer is correct).
QUADRANTS = ("boundary", "correction", "sycophancy", "robustness")


@dataclass(frozen=True)
class TransitionWeights:
    """Magnitudes of the four quadrant rewards; the signs are fixed (see module docstring).

    Attributes:
      correction: reward of wrong -> right.
      robustness: reward of right -> right.
      sycophancy: penalty of right -> wrong (the reward is -sycophancy).
      boundary: penalty of wrong -> wrong (the reward is -boundary).
    """

    correction: float = 1.0
    robustness: float = 0.6
    sycophancy: float = 1.0
    boundary: float = 0.1

    def __post_init__(self) -> None:
        for name in ("correction", "robustness", "sycophancy", "boundary"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(
                    f"TransitionWeights.{name}={value} must be a finite number >= 0: it is a "
                    "magnitude, the quadrant fixes its sign"
                )

    def signed(self) -> np.ndarray:
        """[4] signed rewards in `QUADRANTS` order."""
        return np.array([-self.boundary, self.correction, -self.sycophancy, self.robustness])


def _correctness(correctness: np.ndarray) -> np.ndarray:
    c = np.asarray(correctness)
    if c.ndim != 2 or c.shape[1] < 2:
        raise ValueError(
            f"correctness has shape {c.shape}; pass [B, N] flags, one column per turn with "
            "N >= 2 (the initial answer, then the answer after each criticism)"
        )
    if c.dtype != bool and not np.isin(c, (0, 1)).all():
        raise ValueError("correctness must hold booleans or 0/1 values, one per turn")
    return c.astype(bool)


def transition_quadrants(correctness: np.ndarray) -> np.ndarray:
    """Quadrant of every consecutive turn pair.

    Args:
      correctness: [B, N] bool (or 0/1), whether the answer of turn k is correct, N >= 2.

    Returns:
      [B, N - 1] int, indices into `QUADRANTS` (0 boundary, 1 correction, 2 sycophancy,
      3 robustness).

    Raises:
      ValueError: if correctness is not [B, N] with N >= 2 or holds values other than 0/1.
    """
    c = _correctness(correctness).astype(np.int64)
    return 2 * c[:, :-1] + c[:, 1:]


def recrit_rewards(correctness: np.ndarray, weights: TransitionWeights | None = None) -> np.ndarray:
    """ReCrit's transition-aware reward of each rollout.

    r_b = mean over k = 1..N-1 of w(quadrant(s_{b,k}, s_{b,k+1})), with w the signed quadrant
    rewards of `weights` (module docstring; the authors' code).

    Args:
      correctness: [B, N] bool (or 0/1) correctness of each turn's answer, N >= 2.
      weights: the quadrant magnitudes; the authors' defaults when None.

    Returns:
      [B] float64 rewards.

    Raises:
      ValueError: if correctness is not [B, N] 0/1 flags with N >= 2.
    """
    signed = (weights or TransitionWeights()).signed()
    return signed[transition_quadrants(correctness)].mean(axis=1)


def quadrant_counts(correctness: np.ndarray) -> dict[str, int]:
    """How many consecutive turn pairs of the batch fall in each quadrant (for metrics).

    Args:
      correctness: [B, N] bool (or 0/1) correctness of each turn's answer, N >= 2.

    Returns:
      {"boundary": n, "correction": n, "sycophancy": n, "robustness": n}, summing to B (N - 1).

    Raises:
      ValueError: if correctness is not [B, N] 0/1 flags with N >= 2.
    """
    counts = np.bincount(transition_quadrants(correctness).ravel(), minlength=len(QUADRANTS))
    return {name: int(n) for name, n in zip(QUADRANTS, counts)}
