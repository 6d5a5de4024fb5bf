"""Data: synthetic verifiable tasks, tasks over local data files, grain input pipelines for RL
prompts and SFT, and prompt samplers (`rljax.data.samplers`)."""

from rljax.data.array_record import ArrayRecordRows, convert, write_array_record
from rljax.data.pipeline import (
    HostRows,
    decode_answers,
    decode_prompts,
    prompt_batches,
    prompt_dataset,
    sft_dataset,
)
from rljax.data.tasks import AdditionTask, LocalTask, Task, get_task

__all__ = [
    "AdditionTask",
    "ArrayRecordRows",
    "LocalTask",
    "Task",
    "convert",
    "write_array_record",
    "get_task",
    "prompt_dataset",
    "HostRows",
    "prompt_batches",
    "sft_dataset",
    "decode_answers",
    "decode_prompts",
]
