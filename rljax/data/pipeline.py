"""grain input pipelines for RL prompts and SFT warm starts: deterministic and checkpointable.

A pipeline is a `grain.MapDataset` of task indices, shuffled with one seed shared by every host,
sliced to this host's shard, and mapped to fixed-shape numpy examples. Batching turns it into a
`grain.DatasetIterator`, whose `get_state()` / `set_state()` restore the exact position (store
the state with the train-state checkpoint).

Layout, shared by RL and SFT so both see the same token positions for the same prompt:
  prompt_tokens [P] int32   BOS + prompt, LEFT-padded with pad_id (real tokens flush right)
  prompt_mask   [P] bool    True on real prompt tokens
SFT examples add the completion exactly as a rollout lays it out after the prompt:
  completion_tokens [C] int32  target + EOS, RIGHT-padded with pad_id
  completion_mask   [C] bool   True on target and EOS tokens: the SFT loss mask
so `rljax.train.logprobs.completion_logprobs(..., prompt_*, completion_*)` scores both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import grain
import jax
import numpy as np

from rljax.data.tasks import Task
from rljax.models.tokenizer import Tokenizer, encode_prompts

PromptFormat = Callable[[str], str]

# Length of an unbounded split. grain's shuffle permutes 32-bit indices, and 2**31 examples
# outlast any run this framework targets (33M steps at batch 64).
_UNBOUNDED_SIZE = 2**31
# Examples are generated in memory and cost microseconds: grain's default 16 prefetch threads
# and 500-batch buffer would only contend for the GIL, so iterate synchronously.
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _task_indices(
    task: Task,
    split: str,
    seed: int | None,
    num_examples: int | None,
    shard_index: int | None,
    shard_count: int | None,
) -> grain.MapDataset:
    """This host's task indices: range(n), shuffled by `seed`, then every shard_count-th."""
    size = task.split_size(split)
    if num_examples is None:
        num_examples = _UNBOUNDED_SIZE if size is None else size
    elif not 0 < num_examples <= (size or _UNBOUNDED_SIZE):
        raise ValueError(
            f"num_examples={num_examples} must be in [1, {size or _UNBOUNDED_SIZE}] "
            f"for split {split!r}"
        )
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} must be in [0, shard_count={shard_count})")
    indices = grain.MapDataset.range(num_examples)
    if seed is not None:
        indices = indices.shuffle(seed)  # before sharding: one permutation, split across hosts
    return indices[shard_index::shard_count]


