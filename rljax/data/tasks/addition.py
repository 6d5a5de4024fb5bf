"""Multi-digit addition: a synthetic, exactly verifiable task for tiny byte-level models.

A problem is "a+b=" with answer str(a + b). Each operand first draws its digit count uniformly
from [min_digits, max_digits], then a value with that many digits, so short and long operands
are equally common. Problems are generated from their index, so any split is random-access,
reproducible and needs no storage.

Train and test are disjoint by construction: a fixed integer hash of the unordered operand pair
puts every pair in exactly one split, so neither "a+b" nor "b+a" of a test problem can appear in
train. The rule does not depend on `seed`, so the test set is held out for every seed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.data.tasks.generated import GeneratedSplits
from rljax.data.tasks.split_hash import unit_hash

# Rejection draws per example before a split is declared (nearly) empty; at test_fraction=0.1
# a draw lands in test with probability ~0.1, so 1000 misses do not happen by chance.
_MAX_DRAWS = 1000
_MAX_SUPPORTED_DIGITS = 18  # 10**18 < 2**63: operands stay within numpy's int64 sampling


@dataclasses.dataclass(frozen=True)
class AdditionTask(GeneratedSplits):
    """Prompts "a+b=" with answer str(a + b); reward 1.0 only for the exact sum.

    Attributes:
      min_digits, max_digits: digit range of each operand (1-digit operands include 0).
      seed: seeds problem generation; splits stay the same for every seed.
      test_fraction: share of operand pairs held out for the test split.
      test_size: number of examples in the finite test split (train is unbounded).
    """

    min_digits: int = 1
    max_digits: int = 3
    seed: int = 0
    test_fraction: float = 0.1
    test_size: int = 1000

    def __post_init__(self):
        if not 1 <= self.min_digits <= self.max_digits <= _MAX_SUPPORTED_DIGITS:
            raise ValueError(
                f"min_digits={self.min_digits}, max_digits={self.max_digits}: need "
                f"1 <= min_digits <= max_digits <= {_MAX_SUPPORTED_DIGITS}"
            )
        self.check_split_settings()

    def in_test_split(self, a: int, b: int) -> bool:
        """Whether the problem a+b (equivalently b+a) belongs to the test split."""
        return unit_hash(min(a, b), max(a, b)) < self.test_fraction

    def example(self, index: int, split: str) -> dict[str, str]:
        """The problem at `index` of `split`: dict(prompt="17+5=", answer="22").

        Deterministic in (seed, split, index). Operand pairs of the other split are rejected
        and redrawn, so a split may repeat a problem but never shares one with the other split.
        """
        rng = self.example_rng(index, split)
        want_test = split == "test"
        for _ in range(_MAX_DRAWS):
            a, b = self._operand(rng), self._operand(rng)
            if self.in_test_split(a, b) == want_test:
                return {"prompt": f"{a}+{b}=", "answer": str(a + b)}
        raise ValueError(
            f"no {split} problem found in {_MAX_DRAWS} draws for {self}: the {split} split is "
            "(nearly) empty; widen the digit range or move test_fraction away from 0/1"
        )

    def difficulty(self, index: int, split: str) -> int:
        """The number of digits of the longer operand (a curriculum level)."""
        a, b = self.example(index, split)["prompt"].rstrip("=").split("+")
        return max(len(a), len(b))

    def reward(self, completion: str, answer: str) -> float:
        """1.0 if the whole completion, stripped of surrounding whitespace, equals the answer."""
        return 1.0 if completion.strip() == answer else 0.0

    # The K = 3 components of `reward_components`, for multi-reward methods (GDPO, GPRL).
    reward_component_names = ("correct", "digits", "length")

    def reward_components(self, completion: str, answer: str) -> tuple[float, float, float]:
        """(correct, digits, length): the exact-sum reward; the fraction of the answer's digits
        the completion has in place, aligned from the ones digit (partial credit); and 1.0 if
        it has the answer's length (a format constraint), of the stripped completion."""
        text = completion.strip()
        in_place = sum(1 for a, c in zip(reversed(answer), reversed(text)) if a == c)
        return (
            self.reward(completion, answer),
            in_place / len(answer),
            float(len(text) == len(answer)),
        )

    def sft_target(self, answer: str) -> str:
        """The completion a supervised warm start teaches: the bare answer."""
        return answer

    def _operand(self, rng: np.random.Generator) -> int:
        digits = int(rng.integers(self.min_digits, self.max_digits + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return int(rng.integers(low, 10**digits))
