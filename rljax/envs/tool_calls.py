"""Tool calls in a model's turn: parse them out of the text, and format tool results back.

Why: in multi-turn agentic RL the policy acts by writing tool calls inside its turn, in whatever
convention its chat template taught it. The environment has to find those calls, tell
well-formed ones from malformed ones (a malformed call is a policy error to report, never a
crash), and answer in the same convention. Parsing never executes anything: JSON is decoded,
Python-style calls are read with `ast` and `ast.literal_eval`.

Conventions (`fmt`):
  "hermes" (alias "qwen"): each call is a JSON object {"name": ..., "arguments": {...}} between
    `<tool_call>` and `</tool_call>` tags, one object per block, any number of blocks; a result
    goes back as `<tool_response>\\n{content}\\n</tool_response>`. This is the Hermes 2 Pro
    function-calling format that Qwen adopted: the Qwen2.5/Qwen3 chat templates ask for
    "a json object with function name and arguments within <tool_call></tool_call> XML tags"
    and render role "tool" messages inside <tool_response> tags (Qwen docs, "Function
    Calling", qwen.readthedocs.io/en/v2.5/framework/function_call.html; vLLM parses it with
    `--tool-call-parser hermes`).
  "json": the whole turn (optionally inside one ```json fenced block) is one call object or a
    list of them, the bare-JSON style of e.g. Llama 3.1's JSON tool calling (which names the
    arguments "parameters"; accepted as an alias). A turn that is not JSON, a JSON scalar or a
    list without objects is a plain answer (no calls, no error); a ```json fence that does not
    decode is a malformed call. A result goes back as {"name": ..., "content": ...}.
  "gemma": Gemma 3 has no tool tokens; its documented prompt convention wraps calls in a
    ```tool_code fenced block of Python-style calls, `name(arg=value, ...)`, and expects the
    result back in a ```tool_output fenced block (Google AI for Developers, "Gemma function
    calling" and the Gemma cookbook example ai.google.dev/gemma/docs/meme-generator). One
    call per line; a line may also hold a list of calls, `[f(a=1), g(b=2)]`, the form the
    "Function calling with Gemma" guide (ai.google.dev/gemma/docs/capabilities/function-calling)
    prompts for. Only keyword arguments with literal values are accepted.

Shared rules: a call's "arguments" must decode to a JSON object; a string holding a JSON object
is decoded (some models emit arguments that way); missing arguments mean {}. An unclosed block
at the end of the turn is a malformed call. Malformed calls produce exactly one error line each
and are removed from `ParseResult.text` like well-formed ones.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, NamedTuple

FORMATS = ("hermes", "qwen", "json", "gemma")
"""Known conventions; "qwen" is an alias of "hermes"."""

_ALIASES = {"qwen": "hermes"}
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_GEMMA_OPEN = re.compile(r"```tool_code[ \t]*\n")
_FENCE_CLOSE = "```"
_JSON_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n(.*?)\n?```\Z", re.DOTALL)
_SNIPPET_CHARS = 60


class ToolCall(NamedTuple):
    """One well-formed call: the tool `name`, its `arguments` (JSON-typed values) and `raw`,
    the exact span of the turn it came from (the whole `<tool_call>` block for hermes, the
    call's own JSON object or `name(...)` expression for json and gemma, whose blocks may hold
    several calls)."""

    name: str
    arguments: dict[str, Any]
    raw: str


class ParseResult(NamedTuple):
    """What a turn held: `calls` in order, `errors` (one line per malformed call) and `text`,
    the turn with every call block removed, stripped."""

    calls: list[ToolCall]
    errors: list[str]
    text: str


def _canonical(fmt: str) -> str:
    """`fmt` with aliases resolved; ValueError naming the known formats if unknown."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; known formats: {', '.join(FORMATS)}")
    return _ALIASES.get(fmt, fmt)


def _error(fmt: str, what: str, source: str) -> str:
    """One error line: the format, what was wrong, and the start of the offending source."""
    snippet = source if len(source) <= _SNIPPET_CHARS else source[:_SNIPPET_CHARS] + "..."
    return f"{fmt}: {' '.join(what.split())} in {snippet!r}"


class _BadJSON(ValueError):
    """Text that does not decode as JSON (too deep a nesting included)."""


def _decode(source: str) -> Any:
    """json.loads, with every decoding failure as a one-line `_BadJSON`."""
    try:
        return json.loads(source)
    except json.JSONDecodeError as err:
        raise _BadJSON(f"invalid JSON ({err})") from None
    except RecursionError:
        raise _BadJSON("invalid JSON (nested too deeply)") from None


