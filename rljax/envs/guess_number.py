"""GuessNumber: a small multi-turn game with feedback, the reference environment for tests.

Why: it needs several turns and reading the feedback to win (binary search wins in
ceil(log2(high - low + 2)) turns at worst), so it exercises the multi-turn path end to end with
a scripted policy and no model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from rljax.envs.base import Policy, Step

_INTEGER = re.compile(r"-?\d+")


class GuessNumber:
    """Guess a secret integer in [low, high]; each guess is answered "higher", "lower" or
    "correct". Task: {"secret": int, "low": int, "high": int}.

    The guess is the last integer in the action's text; an action without one is answered
    "no number found" and still counts as a turn. Reward 1.0 on the correct guess, which ends
    the episode, and 0 for every other turn. With `show_range`, "higher" and "lower" also
    state the range the feedback so far leaves ("higher, 9 to 15"), so a policy needs only
    the last observation to play well.
    """

    def __init__(self, show_range: bool = False) -> None:
        self.show_range = show_range
        self._secret: int | None = None
        self._done = False
        self._low = self._high = 0

    def reset(self, task: Mapping[str, Any]) -> str:
        """Starts a game on `task`; the first observation states the range."""
        secret, low, high = int(task["secret"]), int(task["low"]), int(task["high"])
        if not low <= secret <= high:
            raise ValueError(f"secret={secret} is outside [low={low}, high={high}]")
        self._secret, self._done = secret, False
        self._low, self._high = low, high
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
        if guess < self._secret:
            feedback, self._low = "higher", max(self._low, guess + 1)
        else:
            feedback, self._high = "lower", min(self._high, guess - 1)
        if self.show_range:
            feedback = f"{feedback}, {self._low} to {self._high}"
        return Step(feedback, 0.0, False, {"guess": guess})


def guess_number_tasks(n: int, low: int, high: int, seed: int) -> list[dict[str, int]]:
    """`n` GuessNumber tasks with secrets drawn uniformly from [low, high], reproducible in
    `seed` (a numpy Generator)."""
    if n < 0 or low > high:
        raise ValueError(f"n={n}, low={low}, high={high}: need n >= 0 and low <= high")
    secrets = np.random.default_rng(seed).integers(low, high + 1, size=n)
    return [{"secret": int(s), "low": low, "high": high} for s in secrets]


def _last_range(observation: str) -> tuple[int, int]:
    """The range stated at the end of a GuessNumber observation ("... 9 to 15")."""
    low, high = (int(n) for n in _INTEGER.findall(observation)[-2:])
    return low, high


def guess_number_expert(kind: str, rng: np.random.Generator) -> Policy:
    """A scripted GuessNumber policy reading the range of the last observation (the first
    one or a `show_range` answer): "bisect" guesses its middle (wins within
    ceil(log2(high - low + 2)) turns), "random" a uniform integer in it (a weaker player:
    the SFT warm start of the RL recipe, which RL then improves)."""
    if kind not in ("bisect", "random"):
        raise ValueError(f"expert kind {kind!r} is not 'bisect' or 'random'")

    def policy(observations: list[str]) -> str:
        low, high = _last_range(observations[-1])
        return str((low + high) // 2 if kind == "bisect" else int(rng.integers(low, high + 1)))

    return policy


@dataclasses.dataclass(frozen=True)
class GuessNumberTask:
    """GuessNumber as an episodic task the driver trains on (`task.name="guess_number"`).

    An example's prompt is the game's first observation and its answer the secret; the
    episode is played by `make_env()` on `env_task(answer)` for at most `max_turns` turns,
    with `show_range` feedback. The test split draws its secrets from another seed of the
    same range (a game this small has no unseen problems; what is held out is the draw).

    Attributes:
      low, high: the secret's range.
      max_turns: guesses before the episode is cut off (reward 0).
      expert: the scripted policy of the SFT warm start ("random" or "bisect").
      seed: seeds the secrets.
      test_size: games in the test split (train is unbounded).
    """

    low: int = 1
    high: int = 15
    max_turns: int = 4
    expert: str = "random"
    seed: int = 0
    test_size: int = 256
    splits = ("train", "test")

    def __post_init__(self):
        if self.low > self.high or self.max_turns < 1 or self.test_size < 1:
            raise ValueError(
                f"low={self.low}, high={self.high}, max_turns={self.max_turns}, test_size="
                f"{self.test_size}: need low <= high and max_turns, test_size >= 1"
            )
        guess_number_expert(self.expert, np.random.default_rng(0))  # checks the kind

    def split_size(self, split: str) -> int | None:
        """None (unbounded) for train, `test_size` for test."""
        self._split_id(split)
        return None if split == "train" else self.test_size

    def _split_id(self, split: str) -> int:
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not one of {self.splits}")
        return self.splits.index(split)

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=the first observation, answer=str(secret)), from (seed, split, index)."""
        rng = np.random.default_rng([self.seed, self._split_id(split), index])
        secret = int(rng.integers(self.low, self.high + 1))
        return {
            "prompt": f"Guess an integer from {self.low} to {self.high}.",
            "answer": str(secret),
        }

    def make_env(self) -> GuessNumber:
        """A fresh game with range feedback."""
        return GuessNumber(show_range=True)

    def env_task(self, answer: str) -> dict[str, int]:
        """The game of the example whose answer is `answer`."""
        return {"secret": int(answer), "low": self.low, "high": self.high}

    def reward(self, completion: str, answer: str) -> float:
        """1.0 when `completion` (a single guess) names the secret."""
        numbers = _INTEGER.findall(completion)
        return float(bool(numbers) and int(numbers[-1]) == int(answer))

    def sft_target(self, answer: str) -> str:
        """A single-turn target: the secret itself (the episodic warm start plays
        `expert_policy` instead)."""
        return answer

    def expert_policy(self, rng: np.random.Generator) -> Policy:
        """The warm start's scripted player (`guess_number_expert(self.expert, rng)`)."""
        return guess_number_expert(self.expert, rng)
