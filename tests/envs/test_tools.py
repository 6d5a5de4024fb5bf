"""Tool, ToolRegistry, the calculator and the sandboxed Python tool: schemas, every error kind,
truncation, calculator values against Python's own arithmetic, and rejected inputs."""

import math
import os
import sys
import time

import pytest

from rljax.envs import (
    ERROR_KINDS,
    Tool,
    ToolCall,
    ToolOutcome,
    ToolRegistry,
    ToolTimeout,
    calculator_tool,
    default_registry,
    python_tool,
)
from rljax.rewards.sandbox import run_python


def _echo_tool(**overrides) -> Tool:
    spec = dict(
        name="echo",
        description="Repeat a text n times.",
        parameters={
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "what to repeat"},
                "n": {"type": "integer", "description": "how often"},
                "sep": {"type": ["string", "null"], "description": "separator"},
            },
            "required": ["text"],
        },
        fn=lambda text, n=1, sep=None: (sep or "").join([text] * n),
    )
    return Tool(**{**spec, **overrides})


def _call(registry: ToolRegistry, name: str, **arguments) -> ToolOutcome:
    return registry.call(ToolCall(name, arguments, ""))


def test_register_names_schemas():
    reg = ToolRegistry()
    reg.register(_echo_tool())
    reg.register(calculator_tool())
    assert reg.names() == ["echo", "calculator"]
    schemas = reg.schemas()
    assert [s["type"] for s in schemas] == ["function", "function"]
    assert schemas[0]["function"] == {
        "name": "echo",
        "description": "Repeat a text n times.",
        "parameters": _echo_tool().parameters,
    }
    assert schemas[1]["function"]["parameters"]["required"] == ["expression"]
    schemas[0]["function"]["parameters"]["required"].append("n")  # a copy: registry unchanged
    assert reg.schemas()[0]["function"]["parameters"]["required"] == ["text"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register(_echo_tool(description="another"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"name": "bad name"}, "letters, digits"),
        ({"description": "two\nlines"}, "one line"),
        ({"parameters": {"properties": {}}}, "'type': 'object'"),
        ({"parameters": {"type": "object", "properties": {"x": {"type": "str"}}}}, "use one of"),
        ({"parameters": {"type": "object", "properties": {}, "required": ["x"]}}, "not in"),
    ],
)
def test_tool_definition_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        _echo_tool(**overrides)


def test_call_ok_and_argument_errors_by_kind():
    reg = ToolRegistry()
    reg.register(_echo_tool())
    assert _call(reg, "echo", text="ab", n=3, sep="-") == ToolOutcome("ab-ab-ab", True, None)
    assert _call(reg, "echo", text="ab", sep=None) == ToolOutcome("ab", True, None)
    cases = [
        ({}, "missing required argument(s) text"),
        ({"text": "a", "m": 1}, "unexpected argument(s) 'm'"),
        ({"text": 3}, "'text' must be string"),
        ({"text": "a", "n": 2.0}, "'n' must be integer"),
        ({"text": "a", "n": True}, "'n' must be integer"),  # bool is not a JSON integer
        ({"text": "a", "sep": 1}, "'sep' must be ['string', 'null']"),
    ]
    for arguments, message in cases:
        outcome = _call(reg, "echo", **arguments)
        assert (outcome.ok, outcome.error) == (False, "bad_arguments")
        assert message in outcome.content
    unknown = _call(reg, "nope", text="a")
    assert unknown == ToolOutcome("unknown tool 'nope'; known tools: echo", False, "unknown_tool")


def _raise(**_):
    raise RuntimeError("boom\nsecond line")


def _slow(**_):
    raise ToolTimeout("partial\n[timed out]")


def test_raising_timeout_and_non_string_tools_become_outcomes():
    reg = ToolRegistry()
    reg.register(_echo_tool(name="boom", fn=_raise))
    reg.register(_echo_tool(name="slow", fn=_slow))
    reg.register(_echo_tool(name="number", fn=lambda **_: 4))
    assert _call(reg, "boom", text="a") == ToolOutcome(
        "boom failed: RuntimeError: boom second line", False, "raised"
    )
    assert _call(reg, "slow", text="a") == ToolOutcome("partial\n[timed out]", False, "timeout")
    assert _call(reg, "number", text="a") == ToolOutcome(
        "number returned int, expected str", False, "raised"
    )
    assert ERROR_KINDS == ("unknown_tool", "bad_arguments", "raised", "timeout")


def test_truncation_marker_says_how_much_was_cut():
    reg = ToolRegistry(max_chars=10)
    reg.register(_echo_tool())
    out = _call(reg, "echo", text="0123456789", n=3)
    assert out == ToolOutcome("0123456789\n[... 20 more characters cut]", True, None)
    assert _call(reg, "echo", text="0123456789").content == "0123456789"  # exactly at the limit
    assert len(_call(reg, "nope").content) < 10 + 40  # errors are truncated too
    assert ToolRegistry().max_chars == 2000
    with pytest.raises(ValueError, match="max_chars=0"):
        ToolRegistry(max_chars=0)


