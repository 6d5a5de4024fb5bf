"""parse_tool_calls and format_tool_result: exact calls, raw spans, one error per malformed call,
remaining text, aliases and unknown formats, for the hermes/qwen, json and gemma conventions."""

import json

import pytest

from rljax.envs import FORMATS, ParseResult, ToolCall, format_tool_result, parse_tool_calls

B1 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
B2 = '<tool_call>\n{"name": "search", "arguments": {"query": "jax", "k": 3}}\n</tool_call>'


@pytest.mark.parametrize("fmt", ["hermes", "qwen"])
def test_hermes_several_calls_exact(fmt):
    text = f"Let me compute.\n{B1}\nand look up:\n{B2}\n"
    res = parse_tool_calls(text, fmt)
    assert res == ParseResult(
        calls=[
            ToolCall("calculator", {"expression": "2 + 2"}, B1),
            ToolCall("search", {"query": "jax", "k": 3}, B2),
        ],
        errors=[],
        text="Let me compute.\n\nand look up:",
    )
    for call in res.calls:
        assert call.raw in text


def test_hermes_arguments_as_json_string_and_missing_arguments():
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>'
    text += '<tool_call>{"name": "g"}</tool_call>'
    res = parse_tool_calls(text, "hermes")
    assert [(c.name, c.arguments) for c in res.calls] == [("f", {"a": [1, 2]}), ("g", {})]
    assert res.errors == [] and res.text == ""


@pytest.mark.parametrize(
    "block, message",
    [
        ("<tool_call>{bad json}</tool_call>", "invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "arguments is a JSON list"),
        ('<tool_call>{"name": "f", "arguments": null}</tool_call>', "not an object"),
        ('<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>', "not an object"),
        ('<tool_call>{"name": "f", "arguments": "{x"}</tool_call>', "string but not a JSON"),
        ('<tool_call>["f", {}]</tool_call>', "not an object"),
        ('<tool_call>{"name": "f", "arguments": {}', "unclosed <tool_call>"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "nested too deeply"),
    ],
)
def test_hermes_each_malformed_call_gives_one_error_line(block, message):
    res = parse_tool_calls(f"before\n{B1}\n{block}\n", "hermes")
    assert res.calls == [ToolCall("calculator", {"expression": "2 + 2"}, B1)]
    assert len(res.errors) == 1 and "\n" not in res.errors[0]
    assert res.errors[0].startswith("hermes: ") and message in res.errors[0]
    assert res.text == "before"  # the malformed block is removed too


def test_hermes_unclosed_block_swallows_rest_and_no_calls_is_plain_text():
    res = parse_tool_calls(f'{B1} then <tool_call>\n{{"name": "f"}}\nmore text', "hermes")
    assert len(res.calls) == 1 and len(res.errors) == 1 and res.text == "then"
    assert parse_tool_calls("  The answer is 4.  ", "qwen") == ParseResult(
        [], [], "The answer is 4."
    )


def test_json_single_object_list_and_fence():
    obj = '{"name": "calculator", "arguments": {"expression": "1+1"}}'
    assert parse_tool_calls(f"  {obj}\n", "json") == ParseResult(
        [ToolCall("calculator", {"expression": "1+1"}, obj)], [], ""
    )
    a, b = '{"name": "a", "arguments": {}}', '{"name": "b", "parameters": {"x": 1.5}}'
    res = parse_tool_calls(f"```json\n[ {a} ,\n {b}]\n```", "json")
    assert res == ParseResult([ToolCall("a", {}, a), ToolCall("b", {"x": 1.5}, b)], [], "")


@pytest.mark.parametrize(
    "answer", ["The answer is 4.", "42", '"yes"', "[1, 2, 3]", "{not json", "[]"]
)
def test_json_plain_answers_give_no_calls_and_no_errors(answer):
    assert parse_tool_calls(f"\n{answer}\n", "json") == ParseResult([], [], answer)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"arguments": {}}', 'missing "name"'),
        ('{"name": "f", "arguments": 3}', "arguments is a JSON int"),
        ('{"name": "f", "arguments": {}, "parameters": {}}', "both"),
        ("```json\n{broken\n```", "invalid JSON"),
    ],
)
def test_json_malformed_call_gives_one_error(text, message):
    res = parse_tool_calls(text, "json")
    assert res.calls == [] and res.text == ""
    assert len(res.errors) == 1 and message in res.errors[0] and res.errors[0].startswith("json:")


