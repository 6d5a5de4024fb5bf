"""Numeric answers: extract the final number of a completion and compare it with a reference."""

from __future__ import annotations

import re
from fractions import Fraction

# A signed integer or decimal, with optional thousands separators ("1,234.5"), or a fraction.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def parse_number(text: str) -> Fraction | None:
    """An exact rational from "12", "-3.5", "1,234" or "3/4"; None if it is not a number."""
    text = text.strip().replace(",", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def final_number(completion: str) -> Fraction | None:
    """The answer a completion commits to: the last \\boxed{...} if any, else its last number."""
    boxed = _BOXED.findall(completion)
    if boxed:
        return parse_number(boxed[-1])
    numbers = _NUMBER.findall(completion)
    return parse_number(numbers[-1]) if numbers else None


def numeric_match_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's final number equals the reference answer exactly, else 0.0."""
    got, want = final_number(completion), parse_number(answer)
    return 1.0 if got is not None and want is not None and got == want else 0.0
