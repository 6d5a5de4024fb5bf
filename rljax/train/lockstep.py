"""Host-side choices made identically on every process of a multi-process run.

Every jitted step is one program over all processes, so each process must call it as often
and with the same shapes as the others. A collector that decides on host data whether (and
how much) to sample, rescore or replay therefore makes that decision on the WHOLE batch,
which every process holds after an allgather, and then keeps its own block of rows:

- `gather_rows` / `gather_batch`: every process's rows in process order, i.e. the global
  batch's row order (process i holds rows [i * B / n, (i + 1) * B / n));
- `own_rows` / `own_batch`: this process's block of a whole batch;
- `sharded_rollout`: a rollout of this process's prompt rows (each process feeds its block);
- `shared_rollout`, `shared_logprobs`: a step over rows every process holds whole; each
  process feeds its block and all read the whole result back.

Prompt selection, replay, LoPE, ReMax's greedy baseline and UEC-RL keep their host state
(pools, buffers) whole and equal on every process, so a multi-process run chooses exactly
what one process with the same devices chooses. With one process every helper is a cheap
identity (or the step called as is), so the driver keeps one code path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.core.state import TrainState
from rljax.data.pipeline import process_block
from rljax.parallel.distributed import allgather, fetch, to_global, to_local
from rljax.parallel.rules import DEFAULT_RULES
from rljax.rollout.sampler import Rollout
from rljax.train.host_batch import HostBatch

_ROWS = PartitionSpec(DEFAULT_RULES["batch"])


def gather_rows(rows: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every process's `rows` (field -> [b, ...], b equal on all) concatenated in process
    order: the whole batch's rows, on every process."""
    return {k: allgather(np.asarray(v)) for k, v in rows.items()}


def own_rows(rows: dict[str, Any]) -> dict[str, np.ndarray]:
    """This process's block of whole-batch `rows` (field -> [B, ...], B divisible by the
    process count; `rljax.data.pipeline.process_block`)."""
    return process_block(rows, jax.process_index(), jax.process_count())


def gather_batch(batch: HostBatch) -> HostBatch:
    """Every process's groups of `batch`, in process order (`gather_rows`)."""
    return (
        batch if jax.process_count() == 1 else HostBatch(gather_rows(batch.rows), batch.group_size)
    )


def own_batch(batch: HostBatch) -> HostBatch:
    """This process's block of the groups of a whole `batch` (their number must divide over
    the processes)."""
    count = jax.process_count()
    if count == 1:
        return batch
    if batch.num_groups % count:
        raise ValueError(
            f"a batch of {batch.num_groups} groups does not split over {count} processes; "
            "make the group count (train.prompts_per_step, replay.groups) a multiple of it"
        )
    return HostBatch(own_rows(batch.rows), batch.group_size)  # whole groups: rows in blocks


def _placed(rows: tuple, mesh: Mesh) -> tuple:
    """Host arrays that every process holds whole -> global arrays split by rows on `mesh`
    (each process places its devices' slices); one process: jnp arrays, placed by the step."""
    if jax.process_count() == 1:
        return tuple(jnp.asarray(x) for x in rows)
    sharding = NamedSharding(mesh, _ROWS)

    def place(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return tuple(place(x) for x in rows)


def sharded_rollout(rollout: Callable[..., Rollout], mesh: Mesh) -> Callable[..., Rollout]:
    """`rollout(state, tokens, mask, attempt, **options)` on this process's prompt rows -> this
    process's sample rows, the batch split over the mesh's batch axes (one program on every
    process); `options` (the engine's `in_flight`) pass through."""

    def run(state: TrainState, tokens, mask, attempt: int = 0, **options) -> Rollout:
        tokens, mask = to_global((np.asarray(tokens), np.asarray(mask)), mesh, _ROWS)
        return to_local(rollout(state, tokens, mask, attempt, **options), mesh, _ROWS)

    return run


def shared_rollout(rollout: Callable[..., Rollout], mesh: Mesh) -> Callable[..., Rollout]:
    """`rollout(state, tokens, mask, attempt)` on prompt rows every process holds whole -> the
    whole rollout (numpy) on every process."""

    def run(state: TrainState, tokens, mask, attempt: int = 0) -> Rollout:
        out = rollout(state, *_placed((tokens, mask), mesh), attempt)
        return jax.tree.map(fetch, out)

    return run


def shared_logprobs(logprobs: Callable[..., jax.Array], mesh: Mesh) -> Callable[..., np.ndarray]:
    """`logprobs(state, prompt_tokens, prompt_mask, completion_tokens, completion_mask)` (the
    trainer's `Steps.logprobs`) on rows every process holds whole -> [N, T] log-probs (numpy),
    whole, on every process."""

    def run(state: TrainState, *rows) -> np.ndarray:
        return fetch(logprobs(state, *_placed(rows, mesh)))

    return run