def _clip(text: str, limit: int = 80) -> str:
    """`text` for an error message: its repr, cut to its first `limit` characters when longer."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def _where(task: Task, index: int, split: str) -> str:
    """The example in errors: its file and line when the task knows them (`source`)."""
    source = getattr(task, "source", None)
    return source(index, split) if source is not None else f"{split} example {index}"


def _encode_prompt(
    tokenizer: Tokenizer,
    prompt: str,
    max_prompt_len: int,
    where: str,
    format_prompt: PromptFormat | None,
    add_bos: bool,
):
    """(tokens [P], mask [P]) of (BOS +) the formatted prompt, left-padded; raises naming an
    overlong prompt."""
    if format_prompt is not None:
        prompt = format_prompt(prompt)
    try:
        tokens, mask = encode_prompts(tokenizer, [prompt], max_prompt_len, add_bos=add_bos)
    except ValueError as err:
        length = len(tokenizer.encode(prompt, add_bos=add_bos))
        raise ValueError(
            f"{where}: prompt {_clip(prompt)} is {length} tokens, more than "
            f"max_prompt_len={max_prompt_len}; raise max_prompt_len or shorten the "
            "task's prompts"
        ) from err
    return tokens[0], mask[0]


def _prompt_example(
    index: int,
    *,
    task: Task,
    split: str,
    tokenizer: Tokenizer,
    max_prompt_len: int,
    max_answer_len: int,
    format_prompt: PromptFormat | None,
    add_bos: bool,
) -> dict[str, np.ndarray]:
    """One RL prompt example (see `prompt_dataset`)."""
    example = task.example(int(index), split)
    where = _where(task, int(index), split)
    tokens, mask = _encode_prompt(
        tokenizer, example["prompt"], max_prompt_len, where, format_prompt, add_bos
    )
    answer_bytes = example["answer"].encode("utf-8")
    if len(answer_bytes) > max_answer_len:
        raise ValueError(
            f"{where}: answer {_clip(example['answer'])} is {len(answer_bytes)} bytes, "
            f"more than max_answer_len={max_answer_len}; raise max_answer_len"
        )
    answer = np.zeros(max_answer_len, np.uint8)
    answer[: len(answer_bytes)] = np.frombuffer(answer_bytes, np.uint8)
    return {
        "prompt_tokens": tokens,
        "prompt_mask": mask,
        "answer": answer,
        "answer_len": np.asarray(len(answer_bytes), np.int32),
        "index": np.asarray(index, np.int64),
    }


def _sft_example(
    index: int,
    *,
    task: Task,
    split: str,
    tokenizer: Tokenizer,
    max_prompt_len: int,
    max_completion_len: int,
    format_prompt: PromptFormat | None,
    add_bos: bool,
) -> dict[str, np.ndarray]:
    """One SFT example (see `sft_dataset`)."""
    example = task.example(int(index), split)
    where = _where(task, int(index), split)
    prompt_tokens, prompt_mask = _encode_prompt(
        tokenizer, example["prompt"], max_prompt_len, where, format_prompt, add_bos
    )
    target = task.sft_target(example["answer"])
    ids = tokenizer.encode(target, add_eos=True)
    if len(ids) > max_completion_len:
        raise ValueError(
            f"{where}: SFT target {_clip(target)} plus EOS is {len(ids)} tokens, more "
            f"than max_completion_len={max_completion_len}; raise max_completion_len"
        )
    completion_tokens = np.full(max_completion_len, tokenizer.pad_id, np.int32)
    completion_tokens[: len(ids)] = ids
    completion_mask = np.arange(max_completion_len) < len(ids)
    return {
        "prompt_tokens": prompt_tokens,
        "prompt_mask": prompt_mask,
        "completion_tokens": completion_tokens,
        "completion_mask": completion_mask,
        "index": np.asarray(index, np.int64),
    }


def prompt_dataset(
    task: Task,
    split: str,
    tokenizer: Tokenizer,
    max_prompt_len: int,
    seed: int | None = 0,
    *,
    max_answer_len: int = 32,
    num_examples: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    format_prompt: PromptFormat | None = None,
    add_bos: bool = True,
) -> grain.MapDataset:
    """RL prompts of `task`'s `split`, this host's shard.

    Args:
      task: any `Task`, e.g. `AdditionTask()`.
      split: one of `task.splits`.
      tokenizer: encodes BOS + prompt.
      max_prompt_len: P, the padded prompt length.
      seed: shuffles the order of examples (the same on every host); None keeps index order.
      max_answer_len: A, bytes reserved for the UTF-8 answer.
      num_examples: use the first n task indices; default the whole split (2**31 if unbounded).
      shard_index, shard_count: this host's slice; default jax.process_index()/process_count().
        Shards of a finite split differ in length by at most one example.
      format_prompt: turns the task's prompt text into the model's input text (e.g. an
        instruct model's chat template); None uses it as it is.
      add_bos: prepend the tokenizer's BOS (off when the chat template has its own).

    Returns:
      A MapDataset of dicts: prompt_tokens [P] int32 (left-padded), prompt_mask [P] bool,
      answer [A] uint8 (UTF-8, zero-padded), answer_len [] int32, index [] int64 (the task
      index, which names the problem). Overlong prompts or answers raise ValueError when read.
    """
    if max_prompt_len < 1 or max_answer_len < 1:
        raise ValueError(
            f"max_prompt_len={max_prompt_len} and max_answer_len={max_answer_len} must be positive"
        )
    indices = _task_indices(task, split, seed, num_examples, shard_index, shard_count)
    return indices.map(
        functools.partial(
            _prompt_example,
            task=task,
            split=split,
            tokenizer=tokenizer,
            max_prompt_len=max_prompt_len,
            max_answer_len=max_answer_len,
            format_prompt=format_prompt,
            add_bos=add_bos,
        )
    )


def sft_dataset(
    task: Task,
    split: str,
    tokenizer: Tokenizer,
    max_prompt_len: int,
    max_completion_len: int,
    seed: int | None = 0,
    *,
    num_examples: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    format_prompt: PromptFormat | None = None,
    add_bos: bool = True,
) -> grain.MapDataset:
    """Supervised warm-start examples: the prompt as in `prompt_dataset`, then target + EOS.

    Arguments as in `prompt_dataset`; max_completion_len is C, the padded target length.

    Returns:
      A MapDataset of dicts: prompt_tokens [P] int32 and prompt_mask [P] bool (left-padded,
      identical to `prompt_dataset`'s), completion_tokens [C] int32 (`task.sft_target(answer)`
      + EOS, right-padded), completion_mask [C] bool (True on target and EOS: the loss mask),
      index [] int64. concat(prompt, completion) is the sequence; the loss on completion token
      j is predicted by the state at position P - 1 + j.
    """
    if max_prompt_len < 1 or max_completion_len < 1:
        raise ValueError(
            f"max_prompt_len={max_prompt_len} and max_completion_len="
            f"{max_completion_len} must be positive"
        )
    indices = _task_indices(task, split, seed, num_examples, shard_index, shard_count)
    return indices.map(
        functools.partial(
            _sft_example,
            task=task,
            split=split,
            tokenizer=tokenizer,
            max_prompt_len=max_prompt_len,
            max_completion_len=max_completion_len,
            format_prompt=format_prompt,
            add_bos=add_bos,
        )
    )


def prompt_batches(
    dataset: grain.MapDataset, batch_size: int, num_epochs: int | None = None
) -> grain.DatasetIterator:
    """Batches of a `prompt_dataset` (or `sft_dataset`): every field gains a leading [B].

    Args:
      dataset: a MapDataset of fixed-shape numpy dicts.
      batch_size: B, examples per batch on this host; an incomplete last batch is dropped.
      num_epochs: passes over the dataset; None repeats forever. A shuffled dataset is
        reshuffled each epoch, deterministically.

    Returns:
      An iterator whose get_state()/set_state() save and restore its exact position.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be positive")
    if len(dataset) < batch_size:
        raise ValueError(
            f"the dataset has {len(dataset)} examples, fewer than batch_size="
            f"{batch_size}, so it yields no batch; lower batch_size or use more "
            "examples (or fewer shards)"
        )
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs={num_epochs} must be positive, or None to repeat forever")
    batched = dataset.repeat(num_epochs).batch(batch_size, drop_remainder=True)
    return iter(batched.to_iter_dataset(_READ_OPTIONS))


def process_block(batch: dict[str, Any], index: int, count: int) -> dict[str, np.ndarray]:
    """Rows [i * B / n, (i + 1) * B / n) of every field of a global `batch` (field -> [B, ...]):
    what process i of n holds of it, the block the mesh gives its devices.

    Raises:
      ValueError: B not divisible by n.
    """
    b = len(next(iter(batch.values())))
    if b % count:
        raise ValueError(f"a global batch of {b} rows does not split over {count} processes")
    rows = slice(index * b // count, (index + 1) * b // count)
    return {k: np.asarray(v)[rows] for k, v in batch.items()}


class HostRows:
    """This process's block of rows of every global batch from `batches`.

    A multi-process run reads the GLOBAL batch stream on every process (the same seed, no
    per-host shard) and keeps rows [i * B / n, (i + 1) * B / n) on process i of n: the block
    the mesh gives its devices. So the run trains on the same batches whatever the number of
    processes, and a multi-host run matches a single-host one. Reading prompts is cheap next
    to sampling them; each process tokenizes all B.

    Args:
      batches: the global batch iterator (`prompt_batches` of an unsharded dataset).
      process_index, process_count: this process and how many there are.
    """

    def __init__(self, batches: Any, process_index: int, process_count: int):
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} not in [0, {process_count})")
        self.batches = batches
        self.index, self.count = process_index, process_count

    def __iter__(self) -> HostRows:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return process_block(next(self.batches), self.index, self.count)

    def get_state(self) -> dict[str, Any]:
        return self.batches.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.batches.set_state(state)


def decode_answers(batch: dict[str, Any]) -> list[str]:
    """The B answer strings of a batch (its `answer` [B, A] bytes and `answer_len` [B])."""
    answers = np.asarray(batch["answer"])
    lengths = np.asarray(batch["answer_len"])
    return [bytes(row[:n]).decode("utf-8") for row, n in zip(answers, lengths)]


def decode_prompts(batch: dict[str, Any], tokenizer: Tokenizer) -> list[str]:
    """The B prompt strings of a batch, BOS and padding dropped (for host-side rewards)."""
    tokens = np.asarray(batch["prompt_tokens"])
    masks = np.asarray(batch["prompt_mask"])
    return [tokenizer.decode(row[mask]) for row, mask in zip(tokens, masks)]
