"""Collecting diffusion rollouts: the draw of `rljax.train.GroupCollector` for a masked-diffusion
policy, with Block-R1's per-prompt block sizes.

`DiffusionDraw` draws a prompt batch, samples G completions of each with the block-wise sampler
(`rljax.diffusion.steps`), decodes them with special tokens visible (a stray PAD or BOS makes
an answer wrong instead of being dropped) and scores them through the run's contained scorer
(`rljax.train.scoring`). Its rows are `HostBatch`es like every collector's; the rollout's
`step_map` and `token_probs` ride along as extras (RLDF replays states from them, DACA weighs
tokens by them). Refill (DAPO) and the rest of `GroupCollector` work unchanged.

Block-R1 (github.com/YanJiangJerry/Block-R1): with candidate `block_sizes`, each draw first
measures, per prompt, the mean reward of G completions at every candidate under the sampler's
policy (one batched rollout, every size with the same number of forward passes), then samples
that prompt's training group at its best size (`best_block_sizes`: highest mean reward, ties
to the larger size).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from rljax.data.tasks import Task
from rljax.diffusion.block_size import best_block_sizes
from rljax.diffusion.sampler import DiffusionRollout
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.distributed import to_global, to_local
from rljax.parallel.rules import DEFAULT_RULES
from rljax.rewards import score_completions
from rljax.train.collector import Drawn
from rljax.train.host_batch import HostBatch
from rljax.train.scoring import Scorer, score_rollout
from rljax.train.staleness import Policies
from rljax.train.timing import add_time, timed

# Salt of Block-R1's measurement rollouts (`Steps.rollout(..., salt=...)`).
MEASURE_SALT = 1


def decode_texts(tokenizer: Tokenizer, tokens: np.ndarray) -> list[str]:
    """Answer texts of completions [N, T]: the tokens before the first EOS, specials visible."""
    texts = []
    for row in np.asarray(tokens).tolist():
        if tokenizer.eos_id in row:
            row = row[: row.index(tokenizer.eos_id)]
        texts.append(tokenizer.decode(row, skip_special=False))
    return texts


def decode_visible(tokenizer: Tokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """`decode_texts` with the `score_rollout` decoder's signature (the mask, which ends at the
    first EOS, is implied by the tokens)."""
    del mask
    return decode_texts(tokenizer, tokens)


def host_rows(
    out: DiffusionRollout, prompt_ids: np.ndarray, rewards: np.ndarray, group_size: int
) -> HostBatch:
    """A rollout's rows: the sample fields (no sampler log-probs: zeros), rewards, task
    indices, and the extras "step_map" [B, T] and "token_probs" [B, T]."""
    tokens = np.asarray(out.completion_tokens)
    return HostBatch(
        {
            "prompt_tokens": np.asarray(out.prompt_tokens),
            "prompt_mask": np.asarray(out.prompt_mask),
            "completion_tokens": tokens,
            "completion_mask": np.asarray(out.completion_mask),
            "rollout_logprobs": np.zeros(tokens.shape, np.float32),
            "rewards": np.asarray(rewards, np.float32),
            "prompt_id": np.repeat(np.asarray(prompt_ids, np.int64), group_size),
            "step_map": np.asarray(out.step_map),
            "token_probs": np.asarray(out.token_probs),
        },
        group_size,
    )


class DiffusionDraw:
    """Draws the next prompt batch, samples G completions of each and scores them.

    Args:
      data: prompt batches (`rljax.train.prompts.train_prompts`).
      rollout: `(state, prompt_tokens, prompt_mask, attempt, block_sizes, salt) ->
        DiffusionRollout` of N x G rows (`sharded_rollout` of `Steps.rollout`).
      task, tokenizer: score and decode completions.
      group_size: G.
      scorer: runs the task's reward (contained: a failing call scores 0 and is counted).
      block_sizes: Block-R1's candidate sizes; () samples every prompt at the rollout's
        block size.
    """

    def __init__(
        self,
        data: Iterator[dict[str, Any]],
        rollout: Callable[..., DiffusionRollout],
        task: Task,
        tokenizer: Tokenizer,
        group_size: int,
        scorer: Scorer = score_completions,
        block_sizes: Sequence[int] = (),
    ):
        self.data = data
        self.rollout = rollout
        self.task = task
        self.tokenizer = tokenizer
        self.group_size = group_size
        self.scorer = scorer
        self.block_sizes = tuple(block_sizes)

    def _score(self, prompts: dict, out: DiffusionRollout, repeats: int):
        return score_rollout(
            self.task,
            self.tokenizer,
            prompts,
            out.completion_tokens,
            out.completion_mask,
            repeats,
            self.scorer,
            decode_visible,
        )

    def choose_block_sizes(
        self, state: Any, prompts: dict, attempt: int
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Each prompt's best candidate block size [N] (Block-R1) and its metrics."""
        sizes, g = np.asarray(self.block_sizes, np.int32), self.group_size
        n, k = len(prompts["prompt_tokens"]), len(sizes)
        # Prompt n at size s is prompt row n * k + s; its G samples follow (the layout of
        # `measure_rewards_by_size`).
        tiled = {key: np.repeat(np.asarray(v), k, axis=0) for key, v in prompts.items()}
        out = self.rollout(
            state,
            tiled["prompt_tokens"],
            tiled["prompt_mask"],
            attempt,
            np.tile(sizes, n),
            MEASURE_SALT,
        )
        rewards, failures = self._score(tiled, out, g)
        by_size = np.asarray(rewards, np.float32).reshape(n, k, g).mean(axis=2)
        best = sizes[best_block_sizes(by_size, sizes)]
        metrics = {"block_size/mean": float(best.mean())}
        for kind, count in failures.items():
            metrics[f"block_size/reward_failures_{kind}"] = float(count)
        for size, reward in zip(sizes, by_size.mean(axis=0)):
            metrics[f"block_size/reward_at_{int(size)}"] = float(reward)
        return best, metrics

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        del step  # the rollout's key comes from the state's step and the attempt
        prompts = next(self.data)
        state, sizes, metrics = policies.sampler, None, {}
        if self.block_sizes:  # its measurement rollout and scoring count as sampling
            (sizes, metrics), seconds = timed(self.choose_block_sizes, state, prompts, attempt)
            add_time(metrics, "time/rollout_s", seconds)
        out, seconds = timed(
            self.rollout, state, prompts["prompt_tokens"], prompts["prompt_mask"], attempt, sizes
        )
        add_time(metrics, "time/rollout_s", seconds)
        start = time.perf_counter()
        rewards, failures = self._score(prompts, out, self.group_size)
        rows = host_rows(out, prompts["index"], rewards, self.group_size)
        add_time(metrics, "time/reward_s", time.perf_counter() - start)
        metrics.update({f"reward/failures_{k}": float(v) for k, v in failures.items()})
        return Drawn(prompts, rows, metrics)

    def step_metrics(self) -> dict[str, float]:
        return {}


def sharded_rollout(rollout: Callable[..., DiffusionRollout], mesh: Mesh) -> Callable[..., Any]:
    """`rollout(state, tokens, mask, attempt, block_sizes, salt)` on this process's prompt rows
    -> this process's sample rows (numpy), the batch split over the mesh's batch axes."""
    rows = PartitionSpec(DEFAULT_RULES["batch"])

    def run(state, tokens, mask, attempt: int = 0, block_sizes=None, salt: int = 0):
        arrays = [np.asarray(tokens), np.asarray(mask)]
        if block_sizes is not None:
            arrays.append(np.asarray(block_sizes, np.int32))
        arrays = to_global(tuple(arrays), mesh, rows)
        sizes = arrays[2] if block_sizes is not None else None
        out = rollout(state, arrays[0], arrays[1], attempt, sizes, salt)
        return to_local(out, mesh, rows)

    return run
