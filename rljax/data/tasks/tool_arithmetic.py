"""Arithmetic word problems solved with a calculator tool, as an episodic task: the examples
the driver trains on, and the `rljax.envs.tool_arithmetic.ToolArithmetic` episode of each."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from rljax.data.tasks.generated import GeneratedSplits
from rljax.data.tasks.split_hash import unit_hash
from rljax.envs.base import Policy
from rljax.envs.tool_arithmetic import (
    TEMPLATES,
    ToolArithmetic,
    problem_answer,
    split_problem,
    tool_arithmetic_expert,
)

_MAX_DRAWS = 1000
_INTEGER = re.compile(r"-?\d+")
# Names of 3 letters and items of 5: with fixed-width operands, every number of a template's
# question sits at the same distance from the question's end.
_NAMES = ("Tom", "Mia", "Ali", "Ben", "Eva", "Sam")
_ITEMS = ("coins", "cards", "books", "pears", "beads", "plums")


def _operands(op: str, rng: np.random.Generator) -> tuple[int, int]:
    """Operands whose result has 3 digits: sums of two 3-digit numbers below 500,
    differences of 3-digit numbers at least 100 apart, a 2-digit times a 1-digit number."""
    if op == "+":
        a, b = (int(x) for x in rng.integers(100, 500, 2))
    elif op == "-":
        a = int(rng.integers(200, 1000))
        b = int(rng.integers(100, a - 99))
    else:
        while True:
            a, b = int(rng.integers(12, 100)), int(rng.integers(2, 10))
            if a * b >= 100:
                break
    return a, b


@dataclasses.dataclass(frozen=True)
class ToolArithmeticTask(GeneratedSplits):
    """ToolArithmetic as an episodic task the driver trains on (`task.name="tool_arithmetic"`).

    An example's answer is its problem and story, "a<op>b;name;item" (so `env_task` can
    rebuild the episode from it) and its prompt the question; train and test are disjoint by
    a fixed hash of (operator, a, b).

    Why fixed widths: every operand of one operator, and every result, has the same number of
    digits (`_operands`), and names and items the same number of letters, so copying a number
    into a call, or the calculator's result into the answer, is a lookup at a fixed distance.
    The tiny models of the CPU recipes learn that in a short warm start; copying numbers found
    by content at varying distances, they do not (measured: every copied digit stayed at
    chance after 600 SFT steps).

    Attributes:
      max_turns: turns before the episode is cut off (reward so far).
      tool_format: the tool-call convention of calls and results.
      malformed_penalty: reward subtracted per failed call.
      expert: the scripted policy of the SFT warm start ("tool" or "mixed").
      seed, test_fraction, test_size: as every generated task (`GeneratedSplits`).
    """

    max_turns: int = 3
    tool_format: str = "hermes"
    malformed_penalty: float = 0.1
    expert: str = "mixed"
    seed: int = 0
    test_fraction: float = 0.1
    test_size: int = 256

    def __post_init__(self):
        if self.max_turns < 2:
            raise ValueError(f"max_turns={self.max_turns} must be at least 2 (call, answer)")
        self.check_split_settings()
        ToolArithmetic(self.tool_format, self.malformed_penalty)  # checks both
        tool_arithmetic_expert(self.expert, self.tool_format, np.random.default_rng(0))

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=the question, answer="a<op>b;name;item"), deterministic in the index."""
        rng = self.example_rng(index, split)
        for _ in range(_MAX_DRAWS):
            template = int(rng.integers(len(TEMPLATES)))
            op, _ = TEMPLATES[template]
            a, b = _operands(op, rng)
            if (unit_hash(template, a, b) < self.test_fraction) != (split == "test"):
                continue
            name = _NAMES[int(rng.integers(len(_NAMES)))]
            item = _ITEMS[int(rng.integers(len(_ITEMS)))]
            answer = f"{a}{op}{b};{name};{item}"
            return {"prompt": self.env_task(answer)["question"], "answer": answer}
        raise ValueError(f"no {split} problem found in {_MAX_DRAWS} draws for {self}")

    def make_env(self) -> ToolArithmetic:
        """A fresh episode with the calculator."""
        return ToolArithmetic(self.tool_format, self.malformed_penalty)

    def env_task(self, answer: str) -> dict[str, Any]:
        """The episode of the example whose answer is `answer`: its question and value."""
        problem, name, item = answer.split(";")
        a, op, b = split_problem(problem)
        text = next(text for o, text in TEMPLATES if o == op)
        question = text.format(n=name, i=item, a=a, b=b)
        return {"question": question, "answer": problem_answer(problem)}

    def reward(self, completion: str, answer: str) -> float:
        """1.0 when the last integer of `completion` (a single-turn answer) is the value."""
        numbers = _INTEGER.findall(completion)
        value = problem_answer(answer.split(";")[0])
        return float(bool(numbers) and int(numbers[-1]) == value)

    def sft_target(self, answer: str) -> str:
        """A single-turn target: the value (the episodic warm start plays `expert_policy`)."""
        return str(problem_answer(answer.split(";")[0]))

    def expert_policy(self, rng: np.random.Generator) -> Policy:
        """The warm start's scripted player for one episode."""
        return tool_arithmetic_expert(self.expert, self.tool_format, rng)
