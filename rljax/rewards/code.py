"""Execution-aware code reward: syntax, functional correctness, style and security of a program.

Implements (as an interpretation: only the abstract is available) the reward of "execution-aware
reward for code generation with PPO" (seed abstract "Large language models show strong potential
for automated code generation"): a customizable weighted sum of syntax, functional correctness,
code style and security components, and a token-level mapping that credits execution outcomes to
the tokens that caused them. The simulator-executability component of the paper (RoboEval) is
left out: it needs a robot simulator.

Components, each in [0, 1] (the rules are ours, marked interpretation):
  syntax: 1 if `ast.parse` accepts the code, else 0.
  functional: the fraction of MBPP-style tests (one `assert ...` statement each) that pass. The
    code and all tests run in one `sandbox.run_python` call; a harness executes the code, then
    each test in the code's namespace, and prints the per-test results as one JSON line tagged
    with a random nonce it reads from stdin before the code runs. Lines without the nonce (a
    program printing a forged result) are ignored. The nonce lives in the same process as the
    code, so code that digs through frames can still find it: this stops accidental and naive
    forgery, not a determined adversary.
  style: max(0, 1 - 0.2 * violations), counting: each line longer than 100 characters, each
    unused import, each bare `except:`, each `from m import *`, each `== None` / `!= None`.
  security: 1 if the static scan (`security_findings`) finds nothing, else 0.

Total: the weighted sum with weights normalized to sum 1 (default functional 0.7, syntax, style
and security 0.1 each), gated to 0 when the program did not run to the end of the harness: a
syntax error, a timeout, a memory or output limit, a fatal signal, an uncaught exception at
module level, or an early exit. Executability gates the rest (interpretation).
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from rljax.rewards.base import RewardFn
from rljax.rewards.sandbox import run_python

DEFAULT_WEIGHTS = {"syntax": 0.1, "functional": 0.7, "style": 0.1, "security": 0.1}
MAX_LINE_LENGTH = 100
STYLE_COST = 0.2
"""Style score lost per violation."""

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("python", "python3", "py")
_TAG = "@@rljax-result"
_SOLUTION_FILE = "solution.py"
_SOLUTION_LINE = re.compile(r'File "solution\.py", line (\d+)')

# Runs inside the sandbox. It reads the nonce before the untrusted code runs, and keeps
# os.write so that a program replacing sys.stdout cannot silence the result line.
_HARNESS = """
import json, os, sys, traceback

def _solution_line(err):
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__)
             if f.filename == {solution_file!r}]
    return lines[-1] if lines else None

def _run(tag, write):
    ns = {{"__name__": "solution"}}
    exec(compile({source!r}, {solution_file!r}, "exec"), ns)
    results = []
    for i, test in enumerate({tests!r}):
        try:
            exec(compile(test, f"<test {{i}}>", "exec"), ns)
            results.append([True, None, None])
        except BaseException as err:
            results.append([False, type(err).__name__, _solution_line(err)])
    sys.stdout.flush()
    write(1, ("\\n" + tag + " " + json.dumps(results) + "\\n").encode())

