"""Any Gymnasium text environment as an episodic task (`task.name="gymnasium"`).

An example is one seed of the environment: its prompt is the first observation of
`reset(seed=...)` and its answer the seed, so the G episodes of an example replay the same
start (`rljax.envs.gymnasium_env`). The seeds come from (task seed, split, index); the test
split draws them from another stream, and what is held out is the draw (an environment with few
distinct starts repeats them across splits, as GuessNumber does). There is no scripted expert,
so runs on this task start without an SFT warm start (`sft.steps=0`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from rljax.data.tasks.expertless import Expertless
from rljax.data.tasks.generated import GeneratedSplits
from rljax.envs.gymnasium_env import GymnasiumText, gymnasium_factory

_SEEDS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class GymnasiumTask(Expertless, GeneratedSplits):
    """Episodes of `gymnasium.make(env_id, **env_kwargs)`, one seed per example.

    Attributes:
      env_id: the Gymnasium id ("module:Id" imports the module that registers it first).
      env_kwargs: keyword arguments of `gymnasium.make`.
      max_turns: turns before an episode is cut off (failure "turn_limit", rewards kept).
      seed: seeds the examples' environment seeds.
      test_size: examples in the test split (train is unbounded).
    """

    env_id: str = ""
    env_kwargs: Mapping[str, Any] | None = None
    max_turns: int = 8
    seed: int = 0
    test_size: int = 256
    make_env: Callable[[], GymnasiumText] = dataclasses.field(init=False, repr=False, compare=False)
    task_name = "gymnasium"

    def __post_init__(self):
        if not self.env_id:
            raise ValueError("task.env_id is empty: name a Gymnasium environment id")
        if self.max_turns < 1 or self.test_size < 1 or self.seed < 0:
            raise ValueError(
                f"max_turns={self.max_turns}, test_size={self.test_size}, seed={self.seed}: "
                "need max_turns, test_size >= 1 and seed >= 0"
            )
        factory = gymnasium_factory(self.env_id, **dict(self.env_kwargs or {}))
        object.__setattr__(self, "make_env", factory)

    def example(self, index: int, split: str) -> dict[str, str]:
        """dict(prompt=the first observation of the example's seed, answer=str(seed))."""
        env_seed = str(int(self.example_rng(index, split).integers(_SEEDS)))
        env = self.make_env()
        try:
            prompt = env.reset(self.env_task(env_seed))
        finally:
            env.close()
        if not isinstance(prompt, str):
            raise ValueError(f"{self.env_id}: reset gave a {type(prompt).__name__}, not text")
        return {"prompt": prompt, "answer": env_seed}

    def env_task(self, answer: str) -> dict[str, int]:
        """The reset arguments of the example whose answer is `answer` (its seed)."""
        return {"seed": int(answer)}
