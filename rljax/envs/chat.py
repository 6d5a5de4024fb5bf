"""How an episode's text is laid out in the model's chat convention: the first prompt and the
observations appended after each policy turn.

A policy turn ends with the model's end-of-turn token (its EOS: `<|im_end|>` for ChatML models
such as Qwen and SmolLM2-Instruct, `<end_of_turn>` for Gemma), which stays in the sequence; the
observation text then closes nothing and opens the environment's message and the model's next
turn. These are the templates' fixed strings, written out per family rather than rendered from
a checkpoint's Jinja template (which would need a template engine at rollout time); a family
with another layout is one more `ChatFormat`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """Text templates with one `{text}` field each.

    Attributes:
      prompt: the episode's first prompt around the first observation.
      observation: what follows a policy turn (after its EOS): the environment's message and
        the opening of the model's next turn.
    """

    prompt: str
    observation: str

    def __post_init__(self):
        for name in ("prompt", "observation"):
            template = getattr(self, name)
            if template.count("{text}") != 1:
                raise ValueError(f"ChatFormat.{name}={template!r} needs exactly one {{text}}")

    def render_prompt(self, text: str) -> str:
        """The first prompt of an episode whose first observation is `text`."""
        return self.prompt.replace("{text}", text)

    def render_observation(self, text: str) -> str:
        """What is appended after a policy turn when the environment answers `text`."""
        return self.observation.replace("{text}", text)


CHAT_FORMATS = {
    # Tiny byte-level models (the built-in tasks): plain lines.
    "plain": ChatFormat(prompt="{text}\n", observation="\n{text}\n"),
    "chatml": ChatFormat(
        prompt="<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
        observation="\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
    ),
    "gemma": ChatFormat(
        prompt="<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n",
        observation="\n<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n",
    ),
}


def get_chat_format(name: str) -> ChatFormat:
    """The `ChatFormat` called `name` (one of `CHAT_FORMATS`)."""
    if name not in CHAT_FORMATS:
        raise ValueError(f"unknown chat format {name!r}; known: {sorted(CHAT_FORMATS)}")
    return CHAT_FORMATS[name]
