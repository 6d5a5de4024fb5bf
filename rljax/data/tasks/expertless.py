"""What episodic tasks over other projects' environments share: no scripted expert.

A Gymnasium environment or a SkyRL row brings no reference completion and no scripted player,
so such a task cannot warm-start with SFT (runs set `sft.steps=0`, and asking for it fails with
a line that says so); its single-turn `reward` is the total reward of a one-turn episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.envs.base import Policy, one_turn_reward


class Expertless:
    """Mixin for episodic tasks with `make_env`, `env_task` and a `task_name` (their
    `task.name`)."""

    task_name: str

    def reward(self, completion: str, answer: str) -> float:
        """The total reward of a one-turn episode that plays `completion`."""
        env_task: Any = self.env_task(answer)  # type: ignore[attr-defined]
        return one_turn_reward(self.make_env, env_task, completion)  # type: ignore[attr-defined]

    def sft_target(self, answer: str) -> str:
        """Raises ValueError: there is no reference completion."""
        raise ValueError(self._no_expert())

    def expert_policy(self, rng: np.random.Generator) -> Policy:
        """Raises ValueError: there is no scripted expert."""
        raise ValueError(self._no_expert())

    def _no_expert(self) -> str:
        return f"task {self.task_name} has no scripted expert to SFT on: set sft.steps=0"
