"""SkyRL-Gym environments as rljax environments.

SkyRL-Gym (`skyrl-gym` on PyPI, the environment library of NovaSky's SkyRL) defines text
environments over chat messages: `skyrl_gym.make(env_class, env_config=..., extras=row)` builds
one from a data row, `init(prompt_messages)` returns the (possibly edited) prompt and `step(text)`
returns observations as messages, a reward and `done`. `SkyRLGymText` plays one as an
`rljax.envs.Environment`: its task is a row of SkyRL's data layout (`prompt` messages,
`env_class`, and the extras the environment reads, such as `reward_spec` and `extra_info`), and
each message list becomes text by joining the messages' contents with blank lines (the rollout's
`rljax.envs.chat.ChatFormat` adds the model's turn markers).

Why SkyRL-Gym and not `verifiers`: skyrl-gym 0.4.0 installs with a dozen light packages
(omegaconf, pandas, requests), while verifiers 0.4.0 brings 98, among them transformers, openai,
anthropic and an MCP server stack. SkyRL-Gym is an optional dependency (`pip install
rljax[envs]`); nothing else in rljax needs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rljax.envs.base import Step

ROW_KEYS = ("prompt", "env_class")
"""Keys of a SkyRL data row that are not passed to the environment as extras."""


def _skyrl_gym() -> Any:
    try:
        import skyrl_gym
    except ImportError as err:
        raise ImportError(
            "SkyRL-Gym environments need skyrl-gym: pip install 'rljax[envs]'"
        ) from err
    return skyrl_gym


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The contents of chat `messages` joined by blank lines ("" for none).

    Raises:
      TypeError: if a message is not a mapping with a string "content".
    """
    texts = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, str):
            raise TypeError(f"a message is {message!r:.80}, not {{'role': ..., 'content': str}}")
        texts.append(content)
    return "\n\n".join(texts)


class SkyRLGymText:
    """One SkyRL-Gym environment as an `Environment`, built in `reset` from its task row.

    Args:
      env_config: the environment's `env_config` (SkyRL's per-class settings; None for none).
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None):
        self.env_config = dict(env_config or {})
        self.env: Any = None

    def reset(self, task: Mapping[str, Any]) -> str:
        """Makes `task["env_class"]` with the row's other keys as extras and returns the text
        of `init(task["prompt"])` (the prompt as the environment edits it)."""
        missing = [key for key in ROW_KEYS if key not in task]
        if missing:
            raise ValueError(f"a SkyRL row needs {list(ROW_KEYS)}; it has no {missing}")
        extras = {k: v for k, v in task.items() if k not in ROW_KEYS}
        self.env = _skyrl_gym().make(task["env_class"], env_config=self.env_config, extras=extras)
        prompt = task["prompt"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        conversation, _ = self.env.init(list(prompt))
        return conversation_text(conversation)

    def step(self, action: str) -> Step:
        """One `env.step(action)`: its observation messages as text, its reward, done and
        metadata (as `info`)."""
        if self.env is None:
            raise RuntimeError("SkyRLGymText.step before reset: call reset(task) first")
        out = self.env.step(action)
        if not isinstance(out, Mapping):
            raise TypeError(f"step returned {type(out).__name__}, not a mapping")
        return Step(
            conversation_text(out.get("observations") or []),
            out.get("reward"),
            out.get("done"),
            dict(out.get("metadata") or {}),
        )

    def close(self) -> None:
        """`env.close()` (the episode calls it when it ends)."""
        if self.env is not None:
            self.env.close()
