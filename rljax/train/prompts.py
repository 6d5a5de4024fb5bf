"""How a run turns a task's problems into model input: the prompts each RL step draws and the
SFT warm start's examples."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from ml_collections import ConfigDict

from rljax.data import HostRows, prompt_batches, prompt_dataset, sft_dataset
from rljax.data.samplers.curriculum import CurriculumSettings
from rljax.data.selected import (
    CurriculumSelector,
    DAREPromptSelector,
    HeaPASelector,
    SelectedPromptBatches,
)
from rljax.data.tasks import Task
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.distributed import to_global
from rljax.parallel.rules import DEFAULT_RULES
from rljax.train.builders import build_dare_settings, prompt_format
from rljax.train.sft import run_sft


@dataclasses.dataclass(frozen=True)
class Prompts:
    """How a run turns task prompts into model input (shared by training, SFT and eval)."""

    tokenizer: Tokenizer
    max_len: int
    max_answer_len: int
    format_prompt: Callable[[str], str] | None
    add_bos: bool

    @classmethod
    def from_config(cls, config: ConfigDict, tokenizer: Tokenizer) -> Prompts:
        """The prompt settings of a run: `task.max_prompt_len`, `task.max_answer_len`, the
        chat template and BOS of the tokenizer (`builders.prompt_format`)."""
        return cls(
            tokenizer,
            config.task.max_prompt_len,
            config.task.max_answer_len,
            *prompt_format(config, tokenizer),
        )

    def dataset(self, task: Task, split: str, **kwargs):
        return prompt_dataset(
            task,
            split,
            self.tokenizer,
            self.max_len,
            max_answer_len=self.max_answer_len,
            format_prompt=self.format_prompt,
            add_bos=self.add_bos,
            **kwargs,
        )


def train_prompts(config: ConfigDict, task: Task, prompts: Prompts):
    """The training prompt batches: the shuffled split, or a `prompt_selection` selector's
    picks (HeaPA, DARE, or the curriculum over the task's difficulty levels) from a pool of the
    split's first `prompt_selection.pool_size` prompts. With several processes, this process's
    block of rows of every batch (`HostRows`; its `batches` are the whole ones)."""
    batch_size = config.train.prompts_per_step
    selection = config.prompt_selection
    if selection.name == "none":
        dataset = prompts.dataset(task, "train", seed=config.seed, shard_index=0, shard_count=1)
        return HostRows(
            prompt_batches(dataset, batch_size), jax.process_index(), jax.process_count()
        )
    size = task.split_size("train")
    pool_size = selection.pool_size or size
    if pool_size is None:
        raise ValueError(
            f"task {config.task.name!r} has an unbounded train split; set "
            "prompt_selection.pool_size to the number of prompts the selector chooses from"
        )
    # The whole pool on every process (the selector picks from all of it).
    pool = prompts.dataset(
        task, "train", seed=None, num_examples=pool_size, shard_index=0, shard_count=1
    )
    if selection.name == "heapa":
        selector = HeaPASelector(len(pool), config.seed, selection.low_fraction)
    elif selection.name == "dare":
        rows = batch_size * config.rollout.n_samples
        selector = DAREPromptSelector(len(pool), config.seed, build_dare_settings(config), rows)
    else:
        if not hasattr(task, "difficulty"):
            raise ValueError(
                f"prompt_selection.name='curriculum' needs a task with difficulty levels; "
                f"task {config.task.name!r} has no difficulty(index, split)"
            )
        indices = [int(pool[i]["index"]) for i in range(len(pool))]
        difficulties = [task.difficulty(i, "train") for i in indices]
        keys = ("threshold", "decay", "review", "min_updates")
        settings = CurriculumSettings(**{k: selection[k] for k in keys if k in selection})
        selector = CurriculumSelector(difficulties, config.seed, settings)
    selected = SelectedPromptBatches(pool, selector, batch_size)
    if jax.process_count() == 1:
        return selected
    # Every process keeps the selector whole and equal (it hears every process's rewards,
    # `rljax.train.draws.WithFeedback`) and samples its block of each batch.
    return HostRows(selected, jax.process_index(), jax.process_count())


def warm_start(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    log: Callable[[int, dict[str, Any]], None],
    mesh: Mesh,
) -> nnx.State:
    """SFT on the task's targets (`sft.*`) before RL; logs its loss under sft/loss at negative
    steps. Each process feeds its rows of the global batches, split over the mesh's batch axes."""
    s = config.sft
    dataset = sft_dataset(
        task,
        "train",
        prompts.tokenizer,
        prompts.max_len,
        config.rollout.max_new_tokens,
        seed=config.seed + 1,
        shard_index=0,
        shard_count=1,
        format_prompt=prompts.format_prompt,
        add_bos=prompts.add_bos,
    )
    return sft_on_batches(
        graphdef, params, prompt_batches(dataset, s.batch_size), config, log, mesh
    )


def sft_on_batches(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batches: Iterator[dict[str, Any]],
    config: ConfigDict,
    log: Callable[[int, dict[str, Any]], None],
    mesh: Mesh,
) -> nnx.State:
    """`sft.steps` Adam steps (`sft.learning_rate`) on `batches` of global rows; each process
    feeds its rows, split over the mesh's batch axes; the loss is logged as sft/loss at
    negative steps."""
    s = config.sft
    rows = PartitionSpec(DEFAULT_RULES["batch"])
    local = HostRows(batches, jax.process_index(), jax.process_count())
    return run_sft(
        graphdef,
        params,
        (to_global(b, mesh, rows) for b in local),
        s.steps,
        optax.adam(s.learning_rate),
        config.train.vocab_chunk,
        on_step=lambda i, loss: log(i - s.steps, {"sft/loss": loss}),
    )
