"""Data: synthetic verifiable tasks and grain input pipelines for RL prompts and SFT."""

from rljax.data.pipeline import (
    decode_answers,
    decode_prompts,
    prompt_batches,
    prompt_dataset,
    sft_dataset,
)
from rljax.data.tasks import AdditionTask, Task, get_task

__all__ = [
    "AdditionTask",
    "Task",
    "get_task",
    "prompt_dataset",
    "prompt_batches",
    "sft_dataset",
    "decode_answers",
    "decode_prompts",
]