_run({tag!r} + " " + sys.stdin.readline().strip(), os.write)
"""


class CodeReward(NamedTuple):
    """The reward of one completion and what it is made of.

    total: the gated weighted sum, in [0, 1].
    syntax, functional, style, security: the components, each in [0, 1].
    reason: "ok", or what went wrong first ("syntax error at line 3: ...", "timeout", "memory",
      "output", "signal:SIGSEGV", "runtime error at line 4: ZeroDivisionError",
      "2 of 3 tests failed", ...).
    error_line: 1-based line of the code blamed for the failure (syntax error, uncaught
      exception, or first failing test's innermost frame in the code), or None.
    code_offset: character offset of the extracted code within the completion.
    passed, n_tests: tests that passed, tests run.
    findings: the security scan's findings, "line N: name".
    """

    total: float
    syntax: float
    functional: float
    style: float
    security: float
    reason: str
    error_line: int | None
    code_offset: int
    passed: int
    n_tests: int
    findings: tuple[str, ...]


def extract_code(completion: str) -> tuple[str, int]:
    """The program in a completion and its character offset there.

    The first ```python (```py, ```python3) fenced block; else the first fenced block of any
    language; else the whole completion.
    """
    blocks = list(_FENCE.finditer(completion))
    tagged = [m for m in blocks if m.group(1).strip().lower() in _PYTHON_TAGS]
    chosen = (tagged or blocks or [None])[0]
    if chosen is None:
        return completion, 0
    return chosen.group(2), chosen.start(2)


def parse_tests(answer: str) -> list[str]:
    """MBPP-style tests from a reward `answer`: a JSON list of strings, or one test per line."""
    text = answer.strip()
    if text.startswith("["):
        tests = json.loads(text)
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"answer {text[:80]!r} is JSON but not a list of test strings")
    else:
        tests = text.splitlines()
    tests = [t.strip() for t in tests if t.strip()]
    if not tests:
        raise ValueError("answer holds no tests; give one assert per line or a JSON list")
    return tests


def style_violations(code: str, tree: ast.Module) -> list[str]:
    """Violations of the style rule in the module docstring, "line N: what"."""
    found = [
        f"line {i}: line longer than {MAX_LINE_LENGTH}"
        for i, line in enumerate(code.splitlines(), 1)
        if len(line) > MAX_LINE_LENGTH
    ]
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    found.append(f"line {node.lineno}: wildcard import")
                    continue
                bound = alias.asname or alias.name.split(".")[0]
                if bound not in used:
                    found.append(f"line {node.lineno}: unused import {bound}")
        elif isinstance(node, ast.ExceptHandler) and node.type is None:
            found.append(f"line {node.lineno}: bare except")
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                is_none = isinstance(right, ast.Constant) and right.value is None
                if is_none and isinstance(op, (ast.Eq, ast.NotEq)):
                    found.append(f"line {node.lineno}: comparison to None with == or !=")
    return found


# Calls flagged by the security scan, by their fully qualified dotted name; a name ending in "."
# flags every attribute of that module.
_DANGEROUS_CALLS = (
    "eval", "exec", "compile", "__import__", "os.system", "os.popen", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "os.exec", "os.spawn", "os.posix_spawn", "shutil.rmtree",
    "pickle.loads", "pickle.load", "marshal.loads", "subprocess.", "socket.", "ctypes.",
    "multiprocessing.", "pty.",
)  # fmt: skip
_DANGEROUS_MODULES = ("subprocess", "socket", "ctypes", "multiprocessing", "pty")
_WRITE_MODES = set("wax+")


def _dotted(node: ast.expr, aliases: Mapping[str, str]) -> str | None:
    """ "os.system" for `os.system` (through import aliases), None for other expressions."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _is_dangerous(name: str) -> bool:
    for pattern in _DANGEROUS_CALLS:
        if pattern.endswith("."):
            if name.startswith(pattern):
                return True
        elif name == pattern or (pattern in ("os.exec", "os.spawn") and name.startswith(pattern)):
            return True
    return False


def _writes_outside(call: ast.Call) -> bool:
    """An `open(path, mode)` writing to a constant absolute path or one that climbs with ..."""
    args = list(call.args) + [k.value for k in call.keywords if k.arg in ("file", "mode")]
    if len(args) < 2:
        return False
    path, mode = args[0], args[1]
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return False
    if not _WRITE_MODES & set(mode.value):
        return False
    if not (isinstance(path, ast.Constant) and isinstance(path.value, str)):
        return False
    return path.value.startswith(("/", "~")) or ".." in path.value.split("/")


def security_findings(tree: ast.Module) -> list[str]:
    """Static scan for dangerous code: "line N: name" for each finding.

    Flags imports of subprocess, socket, ctypes, multiprocessing and pty; calls of eval, exec,
    compile, __import__, os.system/popen/fork/kill/exec*/spawn*/posix_spawn, shutil.rmtree,
    pickle/marshal loads and anything in the flagged modules (import aliases followed); and
    open() in a write mode on a constant absolute path or one with "..".
    """
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                if alias.name.split(".")[0] in _DANGEROUS_MODULES:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in _DANGEROUS_MODULES:
                found.append(f"line {node.lineno}: import from {node.module}")
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name is not None and _is_dangerous(name):
            found.append(f"line {node.lineno}: {name}")
        elif name == "open" and _writes_outside(node):
            found.append(f"line {node.lineno}: open for writing outside the working directory")
    return sorted(set(found), key=lambda f: (int(f.split()[1].rstrip(":")), f))


def _normalized(weights: Mapping[str, float]) -> dict[str, float]:
    unknown = set(weights) - set(DEFAULT_WEIGHTS)
    if unknown:
        raise ValueError(f"unknown weight keys {sorted(unknown)}; use {sorted(DEFAULT_WEIGHTS)}")
    full = {k: float(weights.get(k, 0.0)) for k in DEFAULT_WEIGHTS}
    if any(w < 0 for w in full.values()) or sum(full.values()) <= 0:
        raise ValueError(f"weights {dict(weights)} must be non-negative with a positive sum")
    total = sum(full.values())
    return {k: w / total for k, w in full.items()}


def _runtime_error(stderr: str) -> tuple[str, int | None]:
    """("runtime error at line N: ExcType", N) from a traceback on stderr."""
    lines = _SOLUTION_LINE.findall(stderr)
    line = int(lines[-1]) if lines else None
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
    kind = last.split(":")[0].strip()
    where = f" at line {line}" if line is not None else ""
    return f"runtime error{where}: {kind}", line


def code_reward(
    completion: str,
    tests: Sequence[str],
    *,
    weights: Mapping[str, float] = DEFAULT_WEIGHTS,
    timeout_s: float = 2.0,
    memory_mb: int = 256,
) -> CodeReward:
    """Execution-aware reward of a completion against MBPP-style assert tests.

    Args:
      completion: model output; its code is found by `extract_code`.
      tests: one or more test statements (e.g. "assert f(2) == 4").
      weights: component weights by name (syntax, functional, style, security; missing = 0),
        normalized to sum 1.
      timeout_s: wall-clock limit for the code and all tests together.
      memory_mb: address-space limit of the sandbox.

    Returns:
      A `CodeReward` (see the module docstring for the rules).
    """
    if not tests:
        raise ValueError("got no tests; pass at least one assert statement")
    w = _normalized(weights)
    code, offset = extract_code(completion)
    n = len(tests)

    def result(
        reason,
        line=None,
        syntax=1.0,
        functional=0.0,
        style=0.0,
        security=0.0,
        passed=0,
        findings=(),
        ran=False,
    ) -> CodeReward:
        """The CodeReward; the total is 0 unless the harness ran to the end (`ran`)."""
        parts = {"syntax": syntax, "functional": functional, "style": style, "security": security}
        total = sum(w[k] * v for k, v in parts.items()) if ran else 0.0
        return CodeReward(
            total,
            syntax,
            functional,
            style,
            security,
            reason,
            line,
            offset,
            passed,
            n,
            tuple(findings),
        )

    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return result(f"syntax error at line {err.lineno}: {err.msg}", err.lineno, syntax=0.0)
    style = max(0.0, 1.0 - STYLE_COST * len(style_violations(code, tree)))
    findings = security_findings(tree)
    security = 0.0 if findings else 1.0
    nonce = secrets.token_hex(16)
    harness = _HARNESS.format(
        solution_file=_SOLUTION_FILE, source=code, tests=list(tests), tag=_TAG
    )
    run = run_python(harness, timeout_s=timeout_s, memory_mb=memory_mb, stdin=nonce + "\n")
    partial = {"style": style, "security": security, "findings": findings}
    if run.killed_reason is not None:
        return result(run.killed_reason, **partial)
    prefix = f"{_TAG} {nonce} "
    reports = [line for line in run.stdout.splitlines() if line.startswith(prefix)]
    if not reports:
        if run.returncode != 0:
            return result(*_runtime_error(run.stderr), **partial)
        return result("no test results: the program exited before the tests ran", **partial)
    outcomes = json.loads(reports[-1][len(prefix) :])
    passed = sum(ok for ok, _, _ in outcomes)
    failed = [(kind, line) for ok, kind, line in outcomes if not ok]
    reason = "ok" if not failed else f"{len(failed)} of {n} tests failed ({failed[0][0]})"
    line = failed[0][1] if failed else None
    return result(reason, line, functional=passed / n, passed=passed, ran=True, **partial)


def code_reward_fn(
    weights: Mapping[str, float] = DEFAULT_WEIGHTS,
    *,
    timeout_s: float = 2.0,
    memory_mb: int = 256,
) -> RewardFn:
    """A `RewardFn` (prompt, completion, answer) -> total `code_reward`, with `answer` holding
    the tests as parsed by `parse_tests`; the prompt is not used."""
    _normalized(weights)  # fail at construction, not in the training loop

    def reward_fn(prompt: str, completion: str, answer: str) -> float:
        del prompt
        return code_reward(
            completion,
            parse_tests(answer),
            weights=weights,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
        ).total

    return reward_fn


def token_level_rewards(
    completion: str,
    reward: CodeReward,
    char_offsets: np.ndarray,
    *,
    line_penalty: float = 0.5,
) -> np.ndarray:
    """Map a `CodeReward` onto the completion's tokens (the paper's token-level reward mapping).

    Rule (interpretation): the last token gets `reward.total`; when the reward blames a line of
    the code (`reward.error_line`: a syntax error, an uncaught exception, or the first failing
    test's innermost frame in the code), the tokens whose character spans overlap that line of
    the completion share a penalty of `line_penalty`, split equally, so the penalty mass does not
    depend on how the line was tokenized. Everything else is 0.

    Args:
      completion: the text the reward was computed on.
      reward: its `CodeReward`.
      char_offsets: [T, 2] int, (start, end) character span of each completion token.
      line_penalty: total penalty on the blamed line, >= 0.

    Returns:
      rewards: [T] float32.
    """
    offsets = np.asarray(char_offsets)
    if offsets.ndim != 2 or offsets.shape[1] != 2:
        raise ValueError(f"char_offsets has shape {offsets.shape}; expected [T, 2] (start, end)")
    if line_penalty < 0:
        raise ValueError(f"line_penalty={line_penalty} must be >= 0")
    rewards = np.zeros(len(offsets), np.float32)
    if len(offsets) == 0:
        return rewards
    rewards[-1] = reward.total
    if reward.error_line is None:
        return rewards
    code_lines = completion[reward.code_offset :].split("\n")
    if not 1 <= reward.error_line <= len(code_lines):
        return rewards
    start = reward.code_offset + sum(len(s) + 1 for s in code_lines[: reward.error_line - 1])
    end = start + len(code_lines[reward.error_line - 1])
    covering = (offsets[:, 0] < max(end, start + 1)) & (offsets[:, 1] > start)
    if covering.any():
        rewards[covering] -= line_penalty / covering.sum()
    return rewards
