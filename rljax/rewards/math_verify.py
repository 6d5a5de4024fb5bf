"""Hugging Face's `math-verify` as an optional math grader beside `rljax.rewards.math`.

`math_equal` compares numbers exactly, tuples and intervals elementwise and everything else
as normalised strings, with no computer algebra. math-verify parses both sides into SymPy and
compares them symbolically, so "\\sqrt{4}" equals "2" and "x^2+1" equals "1+x^2", at the cost
of a heavier dependency and a parse that can time out. `benchmarks/math_graders.py` compares
the two on a generated table of (prediction, answer) pairs; the README lists where they
differ. Install with `pip install 'rljax[math]'`.

Both sides are given to math-verify as inline LaTeX ("$...$"). Its own timeouts (5 s each
for parsing and comparing) use SIGALRM, which works on a main thread only; on other threads
they are off and the reward pool (`reward.timeout_s`) bounds a reward's time.
"""

from __future__ import annotations

import logging
import threading

from rljax.rewards.math import math_reward

_TIMEOUT_S = 5


def _math_verify():
    try:
        import math_verify
    except ImportError as err:
        raise ImportError(
            "the math_verify grader needs the math-verify package: pip install 'rljax[math]'"
        ) from err
    # It warns on every call made without its SIGALRM timeouts (off threads).
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return math_verify


def math_verify_equal(pred: str, ref: str) -> bool:
    """Whether math-verify finds the predicted answer equal to the reference.

    Args:
      pred: the extracted answer, raw LaTeX or plain text.
      ref: the reference answer.
    """
    mv = _math_verify()
    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = mv.parse(f"${ref}$", parsing_timeout=timeout)
    guess = mv.parse(f"${pred}$", parsing_timeout=timeout)
    return bool(gold and guess and mv.verify(gold, guess, timeout_seconds=timeout))


def math_verify_reward(completion: str, answer: str) -> float:
    """`rljax.rewards.math.math_reward` with `math_verify_equal` as the comparison: the same
    answer extraction (boxed, "####", "answer is", last number), then math-verify."""
    return math_reward(completion, answer, math_verify_equal)
