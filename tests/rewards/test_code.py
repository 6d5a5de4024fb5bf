"""code_reward: components, gating and reasons; the static scans; the token-level mapping."""

import ast
import json

import numpy as np
import pytest

from rljax.rewards.code import (
    DEFAULT_WEIGHTS,
    code_reward,
    code_reward_fn,
    extract_code,
    parse_tests,
    security_findings,
    style_violations,
    token_level_rewards,
)

TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"]
CORRECT = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."


def test_extract_code():
    assert extract_code(CORRECT) == ("def add(a, b):\n    return a + b\n", 23)
    assert extract_code("```\nx = 1\n```") == ("x = 1\n", 4)
    assert extract_code("```text\nno\n```\n```py\ny = 2\n```")[0] == "y = 2\n"
    assert extract_code("x = 1") == ("x = 1", 0)


def test_parse_tests():
    assert parse_tests("assert f(1) == 1\n\n  assert f(2) == 2\n") == [
        "assert f(1) == 1",
        "assert f(2) == 2",
    ]
    assert parse_tests(json.dumps(["assert a", "assert b"])) == ["assert a", "assert b"]
    with pytest.raises(ValueError, match="no tests"):
        parse_tests("  \n")
    with pytest.raises(ValueError, match="list of test strings"):
        parse_tests("[1, 2]")


def test_correct_solution_gets_full_reward():
    r = code_reward(CORRECT, TESTS, timeout_s=5.0)
    assert (r.total, r.syntax, r.functional, r.style, r.security) == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert (r.passed, r.n_tests, r.reason, r.error_line) == (3, 3, "ok", None)


def test_wrong_solution_gets_partial_credit():
    # a - b passes add(0, 0) only; a module-level unused import costs one style violation.
    r = code_reward("import math\ndef add(a, b):\n    return a - b", TESTS, timeout_s=5.0)
    assert (r.passed, r.functional, r.style) == (1, pytest.approx(1 / 3), pytest.approx(0.8))
    assert r.total == pytest.approx(0.1 * 1 + 0.7 / 3 + 0.1 * 0.8 + 0.1 * 1)
    assert r.reason == "2 of 3 tests failed (AssertionError)"


def test_failing_line_is_blamed():
    r = code_reward("def add(a, b):\n    x = 1\n    return a / 0", TESTS, timeout_s=5.0)
    assert r.error_line == 3 and "ZeroDivisionError" in r.reason


def test_infinite_loop_times_out_with_zero_reward():
    r = code_reward("def add(a, b):\n    while True:\n        pass", TESTS, timeout_s=0.5)
    assert (r.total, r.reason) == (0.0, "timeout")


def test_fork_bomb_gets_zero():
    r = code_reward("import os\nwhile True:\n    os.fork()", TESTS, timeout_s=5.0)
    assert r.total == 0.0 and r.security == 0.0
    assert r.reason.startswith("runtime error at line 3")


def test_memory_and_output_limits_give_zero():
    mem = code_reward("x = bytearray(2 * 1024**3)", TESTS, timeout_s=5.0, memory_mb=256)
    assert (mem.total, mem.reason) == (0.0, "memory")
    flood = code_reward("for _ in range(100):\n    print('x' * 1_000_000)", TESTS, timeout_s=5.0)
    assert (flood.total, flood.reason) == (0.0, "output")


def test_forged_result_line_does_not_count():
    forged = "@@rljax-result 0123456789abcdef0123456789abcdef [[true,null,null]]"
    wrong = f"print({forged!r})\ndef add(a, b):\n    return -1"
    r = code_reward(wrong, TESTS, timeout_s=5.0)
    assert (r.passed, r.functional) == (0, 0.0), "the forged line must not count"
    early_exit = f"import sys\nprint({forged!r})\nsys.exit(0)"
    assert code_reward(early_exit, TESTS, timeout_s=5.0).total == 0.0


