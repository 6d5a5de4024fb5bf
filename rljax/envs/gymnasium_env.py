"""Gymnasium text environments as rljax environments.

A Gymnasium environment whose observations and actions are strings (a `gymnasium.spaces.Text`
space, or none declared) plays as an `rljax.envs.Environment`: `reset(task)` is
`env.reset(seed=task["seed"], options=task.get("options"))` and each `step(action)` is
`env.step(action)`, with `terminated or truncated` as `done`. Environments are named as
`gymnasium.make` names them, so a registered id, a "module:Id" that registers itself on import
and Gymnasium's wrappers (a registered `max_episode_steps` becomes truncation) all work.

What counts as success: Gymnasium has no such notion, so an episode that terminates counts as a
success unless its last `info` says `"success": False`, and one that is truncated counts as a
failure unless its `info` says `"success": True` (`rljax.envs.EpisodeResult.success`).

Gymnasium is an optional dependency (`pip install rljax[envs]`); nothing else in rljax needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from rljax.envs.base import Step


def _gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError(
            "Gymnasium environments need gymnasium: pip install 'rljax[envs]'"
        ) from err
    return gymnasium


class GymnasiumText:
    """One Gymnasium environment with text observations and actions, as an `Environment`.

    Args:
      env: a `gymnasium.Env`.
    """

    def __init__(self, env: Any):
        self.env = env

    def reset(self, task: Mapping[str, Any]) -> str:
        """Resets with `task["seed"]` (an int, required: the G episodes of one example must
        start alike) and `task.get("options")`; returns the first observation."""
        if "seed" not in task:
            raise ValueError(f"a Gymnasium task needs a 'seed' (got keys {sorted(task)})")
        observation, _ = self.env.reset(seed=int(task["seed"]), options=task.get("options"))
        return observation

    def step(self, action: str) -> Step:
        """One `env.step(action)`; `info` gains "truncated" (and "success": False when the
        episode was truncated and the environment did not say otherwise)."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        info = {**info, "truncated": bool(truncated)}
        if truncated and not terminated:
            info.setdefault("success", False)
        return Step(observation, reward, terminated or truncated, info)

    def close(self) -> None:
        """`env.close()` (the episode calls it when it ends)."""
        self.env.close()


def _make(env_id: str, kwargs: dict[str, Any]) -> GymnasiumText:
    return GymnasiumText(_gymnasium().make(env_id, **kwargs))


def gymnasium_factory(env_id: str, **kwargs: Any) -> Callable[[], GymnasiumText]:
    """A picklable factory of fresh `GymnasiumText(gymnasium.make(env_id, **kwargs))`, one per
    episode.

    Raises:
      ValueError: if `gymnasium.make(env_id, **kwargs)` fails (an unknown id, bad kwargs):
        one environment is made and closed here, so a typo fails before training starts.
    """
    gymnasium = _gymnasium()
    try:
        gymnasium.make(env_id, **kwargs).close()
    except (gymnasium.error.Error, TypeError) as err:
        raise ValueError(f"gymnasium.make({env_id!r}) failed: {err}") from None
    return functools.partial(_make, env_id, kwargs)