CALC_EXPRESSIONS = [
    "2 + 3 * 4",
    "(2 + 3) * 4",
    "7 / 2",
    "6 / 3",
    "-7 // 2",
    "-7 % 3",
    "7.5 % 2",
    "2 ** 10",
    "2 ** -2",
    "-3 ** 2",
    "(-3) ** 3",
    "+-+4",
    "1 / 3",
    "0.1 + 0.2",
    "12345678901234567890 * 98765432109876543210",
    "3 ** 100 - 1",
    "1e10 / 4",
    "2 ** 0.5",
    "100 - 99.99",
]


@pytest.mark.parametrize("expression", CALC_EXPRESSIONS)
def test_calculator_matches_python_arithmetic(expression):
    expected = eval(expression, {"__builtins__": {}})  # trusted literal: the reference
    got = calculator_tool().fn(expression=expression)
    if isinstance(expected, int):
        assert got == str(expected)  # integers stay exact
    else:
        assert math.isclose(float(got), expected, rel_tol=1e-14, abs_tol=1e-14)
        assert len(got) <= 22  # no trailing noise: 15 significant digits at most


def test_calculator_formatting():
    calc = calculator_tool().fn
    assert [calc(expression=e) for e in ["7/2", "6/3", "0.1+0.2", "-0.0", "1/4"]] == [
        "3.5",
        "2",
        "0.3",
        "0",
        "0.25",
    ]


@pytest.mark.parametrize(
    "expression, message",
    [
        ("x + 1", "Name is not allowed"),
        ("abs(-1)", "Call is not allowed"),
        ("__import__('os').system('true')", "Call is not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("'a' * 3", "'a' is not allowed"),
        ("True + 1", "True is not allowed"),
        ("1j", "1j is not allowed"),
        ("[1][0]", "Subscript is not allowed"),
        ("1 << 10", "BinOp is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 101", "exponent 101"),
        ("9 ** 9 ** 9", "exponent 387420489"),
        ("(10 ** 90) ** 12", "more than 1000 digits"),
        ("(10**99) * (10**99) * (10**99) * (10**99) * (10**99) * (10**99) * (10**99) * (10**99)"
         " * (10**99) * (10**99) * (10**99)", "more than 1000 digits"),
        ("1e300 * 1e300", "overflows"),
        ("1e999", "overflows"),
        ("10 ** 100 * 10 ** 100 * 10 ** 100 * 10 ** 10 / 1", "overflows"),
        ("(-8) ** 0.5", "complex"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 201, "201 characters > 200"),
        ("1\x00", "not an arithmetic expression"),
    ],
)  # fmt: skip
def test_calculator_rejects(expression, message):
    start = time.monotonic()
    with pytest.raises(ValueError, match=message) as info:
        calculator_tool().fn(expression=expression)
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 1.0  # guards act before any blow-up


def test_calculator_errors_through_registry_are_raised_outcomes():
    reg = default_registry()
    assert reg.names() == ["calculator"]
    assert _call(reg, "calculator", expression="2**3") == ToolOutcome("8", True, None)
    out = _call(reg, "calculator", expression="__import__('os')")
    assert (out.ok, out.error) == (False, "raised") and "Call is not allowed" in out.content
    assert default_registry(python=True).names() == ["calculator", "python"]


@pytest.fixture(scope="module")
def sandbox():
    """Skip where the sandbox cannot run programs (it needs Linux and a working interpreter)."""
    if sys.platform != "linux":
        pytest.skip("rljax.rewards.sandbox runs programs only on Linux")
    probe = run_python("print('ok')", timeout_s=10.0)
    if probe.stdout != "ok\n":
        pytest.skip(f"the sandbox cannot run programs here: {probe.stderr[-200:]!r}")


def test_python_tool_prints_in_another_process(sandbox):
    reg = ToolRegistry()
    reg.register(python_tool(timeout_s=10.0))
    out = _call(reg, "python", code="import os\nprint(sum(range(10)), os.getpid())")
    assert out.ok and out.error is None
    total, pid = out.content.split()
    assert total == "45" and int(pid) != os.getpid()
    failed = _call(reg, "python", code="print('before')\n1/0")
    assert failed.ok and failed.content.startswith("before\n[exit status 1]\n")
    assert failed.content.endswith("ZeroDivisionError: division by zero")


def test_python_tool_infinite_loop_is_stopped(sandbox):
    reg = ToolRegistry()
    reg.register(python_tool(timeout_s=1.0))
    start = time.monotonic()
    out = _call(reg, "python", code="print('started', flush=True)\nwhile True:\n    pass")
    assert time.monotonic() - start < 8.0
    assert out == ToolOutcome("started\n[timed out after 1 s]", False, "timeout")
