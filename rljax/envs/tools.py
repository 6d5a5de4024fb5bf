"""Tools an agent may call during a rollout: the registry that checks and runs calls, and two
built-in tools (a calculator and a sandboxed Python runner).

Why: a policy in RL writes whatever calls it likes, so every way a call can go wrong (unknown
tool, bad arguments, a tool that raises or runs too long, a flood of output) has to come back as
a `ToolOutcome` the environment can show the model and score, never as an exception that stops
the rollout. Untrusted code never runs in the trainer process: the calculator walks an `ast` of
plain arithmetic, and the Python tool runs code in `rljax.rewards.sandbox.run_python`.
"""

from __future__ import annotations

import ast
import copy
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from rljax.envs.tool_calls import ToolCall
from rljax.rewards.sandbox import run_python

ERROR_KINDS = ("unknown_tool", "bad_arguments", "raised", "timeout")
"""Values of `ToolOutcome.error` for a failed call."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_RESULT_DIGITS = 1000
_STDERR_TAIL_CHARS = 1000


class ToolTimeout(Exception):
    """Raised by a tool whose work ran past its time limit; the registry reports it as a
    "timeout" outcome with the exception's message (which may hold partial output) as content."""


@dataclass(frozen=True)
class Tool:
    """A callable tool as the model sees it.

    name: the name calls use.
    description: one line, shown to the model in the tool schema.
    parameters: a JSON schema of the arguments, {"type": "object", "properties": {arg:
      {"type": ..., "description": ...}}, "required": [...]}; "type" may be a list of types.
    fn: called as fn(**arguments) with checked arguments; returns the result text.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str]

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "a").replace("-", "a").isalnum():
            raise ValueError(f"tool name {self.name!r} must be letters, digits, _ and - only")
        if "\n" in self.description:
            raise ValueError(f"tool {self.name!r}: the description must be one line")
        props = self.parameters.get("properties")
        if self.parameters.get("type") != "object" or not isinstance(props, dict):
            raise ValueError(
                f"tool {self.name!r}: parameters must be {{'type': 'object', 'properties': {{}}}}"
            )
        for arg, spec in props.items():
            types = spec.get("type") if isinstance(spec, dict) else None
            types = types if isinstance(types, list) else [types]
            if not all(t in _JSON_TYPES for t in types):
                raise ValueError(
                    f"tool {self.name!r}: argument {arg!r} has type {spec!r}; "
                    f"use one of {sorted(_JSON_TYPES)}"
                )
        missing = set(self.parameters.get("required", ())) - set(props)
        if missing:
            raise ValueError(f"tool {self.name!r}: required {sorted(missing)} not in properties")


class ToolOutcome(NamedTuple):
    """What a call produced: `content` (the text shown to the model, truncated), `ok`, and
    `error`, one of `ERROR_KINDS` when not ok, else None."""

    content: str
    ok: bool
    error: str | None


def _one_line(text: str) -> str:
    """`text` with every run of whitespace, newlines included, made one space."""
    return " ".join(text.split())


def _then_line(output: str, line: str) -> str:
    """`output` followed by `line` on a line of its own."""
    return f"{output}\n{line}" if output and not output.endswith("\n") else output + line


def _type_ok(value: Any, types: str | list[str]) -> bool:
    """Whether `value` has one of the JSON `types` (bool is not an integer or number here)."""
    for t in types if isinstance(types, list) else [types]:
        if isinstance(value, _JSON_TYPES[t]) and (t == "boolean" or not isinstance(value, bool)):
            return True
    return False


def _argument_error(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """What is wrong with `arguments` for `tool` (one line), or None."""
    props = tool.parameters["properties"]
    missing = [a for a in tool.parameters.get("required", ()) if a not in arguments]
    if missing:
        return f"{tool.name}: missing required argument(s) {', '.join(missing)}"
    unexpected = [a for a in arguments if a not in props]
    if unexpected:
        return (
            f"{tool.name}: unexpected argument(s) {', '.join(map(repr, unexpected))}; "
            f"expected {', '.join(props) or 'none'}"
        )
    for arg, value in arguments.items():
        if not _type_ok(value, props[arg]["type"]):
            return f"{tool.name}: argument {arg!r} must be {props[arg]['type']}, got {value!r:.40}"
    return None


class ToolRegistry:
    """Tools by name; `call` checks a parsed call against the tool's schema and runs it.

    Args:
      max_chars: outcome content longer than this is cut to its first `max_chars` characters,
        followed by a line saying how many were cut.
    """

    def __init__(self, max_chars: int = 2000) -> None:
        if max_chars <= 0:
            raise ValueError(f"max_chars={max_chars} must be positive")
        self.max_chars = max_chars
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> None:
        """Add `tool`; ValueError if a tool of that name is already registered."""
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas, the `tools` that chat templates render."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": copy.deepcopy(t.parameters),
                },
            }
            for t in self._tools.values()
        ]

    def _truncate(self, content: str) -> str:
        cut = len(content) - self.max_chars
        if cut <= 0:
            return content
        return f"{content[: self.max_chars]}\n[... {cut} more characters cut]"

    def call(self, tool_call: ToolCall) -> ToolOutcome:
        """Run one parsed call; every failure becomes an outcome, none propagates (but
        KeyboardInterrupt and SystemExit, which are not failures of the tool)."""
        tool = self._tools.get(tool_call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            msg = f"unknown tool {tool_call.name!r}; known tools: {known}"
            return ToolOutcome(self._truncate(msg), False, "unknown_tool")
        problem = _argument_error(tool, tool_call.arguments)
        if problem:
            return ToolOutcome(self._truncate(problem), False, "bad_arguments")
        try:
            content = tool.fn(**tool_call.arguments)
        except ToolTimeout as err:
            return ToolOutcome(self._truncate(str(err)), False, "timeout")
        except Exception as err:  # noqa: BLE001 - a tool failure is an outcome, never a crash
            msg = _one_line(f"{tool.name} failed: {type(err).__name__}: {err}")
            return ToolOutcome(self._truncate(msg), False, "raised")
        if not isinstance(content, str):
            msg = f"{tool.name} returned {type(content).__name__}, expected str"
            return ToolOutcome(msg, False, "raised")
        return ToolOutcome(self._truncate(content), True, None)


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _checked(value: Any) -> int | float:
    """`value` if it is a finite real within the digit limit; ValueError otherwise."""
    if isinstance(value, complex):
        raise ValueError("the result is a complex number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result overflows a float")
    if isinstance(value, int) and value.bit_length() * math.log10(2) > MAX_RESULT_DIGITS:
        raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    return value


def _eval_node(node: ast.AST) -> int | float:
    """The value of an arithmetic `ast` node; ValueError on anything but numbers and operators."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)  # 1e999 parses as inf
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is beyond +-{MAX_EXPONENT}")
            if isinstance(left, int) and left.bit_length() * right * 0.302 > MAX_RESULT_DIGITS:
                raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("the result overflows a float") from None
    what = type(node).__name__ if not isinstance(node, ast.Constant) else repr(node.value)
    raise ValueError(f"{what} is not allowed; use numbers, + - * / // % ** and parentheses")


