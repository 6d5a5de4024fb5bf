"""Stop strings: a host-side stop rule for the rollout engine (`rljax.rollout.engine`).

A completion ends with the token that completes the first occurrence of any stop string in its
decoded text; that token is kept (as an EOS token is) and everything after it is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rljax.models.tokenizer import Tokenizer
from rljax.rollout.engine import StopRule


def stop_strings(tokenizer: Tokenizer, strings: Sequence[str]) -> StopRule:
    """A `StopRule` that cuts a completion after the token completing any of `strings`.

    The whole text is decoded once; only when it holds a stop string is the shortest prefix
    that holds it found by bisection (a longer prefix's text extends a shorter one's, except
    for a multi-byte character cut in half at its end), so a check costs one decode plus
    log2(length) more on the rows that stop.
    """
    strings = tuple(strings)
    if not strings or any(not s for s in strings):
        raise ValueError(f"stop strings {strings!r}: give at least one, none empty")

    def holds(tokens: np.ndarray, n: int) -> bool:
        text = tokenizer.decode(tokens[:n].tolist())
        return any(s in text for s in strings)

    def rule(tokens: np.ndarray) -> int:
        if not holds(tokens, tokens.size):
            return tokens.size
        lo, hi = 1, tokens.size  # the shortest prefix holding a stop string is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if holds(tokens, mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    return rule
