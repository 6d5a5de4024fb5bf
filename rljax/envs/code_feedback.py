"""CodeFeedback: the model writes a function, sees what the sandbox's tests say about it, and
may revise it: the code-with-execution-feedback environment of the agent recipes.

Each turn's program (the first fenced block of the turn, or the whole turn) runs in
`rljax.rewards.sandbox.run_python` with the task's tests, never in the trainer. All tests
passing ends the episode with reward 1. Otherwise the observation is the test report, one line
per failing test ("f(0) returned 3, expected 7", "f(2) raised ZeroDivisionError") or the error
that stopped the program (a syntax error, an exception at module level, a timeout), and the
model may revise, up to `attempts` programs; the last failing one ends the episode with reward
0 and `info["success"] = False`.

Why the report is built here and not read from the program's output: a program can print
anything, "all tests passed" included. The harness reads a random nonce from stdin before the
program runs and prints one JSON line tagged with it after the tests (as `rljax.rewards.code`
does); the report is built from that line alone, and a run without it is an error.
"""

from __future__ import annotations

import ast
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from rljax.envs.base import Step
from rljax.rewards.code import extract_code
from rljax.rewards.sandbox import ExecResult, run_python

_TAG = "@@rljax-tests"
_REPORT_LINES = 3
_ERROR_CHARS = 120

# Runs in the sandbox: the nonce is read before the program runs; each test is a call
# expression evaluated in the program's namespace and compared with its expected value.
_HARNESS = """
import json, os, sys

def _run(tag, write):
    ns = {{"__name__": "solution"}}
    exec(compile({source!r}, "solution.py", "exec"), ns)
    report = []
    for call, expected in {tests!r}:
        try:
            got = eval(call, ns)
        except BaseException as err:
            report.append([call, None, type(err).__name__])
            continue
        report.append([call, None if got == expected else repr(got)[:40], None])
    sys.stdout.flush()
    write(1, ("\\n" + tag + " " + json.dumps(report) + "\\n").encode())

_run({tag!r} + " " + sys.stdin.readline().strip(), os.write)
"""


def _last_error_line(stderr: str) -> str:
    """The exception line of a traceback ("ZeroDivisionError: division by zero")."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1][:_ERROR_CHARS] if lines else "no output"


def test_report(
    result: ExecResult, nonce: str, tests: Sequence[tuple[str, Any]]
) -> tuple[bool, str]:
    """(all tests passed, the report shown to the model) of one harness run."""
    tagged = f"{_TAG} {nonce} "
    lines = [line for line in result.stdout.splitlines() if line.startswith(tagged)]
    if result.killed_reason is not None:
        return False, f"the program was stopped: {result.killed_reason}"
    if not lines:
        return False, f"error: {_last_error_line(result.stderr)}"
    report = json.loads(lines[-1][len(tagged) :])
    failures = []
    for (call, got, raised), (_, expected) in zip(report, tests, strict=True):
        if raised is not None:
            failures.append(f"{call} raised {raised}")
        elif got is not None:
            failures.append(f"{call} returned {got}, expected {expected!r}")
    if not failures:
        return True, "all tests passed"
    more = len(failures) - _REPORT_LINES
    shown = failures[:_REPORT_LINES] + ([f"... and {more} more"] if more > 0 else [])
    return False, "\n".join(shown)


class CodeFeedback:
    """Write a function that passes the task's tests, revising on the sandbox's report.

    Task: {"prompt": str, "tests": [[call, expected], ...]}, each call a Python expression
    (e.g. "f(0)") and expected a literal value it must equal.

    Args:
      attempts: programs allowed (2: the first and one revision).
      timeout_s, memory_mb: the sandbox's limits per run.
    """

    def __init__(self, attempts: int = 2, timeout_s: float = 2.0, memory_mb: int = 256):
        if attempts < 1:
            raise ValueError(f"attempts={attempts} must be at least 1")
        self.attempts, self.timeout_s, self.memory_mb = attempts, timeout_s, memory_mb
        self._tests: list[tuple[str, Any]] | None = None
        self._tried = 0

    def reset(self, task: Mapping[str, Any]) -> str:
        """Starts on `task` (its tests checked: call expressions, literal expected values);
        the first observation is the prompt."""
        tests = []
        for call, expected in task["tests"]:
            ast.parse(call, mode="eval")  # SyntaxError on a malformed call
            ast.literal_eval(repr(expected))  # ValueError on a non-literal value
            tests.append((str(call), expected))
        if not tests:
            raise ValueError("a CodeFeedback task needs at least one test")
        self._tests, self._tried = tests, 0
        return str(task["prompt"])

    def step(self, action: str) -> Step:
        """Runs the turn's program against the tests.

        info: "attempt" (1-based), "success" (bool) when the episode ends.
        """
        if self._tests is None or self._tried >= self.attempts:
            raise RuntimeError("CodeFeedback.step outside an episode: call reset(task) first")
        self._tried += 1
        code, _ = extract_code(action)
        nonce = secrets.token_hex(16)
        program = _HARNESS.format(source=code, tests=self._tests, tag=_TAG)
        result = run_python(
            program, timeout_s=self.timeout_s, memory_mb=self.memory_mb, stdin=nonce + "\n"
        )
        passed, report = test_report(result, nonce, self._tests)
        done = passed or self._tried >= self.attempts
        info = {"attempt": self._tried, **({"success": passed} if done else {})}
        return Step(report, float(passed), done, info)