def _format_number(value: int | float) -> str:
    """Integers exactly; floats to 15 significant digits: 7/2 -> 3.5, 6/3 -> 2, 0.1+0.2 -> 0.3."""
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    return format(value, ".15g")


def _calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (see `calculator_tool`)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression has {len(expression)} characters > {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression ({err.msg})") from None
    except ValueError:  # null bytes
        raise ValueError("not an arithmetic expression (null byte)") from None
    return _format_number(_eval_node(tree.body))


def calculator_tool() -> Tool:
    """A "calculator" tool: `expression` with numbers, + - * / // % **, unary +/- and parentheses.

    Evaluated by walking its `ast` (no eval: names, calls, attributes are refused). Integers
    stay exact; floats are shown to 15 significant digits. Guards: at most
    `MAX_EXPRESSION_CHARS` characters, |exponent| <= `MAX_EXPONENT`, integer results of at most
    `MAX_RESULT_DIGITS` digits (checked before a power is computed), finite float results.
    Errors raise ValueError with a one-line message.
    """
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        parameters={
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. (3 + 4) * 2 ** 10 / 7"}
            },
            "required": ["expression"],
        },
        fn=_calculate,
    )


def python_tool(
    timeout_s: float = 5.0, memory_mb: int = 256, hidden_paths: Sequence[str] = ()
) -> Tool:
    """A "python" tool that runs the `code` argument with `rljax.rewards.sandbox.run_python`.

    The program runs in its own limited subprocess, never in the trainer. The content is its
    stdout; when it exits non-zero or is killed (memory, output flood, signal), a line saying so
    and the last characters of stderr follow. Past `timeout_s` the tool raises `ToolTimeout`
    with the output so far and a timeout line, which the registry reports as "timeout".

    Args:
      timeout_s: wall-clock limit per run, seconds.
      memory_mb: address-space limit per run, MiB.
      hidden_paths: further directories the program must not read (see `run_python`).
    """

    def run(code: str) -> str:
        res = run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, hidden_paths=hidden_paths)
        if res.timed_out:
            raise ToolTimeout(_then_line(res.stdout, f"[timed out after {timeout_s:g} s]"))
        if res.returncode == 0 and res.killed_reason is None:
            return res.stdout
        status = res.killed_reason or f"exit status {res.returncode}"
        tail = res.stderr[-_STDERR_TAIL_CHARS:]
        return _then_line(res.stdout, f"[{status}]\n{tail}").rstrip("\n")

    return Tool(
        name="python",
        description="Run a Python program in a sandbox and return what it prints.",
        parameters={
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "the program; print the results"}
            },
            "required": ["code"],
        },
        fn=run,
    )


def default_registry(*, python: bool = False, max_chars: int = 2000) -> ToolRegistry:
    """A registry with the calculator, and the sandboxed Python tool when `python` is True."""
    registry = ToolRegistry(max_chars=max_chars)
    registry.register(calculator_tool())
    if python:
        registry.register(python_tool())
    return registry
