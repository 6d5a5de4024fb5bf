"""RLCM: an outcome reward plus a process term that widens the confidence margin between the
correct and the incorrect intermediate answers of one reasoning trajectory.

"Process Supervision of Confidence Margin for Calibrated LLM Reasoning" (RLCM, arXiv
2604.23333; abstract in ../shared/seeds/abstracts.txt). Outcome-only rewards push a model to
be confident everywhere; RLCM truncates each trajectory at several intermediate budgets,
forces an answer there, and rewards the trajectory when its confidence is higher at the
budgets whose intermediate answer is correct than at those whose answer is wrong. It does not
ask each confidence to match a probability, only that the two sets are ranked apart.

Interpretation (the abstract gives no formula; the rule below is ours). For trajectory b with
S budgets, confidence c_bs in [0, 1] (e.g. the probability of the intermediate answer, or a
probe's estimate), intermediate correctness y_bs, valid-budget mask m_bs and final
correctness z_b:

  margin_b = mean_{s: m_bs, y_bs} c_bs - mean_{s: m_bs, not y_bs} c_bs,
  r_b = correct_reward * z_b + margin_coef * clip(margin_b, -margin_clip, margin_clip),

and the margin term is 0 when the trajectory has no valid correct or no valid incorrect
budget (an all-correct or all-wrong trajectory ranks nothing). The margin term is added
whether the final answer is right or wrong; with confidences in [0, 1] it lies in
[-margin_coef, margin_coef].
"""

from __future__ import annotations

import numpy as np


def _check_inputs(
    confidence: np.ndarray, step_correct: np.ndarray, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = np.asarray(confidence, np.float64)
    if c.ndim != 2:
        raise ValueError(
            f"confidence has shape {c.shape}; pass [B, S]: one row per trajectory, one column "
            "per intermediate budget"
        )
    y = np.asarray(step_correct)
    if y.shape != c.shape:
        raise ValueError(f"step_correct has shape {y.shape}, expected [B, S] = {c.shape}")
    if y.dtype != bool and not np.isin(y, (0, 1)).all():
        raise ValueError("step_correct must hold booleans or 0/1 values")
    m = np.ones(c.shape, bool) if mask is None else np.asarray(mask, bool)
    if m.shape != c.shape:
        raise ValueError(f"mask has shape {m.shape}, expected [B, S] = {c.shape}")
    valid = c[m]
    if not np.isfinite(valid).all() or (valid < 0).any() or (valid > 1).any():
        raise ValueError(
            "confidence must lie in [0, 1] on valid budgets; pass probabilities (e.g. the "
            "exp of the intermediate answer's log-prob)"
        )
    return c, y.astype(bool), m


def confidence_margin(
    confidence: np.ndarray,
    step_correct: np.ndarray,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Confidence margin of each trajectory between its correct and incorrect budgets.

    margin_b = mean confidence over the valid budgets with a correct intermediate answer minus
    the mean over the valid budgets with a wrong one (RLCM, arXiv 2604.23333;
    interpretation, module docstring).

    Args:
      confidence: [B, S] confidence in [0, 1] at each intermediate budget.
      step_correct: [B, S] bool (or 0/1), whether each intermediate answer is correct.
      mask: optional [B, S] bool, the budgets a trajectory reached (all when None).

    Returns:
      (margin, defined): [B] float64 margins, 0 where undefined, and [B] bool, True where the
      trajectory has at least one valid correct and one valid incorrect budget.

    Raises:
      ValueError: on shape mismatch, non-0/1 correctness, or a confidence outside [0, 1].
    """
    c, y, m = _check_inputs(confidence, step_correct, mask)
    good, bad = m & y, m & ~y
    n_good, n_bad = good.sum(axis=1), bad.sum(axis=1)
    defined = (n_good > 0) & (n_bad > 0)
    mean_good = np.where(good, c, 0.0).sum(axis=1) / np.maximum(n_good, 1)
    mean_bad = np.where(bad, c, 0.0).sum(axis=1) / np.maximum(n_bad, 1)
    return np.where(defined, mean_good - mean_bad, 0.0), defined


def confidence_margin_rewards(
    final_correct: np.ndarray,
    confidence: np.ndarray,
    step_correct: np.ndarray,
    mask: np.ndarray | None = None,
    margin_coef: float = 0.5,
    margin_clip: float | None = None,
    correct_reward: float = 1.0,
) -> np.ndarray:
    """RLCM's margin-enhanced reward of each trajectory.

    r_b = correct_reward * final_correct_b + margin_coef * clip(margin_b, -margin_clip,
    margin_clip), the margin from `confidence_margin` and 0 where it is undefined (RLCM,
    arXiv 2604.23333; interpretation, module docstring).

    Args:
      final_correct: [B] bool (or 0/1), whether the trajectory's final answer is correct.
      confidence: [B, S] confidence in [0, 1] at each intermediate budget.
      step_correct: [B, S] bool (or 0/1), whether each intermediate answer is correct.
      mask: optional [B, S] bool, the budgets a trajectory reached (all when None).
      margin_coef: weight of the margin term, >= 0.
      margin_clip: caps |margin| before weighting (> 0), or None for no cap.
      correct_reward: reward of a correct final answer.

    Returns:
      [B] float64 rewards.

    Raises:
      ValueError: on shape mismatch, non-0/1 correctness, a confidence outside [0, 1],
        margin_coef < 0 or margin_clip <= 0.
    """
    if not margin_coef >= 0:
        raise ValueError(f"margin_coef={margin_coef} must be >= 0: a wider margin must not hurt")
    if margin_clip is not None and not margin_clip > 0:
        raise ValueError(f"margin_clip={margin_clip} must be > 0, or None for no cap")
    z = np.asarray(final_correct)
    c = np.asarray(confidence)
    if z.shape != c.shape[:1] or c.ndim != 2:
        raise ValueError(
            f"final_correct has shape {z.shape}, expected [B] with B = rows of confidence {c.shape}"
        )
    if z.dtype != bool and not np.isin(z, (0, 1)).all():
        raise ValueError("final_correct must hold booleans or 0/1 values")
    margin, _ = confidence_margin(confidence, step_correct, mask)
    if margin_clip is not None:
        margin = np.clip(margin, -margin_clip, margin_clip)
    return correct_reward * z.astype(np.float64) + margin_coef * margin