def _call_from_object(obj: Any) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of a decoded call object; ValueError saying what is malformed."""
    if not isinstance(obj, dict):
        raise ValueError(f"call is a JSON {type(obj).__name__}, not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError('missing "name" (a non-empty string)')
    if "arguments" in obj and "parameters" in obj:
        raise ValueError('both "arguments" and "parameters" given')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = _decode(args)
        except _BadJSON as err:
            raise ValueError(f"arguments is a string but not a JSON object: {err}") from None
    if not isinstance(args, dict):
        raise ValueError(f"arguments is a JSON {type(args).__name__}, not an object")
    return name.strip(), args


def _parse_hermes(text: str) -> ParseResult:
    """Every `<tool_call>` block, in order; an unclosed one runs to the end of the text."""
    calls, errors, kept = [], [], []
    pos = 0
    while (start := text.find(_HERMES_OPEN, pos)) != -1:
        kept.append(text[pos:start])
        body_start = start + len(_HERMES_OPEN)
        end = text.find(_HERMES_CLOSE, body_start)
        if end == -1:
            errors.append(_error("hermes", "unclosed <tool_call>", text[start:]))
            pos = len(text)
            break
        pos = end + len(_HERMES_CLOSE)
        raw = text[start:pos]
        try:
            name, args = _call_from_object(_decode(text[body_start:end]))
        except ValueError as err:
            errors.append(_error("hermes", str(err), raw))
        else:
            calls.append(ToolCall(name, args, raw))
    kept.append(text[pos:])
    return ParseResult(calls, errors, "".join(kept).strip())


def _array_elements(source: str) -> list[str] | None:
    """The source text of each element of the JSON array `source`, or None if it is not one."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    pos = ws.match(source, 1).end()
    if source[pos] == "]":
        return []
    elements = []
    while True:
        _, end = decoder.raw_decode(source, pos)
        elements.append(source[pos:end])
        pos = ws.match(source, end).end()
        if source[pos] == "]":
            return elements
        pos = ws.match(source, pos + 1).end()  # past the ","


def _parse_json(text: str) -> ParseResult:
    """The whole turn as one call object or a list of them; anything else is a plain answer."""
    stripped = text.strip()
    fenced = _JSON_FENCE.match(stripped)
    source = fenced.group(1).strip() if fenced else stripped
    try:
        value = _decode(source)
    except _BadJSON as err:
        if fenced:  # a fenced ```json block is an attempted call, not prose
            return ParseResult([], [_error("json", str(err), source)], "")
        return ParseResult([], [], stripped)
    if isinstance(value, dict):
        items, spans = [value], [source]
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        items, spans = value, _array_elements(source)
    else:
        return ParseResult([], [], stripped)
    calls, errors = [], []
    for item, raw in zip(items, spans, strict=True):
        try:
            calls.append(ToolCall(*_call_from_object(item), raw))
        except ValueError as err:
            errors.append(_error("json", str(err), raw))
    return ParseResult(calls, errors, "")


def _gemma_calls(node: ast.expr, line: str) -> list[ToolCall]:
    """The calls in one parsed line: a call, or a list/tuple of calls; ValueError otherwise."""
    nodes = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = []
    for call in nodes:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise ValueError("not a call of a plain function name")
        if call.args:
            raise ValueError(f"{call.func.id}: positional arguments; use name=value")
        args: dict[str, Any] = {}
        for kw in call.keywords:
            if kw.arg is None:
                raise ValueError(f"{call.func.id}: ** unpacking is not allowed")
            if kw.arg in args:
                raise ValueError(f"{call.func.id}: argument {kw.arg!r} repeated")
            try:
                value = ast.literal_eval(kw.value)
                args[kw.arg] = json.loads(json.dumps(value))  # tuples -> lists, JSON types only
            except (ValueError, TypeError, SyntaxError, RecursionError):
                raise ValueError(f"{call.func.id}: {kw.arg} is not a literal JSON value") from None
        calls.append(ToolCall(call.func.id, args, ast.get_source_segment(line, call) or line))
    return calls


def _parse_gemma(text: str) -> ParseResult:
    """Every ```tool_code block; each non-empty line holds a call or a list of calls."""
    calls, errors, kept = [], [], []
    pos = 0
    while match := _GEMMA_OPEN.search(text, pos):
        kept.append(text[pos : match.start()])
        end = text.find(_FENCE_CLOSE, match.end())
        if end == -1:
            errors.append(_error("gemma", "unclosed ```tool_code block", text[match.start() :]))
            pos = len(text)
            break
        pos = end + len(_FENCE_CLOSE)
        for line in text[match.end() : end].splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                calls.extend(_gemma_calls(ast.parse(line, mode="eval").body, line))
            except SyntaxError as err:
                errors.append(_error("gemma", f"not a Python expression ({err.msg})", line))
            except (RecursionError, MemoryError):
                errors.append(_error("gemma", "expression nested too deeply", line))
            except ValueError as err:  # also ast.parse on null bytes
                errors.append(_error("gemma", str(err), line))
    kept.append(text[pos:])
    return ParseResult(calls, errors, "".join(kept).strip())


_PARSERS = {"hermes": _parse_hermes, "json": _parse_json, "gemma": _parse_gemma}


def parse_tool_calls(text: str, fmt: str) -> ParseResult:
    """Find the tool calls in one model turn.

    Args:
      text: the turn as decoded from the model (special tokens such as <tool_call> kept).
      fmt: the convention, one of `FORMATS` (see the module docstring).

    Returns:
      A `ParseResult`: well-formed calls in order of appearance, one error line per malformed
      call, and the turn's remaining text.
    """
    return _PARSERS[_canonical(fmt)](text)


def format_tool_result(name: str, content: str, fmt: str) -> str:
    """The body of the message that returns a tool's result, in the convention `fmt`.

    Args:
      name: the tool that produced `content` (only the json convention carries it).
      content: the tool's output text.
      fmt: the convention, one of `FORMATS`.

    Returns:
      hermes/qwen: `<tool_response>\\n{content}\\n</tool_response>`; json: the JSON object
      {"name": name, "content": content}; gemma: a ```tool_output fenced block. The chat
      template that wraps this body as a turn is applied elsewhere.
    """
    fmt = _canonical(fmt)
    if fmt == "hermes":
        return f"<tool_response>\n{content}\n</tool_response>"
    if fmt == "json":
        return json.dumps({"name": name, "content": content}, ensure_ascii=False)
    return f"```tool_output\n{content}\n```"
