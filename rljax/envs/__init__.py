"""Environments for multi-turn agentic RL: the environment interface, the tool registry with
its built-in tools, and the parsers that read tool calls out of a model's turn and format tool
results back in the same chat convention; `Episode` (one contained episode, a turn at a time)
and `run_episode`, which plays one with any policy callable; `GuessNumber`, the reference
multi-turn game. `rljax.envs.chat` lays episodes out in a model's chat convention and
`rljax.envs.episodes` plays them on the rollout engine."""

from rljax.envs.base import (
    EPISODE_FAILURE_KINDS,
    Environment,
    Episode,
    EpisodeResult,
    Policy,
    SingleTurn,
    Step,
    one_turn_reward,
    run_episode,
    tally,
)
from rljax.envs.guess_number import GuessNumber, guess_number_tasks
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
    "EPISODE_FAILURE_KINDS",
    "Episode",
    "Environment",
    "EpisodeResult",
    "Policy",
    "SingleTurn",
    "Step",
    "one_turn_reward",
    "run_episode",
    "tally",
    "GuessNumber",
    "guess_number_tasks",
]
