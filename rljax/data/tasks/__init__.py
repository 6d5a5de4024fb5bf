"""Synthetic verifiable tasks, the `Task` protocol the pipelines read, and a name registry."""

from __future__ import annotations

import difflib
from typing import Any, Protocol, runtime_checkable

from rljax.data.tasks.addition import AdditionTask
from rljax.data.tasks.code_feedback import CodeFeedbackTask
from rljax.data.tasks.countdown import CountdownTask
from rljax.data.tasks.gaussian_mixture import GaussianMixtureTask
from rljax.data.tasks.gymnasium_task import GymnasiumTask
from rljax.data.tasks.local import LocalTask
from rljax.data.tasks.logic import LogicTask
from rljax.data.tasks.skyrl_task import SkyRLTask
from rljax.data.tasks.tool_arithmetic import ToolArithmeticTask
from rljax.data.tasks.word_problems import WordProblemTask
from rljax.envs.guess_number import GuessNumberTask


@runtime_checkable
class Task(Protocol):
    """A verifiable task: indexed problems per split, an exact reward and an SFT target."""

    splits: tuple[str, ...]

    def split_size(self, split: str) -> int | None:
        """Examples in `split`, or None when the split is unbounded (generated on demand)."""
        ...

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=..., answer=...), deterministic in the task's seed, split and index."""
        ...

    def reward(self, completion: str, answer: str) -> float:
        """Reward of a decoded completion given the reference answer."""
        ...

    def sft_target(self, answer: str) -> str:
        """The completion text a supervised warm start teaches for `answer`."""
        ...


# Optional task methods the driver uses when present:
#   difficulty(index, split) -> int: a difficulty level, for `prompt_selection.name=curriculum`;
#   group_rewards(completions, answer) -> [G] rewards: scores a prompt's samples together;
#   reward_components(completion, answer) -> K numbers, named by `reward_component_names`: the
#     parts of a reward that multi-reward methods (GDPO, GPRL) normalise one by one;
#   source(index, split) -> str: where an example comes from ("train.jsonl line 7"), for errors.


# Every built-in task, by `task.name`.
TASKS: dict[str, type] = {
    "addition": AdditionTask,
    "code_feedback": CodeFeedbackTask,
    "countdown": CountdownTask,
    "gaussian_mixture": GaussianMixtureTask,
    "guess_number": GuessNumberTask,
    "gymnasium": GymnasiumTask,
    "local": LocalTask,
    "logic": LogicTask,
    "skyrl_gym": SkyRLTask,
    "tool_arithmetic": ToolArithmeticTask,
    "word_problems": WordProblemTask,
}


def get_task(name: str, **kwargs: Any) -> Task:
    """The task registered as `name`, built with `kwargs` (e.g. get_task("addition", seed=1))."""
    if name not in TASKS:
        close = difflib.get_close_matches(name, TASKS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown task {name!r}{hint}; known tasks: {sorted(TASKS)}. New tasks "
            "are registered in rljax/data/tasks/__init__.py"
        )
    return TASKS[name](**kwargs)


__all__ = [
    "AdditionTask",
    "CodeFeedbackTask",
    "CountdownTask",
    "GaussianMixtureTask",
    "GymnasiumTask",
    "LocalTask",
    "LogicTask",
    "SkyRLTask",
    "TASKS",
    "ToolArithmeticTask",
    "Task",
    "WordProblemTask",
    "get_task",
]