def test_json_list_with_a_bad_element():
    res = parse_tool_calls('[{"name": "a"}, 7, {"name": "b", "arguments": "{}"}]', "json")
    assert [(c.name, c.arguments, c.raw) for c in res.calls] == [
        ("a", {}, '{"name": "a"}'),
        ("b", {}, '{"name": "b", "arguments": "{}"}'),
    ]
    assert len(res.errors) == 1 and "JSON int" in res.errors[0]


def test_gemma_calls_exact():
    text = (
        "Checking.\n```tool_code\n"
        'get_weather(city="Paris", days=3)\n\n'
        "  [add(a=1, b=-2.5), flags(on=True, xs=(1, 2), m={'k': None})]\n"
        "```\nDone."
    )
    res = parse_tool_calls(text, "gemma")
    assert res == ParseResult(
        calls=[
            ToolCall("get_weather", {"city": "Paris", "days": 3},
                     'get_weather(city="Paris", days=3)'),
            ToolCall("add", {"a": 1, "b": -2.5}, "add(a=1, b=-2.5)"),
            ToolCall("flags", {"on": True, "xs": [1, 2], "m": {"k": None}},
                     "flags(on=True, xs=(1, 2), m={'k': None})"),
        ],
        errors=[],
        text="Checking.\n\nDone.",
    )  # fmt: skip
    for call in res.calls:
        assert call.raw in text


@pytest.mark.parametrize(
    "line, message",
    [
        ("f(1)", "positional"),
        ("f(x=y)", "not a literal"),
        ("f(x=__import__('os'))", "not a literal"),
        ("f(x=1+2j)", "not a literal"),
        ("f(x={1, 2})", "not a literal"),
        ("f(a=1, a=2)", "repeated"),
        ("f(**kw)", "unpacking"),
        ("os.system(cmd='ls')", "plain function name"),
        ("x = f(a=1)", "not a Python expression"),
        ("import os", "not a Python expression"),
        ("42", "plain function name"),
        ("f(" * 500 + ")" * 500, "not a Python expression"),
    ],
)
def test_gemma_each_malformed_line_gives_one_error(line, message):
    res = parse_tool_calls(f"```tool_code\nok(a=1)\n{line}\n```", "gemma")
    assert res.calls == [ToolCall("ok", {"a": 1}, "ok(a=1)")]
    assert len(res.errors) == 1 and "\n" not in res.errors[0]
    assert res.errors[0].startswith("gemma: ") and message in res.errors[0]


def test_gemma_unclosed_block_and_other_fences():
    res = parse_tool_calls("hi\n```tool_code\nf(a=1)\n", "gemma")
    assert res.calls == [] and len(res.errors) == 1 and "unclosed" in res.errors[0]
    assert res.text == "hi"
    python_block = "```python\nf(a=1)\n```"
    assert parse_tool_calls(python_block, "gemma") == ParseResult([], [], python_block)


def test_no_code_is_executed():
    res = parse_tool_calls("```tool_code\nf(x=print('pwned'))\n```", "gemma")
    assert res.calls == [] and len(res.errors) == 1


def test_unknown_format_names_known_ones():
    with pytest.raises(ValueError, match="hermes, qwen, json, gemma"):
        parse_tool_calls("x", "llama")
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        format_tool_result("f", "x", "xml")
    assert FORMATS == ("hermes", "qwen", "json", "gemma")


CONTENT = 'line 1\n{"a": 1} <tool_call> ```'


def test_format_tool_result_exact():
    wrapped = f"<tool_response>\n{CONTENT}\n</tool_response>"
    assert format_tool_result("calc", CONTENT, "hermes") == wrapped
    assert format_tool_result("calc", CONTENT, "qwen") == wrapped
    assert format_tool_result("calc", CONTENT, "gemma") == f"```tool_output\n{CONTENT}\n```"
    assert json.loads(format_tool_result("calc", CONTENT, "json")) == {
        "name": "calc",
        "content": CONTENT,
    }


@pytest.mark.parametrize("fmt", ["hermes", "gemma"])
def test_tool_result_round_trip_is_not_a_call(fmt):
    """A result message fed back through the parser holds no calls and keeps its content."""
    body = format_tool_result("calc", "4", fmt)
    res = parse_tool_calls(body, fmt)
    assert res.calls == [] and res.errors == [] and "4" in res.text
