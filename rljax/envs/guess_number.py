"""GuessNumber: a small multi-turn game with feedback, the reference environment for tests.

Why: it needs several turns and reading the feedback to win (binary search wins in
ceil(log2(high - low + 2)) turns at worst), so it exercises the multi-turn path end to end with
a scripted policy and no model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from rljax.envs.base import Step

_INTEGER = re.compile(r"-?\d+")


class GuessNumber:
    """Guess a secret integer in [low, high]; each guess is answered "higher", "lower" or
    "correct". Task: {"secret": int, "low": int, "high": int}.

    The guess is the last integer in the action's text; an action without one is answered
    "no number found" and still counts as a turn. Reward 1.0 on the correct guess, which ends
    the episode, and 0 for every other turn.
    """

    def __init__(self) -> None:
        self._secret: int | None = None
        self._done = False

    def reset(self, task: Mapping[str, Any]) -> str:
        """Starts a game on `task`; the first observation states the range."""
        secret, low, high = int(task["secret"]), int(task["low"]), int(task["high"])
        if not low <= secret <= high:
            raise ValueError(f"secret={secret} is outside [low={low}, high={high}]")
        self._secret, self._done = secret, False
        return f"Guess an integer from {low} to {high}."

    def step(self, action: str) -> Step:
        """Reads the guess from `action` and answers it."""
        if self._secret is None or self._done:
            raise RuntimeError("GuessNumber.step outside a game: call reset(task) first")
        numbers = _INTEGER.findall(action)
        if not numbers:
            return Step("no number found", 0.0, False, {})
        guess = int(numbers[-1])
        if guess == self._secret:
            self._done = True
            return Step("correct", 1.0, True, {"guess": guess})
        feedback = "higher" if guess < self._secret else "lower"
        return Step(feedback, 0.0, False, {"guess": guess})


def guess_number_tasks(n: int, low: int, high: int, seed: int) -> list[dict[str, int]]:
    """`n` GuessNumber tasks with secrets drawn uniformly from [low, high], reproducible in
    `seed` (a numpy Generator)."""
    if n < 0 or low > high:
        raise ValueError(f"n={n}, low={low}, high={high}: need n >= 0 and low <= high")
    secrets = np.random.default_rng(seed).integers(low, high + 1, size=n)
    return [{"secret": int(s), "low": low, "high": high} for s in secrets]
