"""Arithmetic word problems: short English stories over small integers, verified exactly.

A problem is a template (addition, subtraction, multiplication or a two-step mix) filled with
a name, an item and operands; the answer is an integer. The reward is 1.0 when the
completion's final number (or last \\boxed{}) equals it, so a model may reason first.
Train and test are disjoint: a fixed hash of (template, operands) puts each problem in one
split, whatever the seed, name or item.
"""

from __future__ import annotations

import dataclasses

from rljax.data.tasks.generated import GeneratedSplits
from rljax.data.tasks.split_hash import unit_hash
from rljax.rewards.math import numeric_match_reward

_MAX_DRAWS = 1000
_NAMES = ("Tom", "Mia", "Ali", "Sara", "Ben", "Lena", "Omar", "Yuki", "Ivan", "Nora")
_ITEMS = ("apples", "books", "marbles", "pencils", "stickers", "coins", "cookies", "cards")
# (text, answer, number of operands); {n} name, {i} item.
_TEMPLATES = (
    (
        "{n} has {a} {i}. {n} buys {b} more {i}. How many {i} does {n} have now?",
        lambda a, b, c: a + b,
        2,
    ),
    (
        "{n} has {a} {i} and gives {b} of them to a friend. How many {i} does {n} have left?",
        lambda a, b, c: a - b,
        2,
    ),
    (
        "{n} buys {a} bags with {b} {i} in each bag. How many {i} does {n} buy in total?",
        lambda a, b, c: a * b,
        2,
    ),
    (
        "{n} has {a} {i}, finds {b} more and then loses {c}. How many {i} does {n} have now?",
        lambda a, b, c: a + b - c,
        3,
    ),
)
_INSTRUCTION = " Give the final answer as a number."


@dataclasses.dataclass(frozen=True)
class WordProblemTask(GeneratedSplits):
    """One- and two-step arithmetic stories with integer answers.

    Attributes:
      max_value: operands are drawn from [1, max_value] (subtractions never go negative).
      seed: seeds problem generation; splits stay the same for every seed.
      test_fraction: share of (template, operands) problems held out for the test split.
      test_size: examples in the finite test split (train is unbounded).
    """

    max_value: int = 20
    seed: int = 0
    test_fraction: float = 0.1
    test_size: int = 500

    def __post_init__(self):
        if self.max_value < 2:
            raise ValueError(f"max_value={self.max_value} must be at least 2")
        self.check_split_settings()

    def in_test_split(self, template: int, operands: tuple[int, int, int]) -> bool:
        """Whether the problem (template, operands) belongs to the test split."""
        return unit_hash(template, *operands) < self.test_fraction

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=story + instruction, answer=str(integer)), deterministic in the index."""
        rng = self.example_rng(index, split)
        for _ in range(_MAX_DRAWS):
            template = int(rng.integers(len(_TEMPLATES)))
            text, solve, arity = _TEMPLATES[template]
            a, b, c = (int(x) for x in rng.integers(1, self.max_value + 1, 3))
            if template == 1:
                a, b = max(a, b), min(a, b)
            if arity == 2:
                c = 0
            else:
                c = min(c, a + b)
            if self.in_test_split(template, (a, b, c)) != (split == "test"):
                continue
            name = _NAMES[int(rng.integers(len(_NAMES)))]
            item = _ITEMS[int(rng.integers(len(_ITEMS)))]
            story = text.format(n=name, i=item, a=a, b=b, c=c)
            return {"prompt": story + _INSTRUCTION, "answer": str(solve(a, b, c))}
        raise ValueError(f"no {split} problem found in {_MAX_DRAWS} draws for {self}")

    def reward(self, completion: str, answer: str) -> float:
        """1.0 if the completion's final number equals the answer (see rewards.math)."""
        return numeric_match_reward(completion, answer)

    def sft_target(self, answer: str) -> str:
        """A supervised warm start teaches the bare number."""
        return answer
