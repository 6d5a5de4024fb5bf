"""Parallel scoring for slow reward functions, with a hard time limit in worker processes.

`rewards.base.score_completions` calls the reward function in the trainer's thread and can only
discard a slow call's result after it returns. Reward functions that run code, query a judge
model or call a checker can take seconds or hang, so `score_completions_parallel` runs the calls
on `max_workers` workers and enforces `timeout_s` from the trainer's side:

- kind="process": each worker is a child process; a call still running at its deadline is
  abandoned, its process killed and replaced, and the sample scored 0 as a "timeout". The
  limit is hard. A worker process that dies mid-call scores its sample 0 as an "exception".
  Workers are forked by default (fast, and closures work as reward functions); with
  start_method="spawn" or "forkserver" the reward function must be picklable.
- kind="thread": each worker is a daemon thread; a call past its deadline is abandoned and
  scored 0 as a "timeout" and a fresh thread takes its place, but the abandoned thread cannot
  be stopped and runs on until the call returns. Use it for I/O-bound rewards that do return.

A batched reward function (`batched=True`) takes lists (prompts, completions, answers) of a
chunk of rows and returns one reward per row; one call scores `batch_size` rows (all B by
default). If it raises, times out or returns the wrong number of values, every row of the
chunk scores 0 and is counted; a row whose value is a non-number or non-finite is counted
alone. The return contract is that of `score_completions`: [B] float32 rewards, in the order
of the inputs, and failure counts per kind of `FAILURE_KINDS`.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rljax.rewards.base import Outcome, RewardFn, check_value, score_one, tally_outcomes

BatchedRewardFn = Callable[[list[str], list[str], list[str]], Sequence[float]]
"""batch_fn(prompts, completions, answers) -> one reward per row."""

_log = logging.getLogger(__name__)


def _run_single(reward_fn: RewardFn, rows: list[tuple[str, str, str]]) -> list[Outcome]:
    """Outcomes of per-row calls."""
    return [score_one(reward_fn, p, c, a, None) for p, c, a in rows]


def _run_batched(batch_fn: BatchedRewardFn, rows: list[tuple[str, str, str]]) -> list[Outcome]:
    """Outcomes of one batched call over the rows."""
    prompts, completions, answers = (list(column) for column in zip(*rows))
    try:
        values = list(batch_fn(prompts, completions, answers))
    except Exception as err:  # pylint: disable=broad-except  # contained by design
        return [(0.0, "exception", repr(err))] * len(rows)
    if len(values) != len(rows):
        return [(0.0, "wrong_type", f"returned {len(values)} values for {len(rows)} rows")] * len(
            rows
        )
    return [check_value(v) for v in values]


def _serve(run: Callable[[list], list[Outcome]], conn: multiprocessing.connection.Connection):
    """Worker loop: receive a chunk of rows, send back its outcomes; stop on None or EOF."""
    try:
        while (rows := conn.recv()) is not None:
            conn.send(run(rows))
    except (EOFError, OSError):  # the trainer closed the pipe: abandoned or shut down
        pass


class _Worker:
    """One thread or process serving chunks over a pipe."""

    def __init__(self, run: Callable[[list], list[Outcome]], kind: str, context: Any):
        self.conn, child = multiprocessing.Pipe()
        if kind == "process":
            self.proc = context.Process(target=_serve, args=(run, child), daemon=True)
            self.proc.start()
            child.close()
        else:
            self.proc = None
            threading.Thread(target=_serve, args=(run, child), daemon=True).start()
        self.task: tuple[int, float] | None = None  # (chunk index, deadline)

    def abandon(self) -> None:
        """Stops waiting for this worker: kills its process, or leaves its thread to finish."""
        self.conn.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()

    def close(self) -> None:
        """Asks an idle worker to stop."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.conn.close()
        if self.proc is not None:
            self.proc.join(timeout=1.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()


def _run_chunks(
    run: Callable[[list], list[Outcome]],
    chunks: list[list[tuple[str, str, str]]],
    timeout_s: float | None,
    max_workers: int,
    kind: str,
    context: Any,
) -> list[list[Outcome]]:
    """Outcomes of every chunk, dispatched to at most max_workers workers with deadlines."""
    results: list[list[Outcome] | None] = [None] * len(chunks)
    todo = list(range(len(chunks)))[::-1]
    workers = [_Worker(run, kind, context) for _ in range(min(max_workers, len(chunks)))]
    try:
        while todo or any(w.task for w in workers):
            for w in workers:
                if w.task is None and todo:
                    j = todo.pop()
                    w.conn.send(chunks[j])
                    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
                    w.task = (j, deadline)
            busy = [w for w in workers if w.task]
            wait = min(w.task[1] for w in busy) - time.monotonic()
            ready = multiprocessing.connection.wait(
                [w.conn for w in busy], timeout=None if wait == math.inf else max(wait, 0.0)
            )
            for i, w in enumerate(workers):
                if w.task is None:
                    continue
                j, deadline = w.task
                if w.conn in ready:
                    try:
                        results[j] = w.conn.recv()
                        w.task = None
                        continue
                    except (EOFError, OSError):
                        code = None if w.proc is None else w.proc.exitcode
                        outcome = (0.0, "exception", f"worker died (exit code {code})")
                elif time.monotonic() >= deadline:
                    outcome = (0.0, "timeout", f"abandoned after timeout_s={timeout_s}")
                else:
                    continue
                results[j] = [outcome] * len(chunks[j])
                w.abandon()
                workers[i] = _Worker(run, kind, context)
    finally:
        for w in workers:
            if w.task is None:
                w.close()
            else:
                w.abandon()
    return results  # type: ignore[return-value]  # every chunk was filled above


def score_completions_parallel(
    reward_fn: RewardFn | BatchedRewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    timeout_s: float | None = None,
    max_workers: int = 4,
    kind: str = "thread",
    batched: bool = False,
    batch_size: int | None = None,
    start_method: str = "fork",
) -> tuple[np.ndarray, dict[str, int]]:
    """Rewards of B completions scored on parallel workers, with failed calls scored 0.

    Args:
      reward_fn: `RewardFn` called per row, or with batched=True a `BatchedRewardFn`.
      prompts, completions, answers: B strings each, row i one sample.
      timeout_s: per-call time limit in seconds from dispatch (per chunk when batched); hard
        in process mode, abandon-only in thread mode (module docstring); None for none.
      max_workers: workers running calls at once.
      kind: "thread" or "process".
      batched: reward_fn takes lists of a chunk's rows and returns one reward per row.
      batch_size: rows per batched call; None for all B in one call.
      start_method: multiprocessing start method of process workers; the deadline runs from
        dispatch, so with "spawn" a fresh worker's start-up counts against timeout_s.

    Returns:
      rewards: [B] float32, in input order.
      failures: count of failed rows per kind, every kind of `FAILURE_KINDS` present.

    Raises:
      ValueError: on mismatched lengths or a bad timeout_s, max_workers, kind or batch_size.
    """
    b = len(prompts)
    if not b == len(completions) == len(answers):
        raise ValueError(
            f"got {b} prompts, {len(completions)} completions and {len(answers)} answers; "
            "pass one of each per sample"
        )
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be positive, or None for no limit")
    if max_workers < 1:
        raise ValueError(f"max_workers={max_workers} must be >= 1")
    if kind not in ("thread", "process"):
        raise ValueError(f'kind={kind!r}; use "thread" or "process"')
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1, or None for one call")
    rows = list(zip(prompts, completions, answers))
    size = (batch_size or max(b, 1)) if batched else 1
    chunks = [rows[i : i + size] for i in range(0, b, size)]
    run = functools.partial(_run_batched if batched else _run_single, reward_fn)
    context = multiprocessing.get_context(start_method) if kind == "process" else None
    outcomes = [
        o
        for chunk in _run_chunks(run, chunks, timeout_s, max_workers, kind, context)
        for o in chunk
    ]
    return tally_outcomes(outcomes)
