"""Environments for multi-turn agentic RL: the environment interface, the tool registry with
its built-in tools, and the parsers that read tool calls out of a model's turn and format tool
results back in the same chat convention."""

from rljax.envs.tool_calls import (
    FORMATS,
    ParseResult,
    ToolCall,
    format_tool_result,
    parse_tool_calls,
)
from rljax.envs.tools import (
    ERROR_KINDS,
    Tool,
    ToolOutcome,
    ToolRegistry,
    ToolTimeout,
    calculator_tool,
    default_registry,
    python_tool,
)

__all__ = [
    "FORMATS",
    "ParseResult",
    "ToolCall",
    "format_tool_result",
    "parse_tool_calls",
    "ERROR_KINDS",
    "Tool",
    "ToolOutcome",
    "ToolRegistry",
    "ToolTimeout",
    "calculator_tool",
    "default_registry",
    "python_tool",
]
