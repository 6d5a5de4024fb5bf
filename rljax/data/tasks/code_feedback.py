"""Secret-constant functions, written and revised on sandbox feedback, as an episodic task.

Each problem asks for `f(x)` that adds a secret number to x, or multiplies x by one. The prompt
does not say which number, so a first program is a guess; the sandbox's test report ("f(0)
returned 3, expected 7") says what the tests expected, and a revision that reads it passes.
Success therefore measures whether a policy uses execution feedback, which is what the recipe
trains, on a problem a tiny byte-level model can write code for.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from rljax.data.tasks.generated import GeneratedSplits
from rljax.envs.base import Policy
from rljax.envs.code_feedback import CodeFeedback

# kind -> (prompt, the function's body, its value, the tests' inputs, the secret's range). The
# last input makes f's value the secret itself, so a failing report ends with it ("... expected
# 7"), and a program names its constant first ("k=7" on its first line): a revision copies the
# number from four tokens back. At the end of a one-line program, 20 tokens back, the tiny
# model did not learn the copy from SFT, as the tool recipe's varying widths did not.
_KINDS = {
    "add": (
        "Write f(x) that adds a secret number to x.",
        "x+k",
        lambda x, k: x + k,
        (5, 0),
        (0, 9),
    ),
    "mul": (
        "Write f(x) that multiplies x by a secret number.",
        "x*k",
        lambda x, k: x * k,
        (3, 1),
        (2, 9),
    ),
}
_EXPECTED = re.compile(r"expected (-?\d+)")


def secret_function(kind: str, k: int) -> str:
    """The program "k=<k>\ndef f(x): return x+k" (kind "add") or `x*k` ("mul")."""
    return f"k={k}\ndef f(x): return {_KINDS[kind][1]}"


def code_feedback_expert(kind: str, rng: np.random.Generator) -> Policy:
    """A scripted CodeFeedback player for the secret-constant task: its first program guesses
    the secret uniformly; "reader" revises with the value the last failing test expected
    (f(0) or f(1) is the secret itself), "guesser" reads it in half of its episodes and
    guesses again in the other half (the SFT warm start of the recipe, which RL improves)."""
    if kind not in ("reader", "guesser"):
        raise ValueError(f"expert kind {kind!r} is not 'reader' or 'guesser'")
    reads = kind == "reader" or bool(rng.random() < 0.5)

    def policy(observations: list[str]) -> str:
        fn = next(k for k, spec in _KINDS.items() if spec[0] == observations[0])
        low, high = _KINDS[fn][4]
        expected = _EXPECTED.findall(observations[-1])
        if len(observations) > 1 and reads and expected:
            return secret_function(fn, int(expected[-1]))
        return secret_function(fn, int(rng.integers(low, high + 1)))

    return policy


@dataclasses.dataclass(frozen=True)
class CodeFeedbackTask(GeneratedSplits):
    """CodeFeedback on secret-constant functions (`task.name="code_feedback"`).

    An example's answer is "<kind>;<secret>" ("add;7") and its prompt the kind's request; the
    test split draws from another seed (19 problems in all: what is held out is the draw), so
    of `GeneratedSplits` it takes the split sizes and seeding, not the hashed split.

    Attributes:
      max_turns: programs per episode (2: one revision).
      expert: the scripted policy of the SFT warm start ("guesser" or "reader").
      timeout_s: the sandbox's limit per program.
      seed: seeds the draws.
      test_size: examples in the test split (train is unbounded).
    """

    max_turns: int = 2
    expert: str = "guesser"
    timeout_s: float = 2.0
    seed: int = 0
    test_size: int = 256

    def __post_init__(self):
        if self.max_turns < 1 or self.test_size < 1 or not self.timeout_s > 0:
            raise ValueError(
                f"max_turns={self.max_turns}, test_size={self.test_size}, timeout_s="
                f"{self.timeout_s}: all must be positive"
            )
        code_feedback_expert(self.expert, np.random.default_rng(0))  # checks the kind

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=the request, answer="<kind>;<secret>"), from (seed, split, index)."""
        rng = self.example_rng(index, split)
        kind = sorted(_KINDS)[int(rng.integers(len(_KINDS)))]
        low, high = _KINDS[kind][4]
        answer = f"{kind};{int(rng.integers(low, high + 1))}"
        return {"prompt": _KINDS[kind][0], "answer": answer}

    def make_env(self) -> CodeFeedback:
        """A fresh episode with `max_turns` attempts."""
        return CodeFeedback(attempts=self.max_turns, timeout_s=self.timeout_s)

    def env_task(self, answer: str) -> dict[str, Any]:
        """The episode of the example whose answer is `answer`: its prompt and tests."""
        kind, secret = answer.split(";")
        prompt, _, value, inputs, _ = _KINDS[kind]
        tests = [[f"f({x})", value(x, int(secret))] for x in inputs]
        return {"prompt": prompt, "tests": tests}

    def reward(self, completion: str, answer: str) -> float:
        """1.0 when `completion` is the expected program (a single-turn check, by text)."""
        return float(completion.strip() == self.sft_target(answer))

    def sft_target(self, answer: str) -> str:
        """The program that passes (the episodic warm start plays `expert_policy` instead)."""
        kind, secret = answer.split(";")
        return secret_function(kind, int(secret))

    def expert_policy(self, rng: np.random.Generator) -> Policy:
        """The warm start's scripted player for one episode."""
        return code_feedback_expert(self.expert, rng)
