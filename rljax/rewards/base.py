"""The host-side reward interface, and scoring that contains a misbehaving reward function.

A reward function sees decoded text and returns a float. One bad call (an exception, a
`sys.exit`, a None, a NaN, an absurd 1e39) must not kill or derail a long training run, so
`score_completions` gives that completion reward 0, counts the failure by kind for the
metrics, and logs one warning per kind per batch.

This is in-process scoring (`reward.kind="inline"`): timeouts here are soft (a call that
returns after `timeout_s` has its reward discarded, but a call that never returns is not
interrupted), and a call to `os._exit` or a crash in native code ends the trainer, since no
Python code runs after them. Hard limits and survival of both: `rljax.rewards.pool`.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from typing import Any, Callable, Sequence

import numpy as np

RewardFn = Callable[[str, str, str], float]
"""reward_fn(prompt, completion, answer) -> float, on decoded text (special tokens dropped)."""

FAILURE_KINDS = ("exception", "wrong_type", "non_finite", "timeout", "exit", "out_of_range")

FAILURE_REASONS = {
    "exception": "reward_fn raised",
    "wrong_type": "reward_fn returned a non-number",
    "non_finite": "reward_fn returned a non-finite number",
    "timeout": "reward_fn ran past timeout_s",
    "exit": "reward_fn exited (sys.exit, os._exit or a crash)",
    "out_of_range": "reward_fn returned a number beyond max_abs",
}

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest reward the [B] float32 rewards hold; the default of every `max_abs`."""

_log = logging.getLogger(__name__)

Outcome = tuple[float | tuple[float, ...], str | None, str]
"""(reward, failure kind or None, detail for the log) of one scored row; the reward is a
tuple of K floats where the reward function returns K components."""


def _check_number(value: Any) -> Outcome:
    """The outcome of one number: a real, finite float or a failure."""
    if not isinstance(value, numbers.Real):
        return 0.0, "wrong_type", f"got {type(value).__name__} {value!r:.80}"
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return 0.0, "out_of_range", f"got an int of {len(str(abs(int(value))))} digits"
    if not math.isfinite(number):
        return 0.0, "non_finite", f"got {value!r}"
    return number, None, ""


def check_value(value: Any) -> Outcome:
    """The outcome of one returned reward value: a real, finite number, a tuple of them (from
    a list, tuple or 1-D array: the K components of one reward, `tally_outcomes(dims=K)`), or
    a failure."""
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        parts = [_check_number(v) for v in value]
        failed = next((p for p in parts if p[1] is not None), None)
        if failed is not None:
            return 0.0, failed[1], f"{failed[2]} in {value!r:.80}"
        return tuple(p[0] for p in parts), None, ""
    return _check_number(value)


def failed_call(err: BaseException) -> Outcome:
    """The outcome of a call that raised `err` (an Exception, or SystemExit from sys.exit)."""
    if isinstance(err, SystemExit):
        return 0.0, "exit", f"called sys.exit({err.code!r})"
    return 0.0, "exception", repr(err)


def score_one(
    reward_fn: RewardFn, prompt: str, completion: str, answer: str, timeout_s: float | None
) -> Outcome:
    """The outcome of one call."""
    start = time.perf_counter()
    try:
        value = reward_fn(prompt, completion, answer)
    except (Exception, SystemExit) as err:  # pylint: disable=broad-except  # contained
        return failed_call(err)
    elapsed = time.perf_counter() - start
    if timeout_s is not None and elapsed > timeout_s:
        return 0.0, "timeout", f"took {elapsed:.3g} s > timeout_s={timeout_s}"
    return check_value(value)


def tally_outcomes(
    outcomes: Sequence[Outcome], max_abs: float = FLOAT32_MAX, dims: int | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Rewards [B] float32 (or [B, K] with `dims`=K) and failure counts per kind of B row
    outcomes; logs one warning per kind of failure (how many rows, and the first one's
    detail).

    A row's reward of the wrong arity (K numbers where one is expected, one or another count
    where `dims` = K) is a failure of kind "wrong_type", and one beyond +-max_abs of kind
    "out_of_range"; a failed row scores 0 in every component.
    """
    rewards = np.zeros((len(outcomes),) if dims is None else (len(outcomes), dims), np.float32)
    failures = dict.fromkeys(FAILURE_KINDS, 0)
    first: dict[str, str] = {}
    for i, (reward, kind, detail) in enumerate(outcomes):
        if kind is None:
            reward, kind, detail = _fit(reward, max_abs, dims)
        if kind is None:
            rewards[i] = reward
        else:
            failures[kind] += 1
            first.setdefault(kind, f"sample {i}: {detail}")
    for kind, detail in first.items():
        _log.warning(
            "%s on %d of %d samples, which got reward 0 (first, %s)",
            FAILURE_REASONS[kind],
            failures[kind],
            len(outcomes),
            detail,
        )
    return rewards, failures


def _fit(reward: float | tuple[float, ...], max_abs: float, dims: int | None) -> Outcome:
    """A returned reward checked against the expected arity (`dims`) and +-max_abs."""
    arity = len(reward) if isinstance(reward, tuple) else None
    if arity != dims:
        want = "one number" if dims is None else f"{dims} numbers"
        return 0.0, "wrong_type", f"got {reward!r:.80}, expected {want}"
    values = reward if isinstance(reward, tuple) else (reward,)
    if any(abs(v) > max_abs for v in values):
        return 0.0, "out_of_range", f"got {reward!r:.80} > max_abs={max_abs:g}"
    return reward, None, ""


def score_completions(
    reward_fn: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    timeout_s: float | None = None,
    max_abs: float = FLOAT32_MAX,
    dims: int | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """Rewards of B completions, with failed calls scored 0.

    Args:
      reward_fn: `RewardFn`; any real number (int, float, bool, numpy scalar) is accepted.
      prompts, completions, answers: B strings each, row i one sample.
      timeout_s: soft per-call time limit in seconds (see the module docstring); None for none.
      max_abs: a reward beyond +-max_abs is a failure of kind "out_of_range".
      dims: K where reward_fn returns K components of one reward (a sequence of K numbers);
        None where it returns one number.

    Returns:
      rewards: [B] float32, or [B, K] with `dims`.
      failures: count of failed calls per kind, every kind of `FAILURE_KINDS` present.
    """
    if not len(prompts) == len(completions) == len(answers):
        raise ValueError(
            f"got {len(prompts)} prompts, {len(completions)} completions and "
            f"{len(answers)} answers; pass one of each per sample"
        )
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be positive, or None for no limit")
    return tally_outcomes(
        [score_one(reward_fn, *row, timeout_s) for row in zip(prompts, completions, answers)],
        max_abs,
        dims,
    )
