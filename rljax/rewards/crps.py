"""Distribution-aware rewards for numeric answers: leave-one-out CRPS credit within a group.

"Distribution-Aware Reward via CRPS" (arXiv 2605.20740) treats the N numbers a group of
rollouts answers with as an empirical predictive distribution X of the true answer y and scores
it with the continuous ranked probability score (lower is better),

  CRPS(X, y) = (1/N) sum_i |x_i - y| - c_N sum_{i,j} |x_i - x_j|,

with c_N = 1/(2N^2), the CRPS of the empirical CDF, or c_N = 1/(2N(N-1)) for the "fair" CRPS
(unbiased for the CRPS of the distribution the samples come from). Rollout i is credited with
how much the group's score gets worse without it, r_i = CRPS(X_-i, y) - CRPS(X, y): a sample
near y, or one that spreads a collapsed group toward y, gets r_i > 0; a duplicate of a crowded
wrong answer gets little. Unparseable rollouts get a fixed penalty. The rewards are meant to be
fed to GRPO (spec section 12; formulas are an interpretation, no code was published).

Interpretation where the paper is silent: the credit is computed over the parseable rollouts
only; a group with one parseable rollout gives it credit 0 (X_-i would be empty); with one
sample the fair CRPS has no pairs and equals |x - y|; a non-finite parsed value counts as
unparseable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Real

import numpy as np

from rljax.rewards.math import final_number, parse_number

ParseFn = Callable[[str], Real | None]
"""parse(text) -> number or None: the numeric answer of a completion or of a reference."""


def crps(samples: np.ndarray, y: float, fair: bool = False) -> float:
    """CRPS of the empirical distribution of `samples` against the outcome y.

    Args:
      samples: [N] numbers, N >= 1.
      y: the observed value.
      fair: use the fair coefficient 1/(2N(N-1)) on the pair term instead of 1/(2N^2).

    Returns:
      (1/N) sum_i |x_i - y| - c_N sum_{i,j} |x_i - x_j| (arXiv 2605.20740; module docstring).

    Raises:
      ValueError: if samples is not a non-empty 1-D array.
    """
    x = np.asarray(samples, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"samples has shape {x.shape}; pass a non-empty 1-D array of numbers")
    n = x.size
    spread = np.abs(x[:, None] - x[None, :]).sum()
    coef = (1.0 / (2 * n * (n - 1)) if n > 1 else 0.0) if fair else 1.0 / (2 * n * n)
    return float(np.abs(x - y).mean() - coef * spread)


def _pair_coef(n: np.ndarray, fair: bool) -> np.ndarray:
    """c_N elementwise for counts n (0 where there are no pairs, so the pair term vanishes)."""
    n = n.astype(np.float64)
    denom = 2 * n * (n - 1) if fair else 2 * n * n
    return np.divide(1.0, denom, out=np.zeros_like(n), where=denom > 0)


def _loo_credit(
    values: np.ndarray, valid: np.ndarray, y: np.ndarray, penalty: float, fair: bool
) -> np.ndarray:
    """[n, G] leave-one-out credits of n groups; `values`/`valid` [n, G], y [n]."""
    x = np.where(valid, values, 0.0)
    m = valid.astype(np.float64)
    n = m.sum(axis=1)  # [n]
    err = np.abs(x - y[:, None]) * m  # [n, G]
    pair = np.abs(x[:, :, None] - x[:, None, :]) * m[:, :, None] * m[:, None, :]
    row_pair = pair.sum(axis=2)  # [n, G]: sum_k |x_i - x_k|
    s1, s2 = err.sum(axis=1), row_pair.sum(axis=1)  # [n]
    full = s1 / np.maximum(n, 1) - _pair_coef(n, fair) * s2
    n_loo = n[:, None] - 1
    loo = (s1[:, None] - err) / np.maximum(n_loo, 1) - _pair_coef(n_loo, fair) * (
        s2[:, None] - 2 * row_pair
    )
    credit = np.where(n_loo >= 1, loo - full[:, None], 0.0)
    return np.where(valid, credit, penalty)


def _as_values(parsed: Sequence[Real | None]) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) from parsed numbers; None and non-finite values are invalid."""
    values = np.array([np.nan if v is None else float(v) for v in parsed], np.float64)
    valid = np.isfinite(values)
    return np.where(valid, values, 0.0), valid


def crps_credit(
    values: Sequence[Real | None], y: float, penalty: float = -1.0, fair: bool = False
) -> np.ndarray:
    """Leave-one-out CRPS credit of each rollout of one group.

    Args:
      values: the N rollouts' parsed numeric answers; None for an unparseable rollout.
      y: the reference answer.
      penalty: the reward of an unparseable rollout (interpretation: -1.0 by default; choose
        it below the credits the task's answer scale produces so unparseable never wins).
      fair: use the fair CRPS (see `crps`).

    Returns:
      [N] float64 rewards: r_i = CRPS(X_-i, y) - CRPS(X, y) over the parseable rollouts X,
      `penalty` for the others (arXiv 2605.20740, module docstring).
    """
    x, valid = _as_values(values)
    return _loo_credit(x[None], valid[None], np.array([float(y)]), penalty, fair)[0]


def group_crps_rewards(
    completions: Sequence[str],
    answers: Sequence[str],
    group_size: int,
    parse: ParseFn = final_number,
    parse_answer: ParseFn = parse_number,
    penalty: float = -1.0,
    fair: bool = False,
) -> np.ndarray:
    """CRPS credit rewards of B completions laid out as B/G contiguous groups, vectorised.

    Args:
      completions: B decoded completions.
      answers: B reference answers, equal within each group (one per sample, as the driver
        passes them).
      group_size: G, rollouts per prompt.
      parse: completion text -> number or None (default: `final_number`).
      parse_answer: reference text -> number or None (default: `parse_number`).
      penalty, fair: as in `crps_credit`.

    Returns:
      [B] float32 rewards.

    Raises:
      ValueError: if G does not divide B, the lengths differ, a group's answers differ or a
        reference answer does not parse.
    """
    b = len(completions)
    if len(answers) != b:
        raise ValueError(f"got {b} completions and {len(answers)} answers; pass one per sample")
    if group_size < 1 or b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    refs = []
    for g in range(b // group_size):
        group = answers[g * group_size : (g + 1) * group_size]
        if any(a != group[0] for a in group):
            raise ValueError(
                f"group {g} has different answers {sorted(set(group))!r:.200}; rows of a group "
                "must be samples of one prompt (contiguous groups of group_size)"
            )
        ref = parse_answer(group[0])
        if ref is None or not np.isfinite(float(ref)):
            raise ValueError(
                f"reference answer {group[0]!r:.80} of group {g} is not a number; CRPS rewards "
                "need numeric answers (filter the data set or pass another parse_answer)"
            )
        refs.append(float(ref))
    x, valid = _as_values([parse(c) for c in completions])
    shape = (b // group_size, group_size)
    credit = _loo_credit(x.reshape(shape), valid.reshape(shape), np.array(refs), penalty, fair)
    return credit.reshape(b).astype(np.float32)
