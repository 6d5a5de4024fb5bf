"""ToolArithmetic: word problems a model solves by calling a calculator tool, the tool-use
environment of the agent recipes.

Why: the tiny models of the built-in recipes cannot add three-digit numbers in their head, but
they can copy the operands into a calculator call and the result into an answer. Whether a
policy learns to call the tool (and to call it well-formed) is then exactly what decides its
success, which makes tool use measurable on CPU.

An episode: the question is the first observation. A turn with tool calls (in the convention
`tool_format`, parsed by `rljax.envs.tool_calls`) is answered with every call's result
(`format_tool_result`, one per line); a turn without calls is the final answer, scored 1.0
when its last integer equals the problem's and 0 otherwise, and ends the episode. Every call
that fails (malformed, unknown tool, bad arguments, an expression the calculator refuses)
costs `malformed_penalty` and is answered with its error line, so a policy learns to write
well-formed calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from rljax.envs.base import Policy, Step
from rljax.envs.tool_calls import FORMATS, format_tool_result, parse_tool_calls
from rljax.envs.tools import ToolRegistry, default_registry

_INTEGER = re.compile(r"-?\d+")
_DIGITS = re.compile(r"\d+")
# (operator, question): the questions `question_problem` reads; {n} name, {i} item.
TEMPLATES = (
    ("+", "{n} has {a} {i} and gets {b} more. How many {i} now?"),
    ("-", "{n} has {a} {i} and gives away {b}. How many are left?"),
    ("*", "{n} buys {a} boxes of {b} {i}. How many {i} in all?"),
)
_OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def split_problem(problem: str) -> tuple[str, str, str]:
    """(a, op, b) of a problem written "a<op>b" (op one of + - *), e.g. "347+589"."""
    match = re.fullmatch(r"(\d+)([-+*])(\d+)", problem)
    if not match:
        raise ValueError(f"problem {problem!r} is not written 'a+b', 'a-b' or 'a*b'")
    a, op, b = match.groups()
    return a, op, b


def problem_answer(problem: str) -> int:
    """The value of a problem written "a<op>b", e.g. "347+589" -> 936."""
    a, op, b = split_problem(problem)
    return _OPERATORS[op](int(a), int(b))


def calculator_call(expression: str, fmt: str) -> str:
    """The text of one well-formed calculator call on `expression` in convention `fmt`,
    written compactly (the scripted expert's turn)."""
    body = f'{{"name":"calculator","arguments":{{"expression":"{expression}"}}}}'
    if fmt in ("hermes", "qwen"):
        return f"<tool_call>{body}</tool_call>"
    if fmt == "json":
        return body
    if fmt == "gemma":
        return f'```tool_code\ncalculator(expression="{expression}")\n```'
    raise ValueError(f"unknown tool-call format {fmt!r}; known formats: {', '.join(FORMATS)}")


class ToolArithmetic:
    """One arithmetic word problem with a calculator. Task: {"question": str, "answer": int}.

    Args:
      tool_format: the tool-call convention (`rljax.envs.tool_calls.FORMATS`).
      malformed_penalty: reward subtracted per failed call.
      registry: the tools (default: the calculator alone).
    """

    def __init__(
        self,
        tool_format: str = "hermes",
        malformed_penalty: float = 0.1,
        registry: ToolRegistry | None = None,
    ) -> None:
        if tool_format not in FORMATS:
            raise ValueError(f"tool_format={tool_format!r} is not one of {FORMATS}")
        if malformed_penalty < 0:
            raise ValueError(f"malformed_penalty={malformed_penalty} must be >= 0")
        self.tool_format, self.malformed_penalty = tool_format, malformed_penalty
        self.registry = registry or default_registry()
        self._answer: int | None = None
        self._done = False

    def reset(self, task: Mapping[str, Any]) -> str:
        """Starts on `task`; the first observation is the question."""
        self._answer, self._done = int(task["answer"]), False
        return str(task["question"])

    def step(self, action: str) -> Step:
        """Runs the turn's tool calls, or scores it as the final answer when it has none.

        info: "calls" and "failed_calls" on a tool turn; "success" (bool) on the final answer.
        """
        if self._answer is None or self._done:
            raise RuntimeError("ToolArithmetic.step outside an episode: call reset(task) first")
        parsed = parse_tool_calls(action, self.tool_format)
        if not parsed.calls and not parsed.errors:
            numbers = _INTEGER.findall(action)
            success = bool(numbers) and int(numbers[-1]) == self._answer
            self._done = True
            return Step("", float(success), True, {"success": success})
        lines, failed = list(parsed.errors), len(parsed.errors)
        for call in parsed.calls:
            outcome = self.registry.call(call)
            failed += not outcome.ok
            lines.append(format_tool_result(call.name, outcome.content, self.tool_format))
        reward = 0.0 - self.malformed_penalty * failed  # 0.0, not -0.0, when none failed
        return Step("\n".join(lines), reward, False, {"calls": len(lines), "failed_calls": failed})


def tool_arithmetic_expert(kind: str, fmt: str, rng: np.random.Generator) -> Policy:
    """A scripted ToolArithmetic player that reads the problem from the question: "tool"
    calls the calculator and then answers with its result; "mixed" does that half the time
    and otherwise answers at once with the exact value, as a player who computes in their head
    (the SFT warm start of the recipe: a tiny model cannot, so only its calls win)."""
    if kind not in ("tool", "mixed"):
        raise ValueError(f"expert kind {kind!r} is not 'tool' or 'mixed'")
    calls = kind == "tool" or bool(rng.random() < 0.5)

    def policy(observations: list[str]) -> str:
        problem = question_problem(observations[0])
        if not calls:
            return str(problem_answer(problem))
        if len(observations) == 1:
            return calculator_call(problem, fmt)
        return _INTEGER.findall(observations[-1])[-1]

    return policy


def question_problem(question: str) -> str:
    """The problem "a<op>b" of a question written by `ToolArithmeticTask`."""
    a, b = _DIGITS.findall(question)[:2]
    op = next(op for op, text in TEMPLATES if _template_matches(text, question))
    return f"{a}{op}{b}"


def _template_matches(template: str, question: str) -> bool:
    pattern = re.escape(template)
    for field in ("n", "i", "a", "b"):
        pattern = pattern.replace(re.escape("{" + field + "}"), r"\w+")
    return re.fullmatch(pattern, question) is not None