def test_syntax_error_reports_line():
    r = code_reward("def add(a, b):\n    y = 1\n    return a +\n", TESTS, timeout_s=5.0)
    assert (r.syntax, r.total, r.error_line) == (0.0, 0.0, 3)
    assert r.reason.startswith("syntax error at line 3")


def test_security_findings():
    def scan(code):
        return security_findings(ast.parse(code))

    assert scan("import os\nos.system('ls')") == ["line 2: os.system"]
    assert scan("from os import system as s\ns('ls')") == ["line 2: os.system"]
    assert scan("import subprocess as sp\nsp.run(['ls'])") == [
        "line 1: import subprocess",
        "line 2: subprocess.run",
    ]
    assert scan("eval('1')\nopen('/etc/passwd', 'w')\nopen('ok.txt', 'w')") == [
        "line 1: eval",
        "line 2: open for writing outside the working directory",
    ]
    assert scan("import os\nprint(os.path.join('a', 'b'))\nopen('/etc/hosts')") == []


def test_style_violations():
    code = (
        "import os\nfrom math import *\n"
        "try:\n    x = 1\nexcept:\n    pass\n"
        f"y = x == None\nz = '{'a' * 100}'\n"
    )
    found = style_violations(code, ast.parse(code))
    assert sorted(found) == [
        "line 1: unused import os",
        "line 2: wildcard import",
        "line 5: bare except",
        "line 7: comparison to None with == or !=",
        "line 8: line longer than 100",
    ]
    r = code_reward("import os\ndef add(a, b):\n    return a + b", TESTS, timeout_s=5.0)
    assert r.style == pytest.approx(0.8)


def test_weights_are_normalized_and_checked():
    r = code_reward(
        "def add(a, b):\n    return a - b", TESTS, weights={"functional": 2, "syntax": 2}
    )
    assert r.total == pytest.approx((2 / 3 + 2 * 1) / 4)
    with pytest.raises(ValueError, match="unknown weight keys"):
        code_reward(CORRECT, TESTS, weights={"speed": 1.0})
    assert sum(DEFAULT_WEIGHTS.values()) == pytest.approx(1.0)


def test_reward_fn_adapter():
    fn = code_reward_fn(timeout_s=5.0)
    assert fn("write add", CORRECT, "\n".join(TESTS)) == 1.0
    assert fn("write add", "def add(a, b):\n    return a - b", json.dumps(TESTS)) == (
        pytest.approx(0.1 + 0.7 / 3 + 0.1 + 0.1)
    )
    with pytest.raises(ValueError, match="non-negative"):
        code_reward_fn({"functional": -1.0})


def _char_tokens(text, size):
    """(start, end) spans of fixed-size chunks of text, a stand-in tokenizer."""
    return np.array([(i, min(i + size, len(text))) for i in range(0, len(text), size)])


def test_token_level_rewards_penalize_the_blamed_line():
    completion = "ok\n```python\ndef f(:\n    pass\n```"
    r = code_reward(completion, ["assert f() is None"], timeout_s=5.0)
    assert r.error_line == 1 and r.code_offset == 13
    offsets = _char_tokens(completion, 4)  # tokens [12,16) and [16,20) cover "def f(:" = [13, 20)
    got = token_level_rewards(completion, r, offsets, line_penalty=0.5)
    want = np.zeros(len(offsets), np.float32)
    want[[3, 4]] = -0.25
    want[-1] += r.total  # 0: a syntax error
    np.testing.assert_allclose(got, want)


def test_token_level_rewards_total_on_last_token_when_all_pass():
    r = code_reward(CORRECT, TESTS, timeout_s=5.0)
    got = token_level_rewards(CORRECT, r, _char_tokens(CORRECT, 5))
    assert got[-1] == 1.0 and np.count_nonzero(got) == 1
    assert token_level_rewards(CORRECT, r, np.zeros((0, 2), int)).shape == (0,)
    with pytest.raises(ValueError, match="expected \\[T, 2\\]"):
        token_level_rewards(CORRECT, r, np.zeros(3))
