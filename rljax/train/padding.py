"""Padding that follows the data: a batch trimmed to a bucket of its longest prompt and completion.

Prompts are left-padded to `task.max_prompt_len` and completions right-padded to
`rollout.max_new_tokens`, but a step's rows are usually shorter, and every position of the
old-log-prob pass and the update costs the same whether it is real or padding. Before it
learns from a batch the driver drops the columns no row uses, keeping widths that are
multiples of `train.pad_multiple` (capped at the full widths), so only a few shapes are ever
compiled, each once (and cached across runs). A dropped column is masked in every row and
positions come from the masks, so the update is the same up to float rounding.
"""

from __future__ import annotations

import numpy as np

from rljax.train.host_batch import HostBatch


def bucket(width: int, multiple: int, full: int) -> int:
    """`width` rounded up to a multiple of `multiple`, at least 1 and at most `full`; `full`
    itself when `multiple` is 0 (trimming off)."""
    if multiple == 0:
        return full
    return min(full, max(1, -(-width // multiple) * multiple))


def used_widths(batch: HostBatch) -> np.ndarray:
    """[2] int: the prompt columns from the first one any row uses to the end (prompts are
    left-padded), and the completion columns up to the last one any row uses, with a policy
    token or an environment token ("env_mask", the context of multi-turn episodes)."""
    prompt_used = batch.rows["prompt_mask"].any(axis=0)
    used = np.asarray(batch.rows["completion_mask"], bool)
    if "env_mask" in batch.rows:
        used = used | (np.asarray(batch.rows["env_mask"]) > 0)
    completion_used = np.flatnonzero(used.any(axis=0))
    prompt = prompt_used.size - int(np.argmax(prompt_used)) if prompt_used.any() else 0
    completion = int(completion_used[-1]) + 1 if completion_used.size else 0
    return np.asarray([prompt, completion], np.int64)


def trim_padding(batch: HostBatch, multiple: int, widths: np.ndarray | None = None) -> HostBatch:
    """The batch with only the prompt and completion columns its rows use, rounded up.

    Args:
      batch: rows as sampled (prompts left-padded, completions right-padded).
      multiple: `train.pad_multiple`; kept widths are multiples of it (0: the batch as is).
      widths: the used widths to keep (`used_widths`), e.g. the maximum over all processes so
        that every process's rows have the same shape; default this batch's own.

    Returns:
      The trimmed `HostBatch` (`HostBatch.trimmed`).
    """
    if multiple == 0:
        return batch
    prompt, completion = used_widths(batch) if widths is None else widths
    return batch.trimmed(
        bucket(int(prompt), multiple, batch.rows["prompt_tokens"].shape[1]),
        bucket(int(completion), multiple, batch.rows["completion_tokens"].shape[1]),
    )
