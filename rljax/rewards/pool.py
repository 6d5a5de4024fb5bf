"""Contained scoring on persistent worker pools, with a hard time limit in worker processes.

`rewards.base.score_completions` calls the reward function in the trainer's thread: it can
discard a slow call's result only after it returns, and a call to `os._exit` ends the trainer.
A `RewardPool` runs the calls on persistent workers, reused from one call to the next, and
enforces `timeout_s` from the trainer's side:

- kind="process": each worker is a child process started by a "forkserver" (the trainer has
  JAX threads, after which a plain fork is unsafe; the server preloads rljax once, so a new
  worker starts in milliseconds). A call still running at its deadline is abandoned, its
  worker killed and replaced, and its rows scored 0 as a "timeout"; a worker that dies
  mid-call (`os._exit`, a crash) is replaced and its rows scored 0 as an "exit", with the exit
  code or signal in the log. Workers ignore SIGINT (the trainer decides what an interrupt
  does), die with the trainer (PR_SET_PDEATHSIG on the forkserver, which exits with the
  trainer; an idle worker also stops at the end of its pipe) and run JAX on the CPU only.
  The reward function must pickle (a module-level function, or a task's reward through
  `rljax.train.scoring.TaskReward`); it is pickled once and sent once to each worker.
- kind="thread": each worker is a daemon thread; a call past its deadline is abandoned and
  scored 0 as a "timeout" and a fresh thread takes its place, but the abandoned thread cannot
  be stopped and runs on until the call returns. Use it for I/O-bound rewards that do return.

Either way a call that raises or calls `sys.exit` scores 0 and is counted; the worker lives on.
`shared_pool(kind, workers)` keeps one pool per setting for the process (the driver closes them
all at the end of a run: `close_shared_pools`); `score_completions_parallel` is a one-off pool.

A batched reward function (`batched=True`) takes lists (prompts, completions, answers) of a
chunk of rows and returns one reward per row; one call scores `batch_size` rows (all B by
default). If it fails, times out or returns the wrong number of values, every row of the chunk
scores 0 and is counted; a row whose value is a non-number or out of range is counted alone.
The return contract is that of `score_completions`: [B] float32 rewards, in the order of the
inputs, and failure counts per kind of `FAILURE_KINDS`.
"""

from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rljax.rewards.base import (
    FLOAT32_MAX,
    Outcome,
    RewardFn,
    check_value,
    failed_call,
    score_one,
    tally_outcomes,
)

BatchedRewardFn = Callable[[list[str], list[str], list[str]], Sequence[float]]
"""batch_fn(prompts, completions, answers) -> one reward per row."""

POOL_KINDS = ("process", "thread")
_LOAD_TIMEOUT_S = 120.0  # unpickling the reward function in a fresh worker (imports)
_CACHED_FNS = 8  # reward functions a pool keeps pickled
# What the forkserver imports once for all workers: rljax, the tasks and `TaskReward`.
_PRELOAD = ["rljax", "rljax.data.tasks", "rljax.train.scoring"]
_PR_SET_PDEATHSIG = 1

_log = logging.getLogger(__name__)


def _run_rows(fn: Callable, batched: bool, rows: list[tuple[str, str, str]]) -> list[Outcome]:
    """Outcomes of one chunk: per-row calls, or one batched call over its rows."""
    if not batched:
        return [score_one(fn, p, c, a, None) for p, c, a in rows]
    prompts, completions, answers = (list(column) for column in zip(*rows))
    try:
        values = list(fn(prompts, completions, answers))
    except (Exception, SystemExit) as err:  # pylint: disable=broad-except  # contained
        return [failed_call(err)] * len(rows)
    if len(values) != len(rows):
        detail = f"returned {len(values)} values for {len(rows)} rows"
        return [(0.0, "wrong_type", detail)] * len(rows)
    return [check_value(v) for v in values]


def process_context(start_method: str = "forkserver") -> Any:
    """The multiprocessing context of contained worker processes; with "forkserver" its
    server preloads rljax and the tasks, so a new worker starts in milliseconds."""
    if start_method == "forkserver":  # imported once by the server, not per worker
        multiprocessing.forkserver.set_forkserver_preload(_PRELOAD)
    return multiprocessing.get_context(start_method)


def become_worker() -> None:
    """A worker process's set-up: no SIGINT, death with its parent, JAX on the CPU only
    (call it first in the process's target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: an idle worker still stops at pipe EOF
        pass
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    server = multiprocessing.forkserver._forkserver  # pylint: disable=protected-access
    if server._forkserver_alive_fd is not None:  # pylint: disable=protected-access
        # The trainer's end of the pipe whose closing stops the forkserver: a worker that
        # kept it open would keep the server, hence itself, alive after the trainer died.
        os.close(server._forkserver_alive_fd)  # pylint: disable=protected-access
        server._forkserver_alive_fd = None  # pylint: disable=protected-access
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # preloaded by the forkserver: no backend is initialised yet
        sys.modules["jax"].config.update("jax_platforms", "cpu")


def _serve_process(conn: multiprocessing.connection.Connection) -> None:
    """Worker process loop: (index, pickled fn or None, batched, rows) in, outcomes out."""
    become_worker()
    fn = None
    try:
        while (message := conn.recv()) is not None:
            _, payload, batched, rows = message
            if payload is not None:
                try:
                    fn = pickle.loads(payload)
                except BaseException as err:  # pylint: disable=broad-except  # reported
                    conn.send(("load_error", f"{type(err).__name__}: {err}"))
                    continue
                conn.send(("loaded", None))
            conn.send(("done", _run_rows(fn, batched, rows)))
    except (EOFError, OSError):  # the trainer closed the pipe or is gone
        pass


def _serve_thread(inbox: queue.SimpleQueue, conn: multiprocessing.connection.Connection):
    """Worker thread loop: (index, fn, batched, rows) in, outcomes out; stops on None."""
    try:
        while (message := inbox.get()) is not None:
            _, fn, batched, rows = message
            conn.send(("done", _run_rows(fn, batched, rows)))
    except OSError:  # abandoned after a timeout: the trainer closed its end
        pass
    finally:
        conn.close()


class _Worker:
    """One thread or process serving chunks, and the chunk it is on."""

    def __init__(self, kind: str, context: Any):
        self.conn, child = multiprocessing.Pipe()
        self.proc, self.inbox = None, None
        if kind == "process":
            self.proc = context.Process(target=_serve_process, args=(child,), daemon=True)
            self.proc.start()
            child.close()
        else:
            self.inbox = queue.SimpleQueue()
            threading.Thread(target=_serve_thread, args=(self.inbox, child), daemon=True).start()
        self.fn_index: int | None = None  # the function the process holds
        self.task: tuple[int, float] | None = None  # (chunk index, deadline)
        self.loading = False  # the process is unpickling the function

    def send(self, index: int, entry: Any, batched: bool, rows: list) -> None:
        """Hands the worker a chunk; a process gets the pickled function when it lacks it."""
        if self.inbox is not None:
            self.inbox.put((index, entry, batched, rows))
            return
        self.loading = self.fn_index != index
        self.conn.send((index, entry if self.loading else None, batched, rows))
        self.fn_index = index

    def died(self) -> str:
        """How the worker's process ended (after its pipe closed)."""
        if self.proc is None:
            return "worker thread ended"
        self.proc.join(timeout=5.0)
        code = self.proc.exitcode
        if code is not None and code < 0:
            return f"worker process killed by {signal.Signals(-code).name}"
        return f"worker process exited with code {code}"

    def abandon(self) -> None:
        """Stops waiting for this worker: kills its process, or leaves its thread to finish."""
        self.conn.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()

    def close(self) -> None:
        """Asks an idle worker to stop."""
        if self.inbox is not None:
            self.inbox.put(None)
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.conn.close()
        if self.proc is not None:
            self.proc.join(timeout=2.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()


class RewardPool:
    """Persistent workers that score reward calls with per-call deadlines (module docstring);
    callers on several threads (an overlapped run's sampler, the trainer's evaluation) take
    turns.

    Args:
      kind: "process" or "thread".
      workers: workers running calls at once, started on the first call.
      start_method: multiprocessing start method of process workers ("forkserver": see the
        module docstring; "spawn" works too but each new worker imports the reward's modules).
    """

    def __init__(self, kind: str = "process", workers: int = 2, start_method: str = "forkserver"):
        if kind not in POOL_KINDS:
            raise ValueError(f'kind={kind!r}; use "process" or "thread"')
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.kind, self.workers = kind, workers
        self._context = None
        if kind == "process":
            self._context = process_context(start_method)
        self._pool: list[_Worker] = []
        # reward fn -> (index, what workers get: it or its pickle, the fn kept alive)
        self._fns: dict[Any, tuple[int, Any, Callable]] = {}
        self._count = 0
        self._turn = threading.Lock()  # one `map` at a time
        self.closed = False

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def pids(self) -> list[int | None]:
        """Process ids of the live workers (None for threads); started ones only."""
        return [w.proc.pid if w.proc else None for w in self._pool]

    def _entry(self, fn: Callable) -> tuple[int, Any]:
        """(index, the function or its pickle) of `fn`, pickled once while it stays cached."""
        try:
            key: Any = fn
            hash(fn)
        except TypeError:  # unhashable: known by identity (the cache holds it alive)
            key = id(fn)
        if key in self._fns:
            self._fns[key] = cached = self._fns.pop(key)  # most recently used last
            return cached[0], cached[1]
        entry: Any = fn
        if self.kind == "process":
            try:
                entry = pickle.dumps(fn)
            except Exception as err:  # pylint: disable=broad-except  # one clear line
                raise ValueError(
                    f"{fn!r} cannot be sent to reward.kind='process' workers "
                    f"({type(err).__name__}: {err}); define it (and what it uses) at module "
                    "level, or set reward.kind='thread' or 'inline'"
                ) from None
        self._count += 1
        self._fns[key] = (self._count, entry, fn)
        while len(self._fns) > _CACHED_FNS:
            del self._fns[next(iter(self._fns))]
        return self._count, entry

    def map(
        self,
        fn: RewardFn | BatchedRewardFn,
        chunks: list[list[tuple[str, str, str]]],
        timeout_s: float | None,
        batched: bool = False,
    ) -> list[list[Outcome]]:
        """Outcomes of every chunk of (prompt, completion, answer) rows, `timeout_s` per call."""
        with self._turn:
            return self._map(fn, chunks, timeout_s, batched)

    def _map(
        self,
        fn: RewardFn | BatchedRewardFn,
        chunks: list[list[tuple[str, str, str]]],
        timeout_s: float | None,
        batched: bool,
    ) -> list[list[Outcome]]:
        if self.closed:
            raise ValueError("this RewardPool is closed; make a new one")
        index, entry = self._entry(fn)
        limit = math.inf if timeout_s is None else timeout_s
        results: list[list[Outcome] | None] = [None] * len(chunks)
        todo = list(range(len(chunks)))[::-1]
        while len(self._pool) < min(self.workers, len(chunks)):
            self._pool.append(_Worker(self.kind, self._context))
        try:
            while todo or any(w.task for w in self._pool):
                now = time.monotonic()
                for i, w in enumerate(self._pool):
                    if w.task is None and todo:
                        try:
                            w.send(index, entry, batched, chunks[todo[-1]])
                        except OSError:  # it died while idle: a fresh one takes the chunk
                            w.abandon()
                            self._pool[i] = _Worker(self.kind, self._context)
                            continue
                        j = todo.pop()
                        w.task = (j, now + (_LOAD_TIMEOUT_S if w.loading else limit))
                busy = [w for w in self._pool if w.task]
                if not busy:
                    continue
                wait = min(w.task[1] for w in busy) - time.monotonic()
                ready = multiprocessing.connection.wait(
                    [w.conn for w in busy], timeout=None if wait == math.inf else max(wait, 0.0)
                )
                for i, w in enumerate(self._pool):
                    if w.task is None:
                        continue
                    j, deadline = w.task
                    if w.conn in ready:
                        try:
                            tag, value = w.conn.recv()
                        except (EOFError, OSError):
                            outcome = (0.0, "exit", w.died())
                        else:
                            if tag == "load_error":
                                raise ValueError(
                                    f"a reward worker could not load {fn!r} ({value}); define "
                                    "it in an importable module, or set reward.kind='thread'"
                                )
                            if tag == "loaded":  # the call's own time starts now
                                w.loading, w.task = False, (j, time.monotonic() + limit)
                            else:
                                results[j], w.task = value, None
                            continue
                    elif time.monotonic() >= deadline:
                        what, seconds = ("the call", limit)
                        if w.loading:
                            what, seconds = ("loading the reward function", _LOAD_TIMEOUT_S)
                        outcome = (0.0, "timeout", f"{what} was abandoned after {seconds} s")
                    else:
                        continue
                    results[j] = [outcome] * len(chunks[j])
                    w.abandon()
                    self._pool[i] = _Worker(self.kind, self._context)
        except BaseException:  # an interrupt or a load error: no worker is left mid-call
            for i, w in enumerate(self._pool):
                if w.task is not None:
                    w.abandon()
                    self._pool[i] = _Worker(self.kind, self._context)
            raise
        return results  # type: ignore[return-value]  # every chunk was filled above

    def score_completions(
        self,
        reward_fn: RewardFn | BatchedRewardFn,
        prompts: Sequence[str],
        completions: Sequence[str],
        answers: Sequence[str],
        timeout_s: float | None = None,
        batched: bool = False,
        batch_size: int | None = None,
        max_abs: float = FLOAT32_MAX,
        dims: int | None = None,
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Rewards [B] float32 ([B, K] with `dims`=K: reward components) and failure counts
        per kind, as `score_completions_parallel`."""
        b = len(prompts)
        if not b == len(completions) == len(answers):
            raise ValueError(
                f"got {b} prompts, {len(completions)} completions and {len(answers)} answers; "
                "pass one of each per sample"
            )
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive, or None for no limit")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1, or None for one call")
        rows = list(zip(prompts, completions, answers))
        size = (batch_size or max(b, 1)) if batched else 1
        chunks = [rows[i : i + size] for i in range(0, b, size)]
        outcomes = [o for chunk in self.map(reward_fn, chunks, timeout_s, batched) for o in chunk]
        return tally_outcomes(outcomes, max_abs, dims)

    def close(self) -> None:
        """Stops every worker (idle ones asked, busy ones killed); the pool cannot be reused."""
        for w in self._pool:
            if w.task is None:
                w.close()
            else:
                w.abandon()
        self._pool, self._fns, self.closed = [], {}, True


_SHARED: dict[tuple[str, int], RewardPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(kind: str, workers: int) -> RewardPool:
    """The process's pool of `kind` with `workers` workers, made on first use and reused."""
    with _SHARED_LOCK:
        pool = _SHARED.get((kind, workers))
        if pool is None or pool.closed:
            pool = _SHARED[(kind, workers)] = RewardPool(kind, workers)
        return pool


def close_shared_pools() -> None:
    """Closes every `shared_pool` (the driver does so at the end of a run, error or not)."""
    while _SHARED:
        _SHARED.popitem()[1].close()


def score_on_shared_pool(
    reward_fn: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    *,
    kind: str,
    workers: int,
    timeout_s: float | None,
    max_abs: float = FLOAT32_MAX,
    dims: int | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """`score_completions` on `shared_pool(kind, workers)`: the run's contained scorer."""
    pool = shared_pool(kind, workers)
    return pool.score_completions(
        reward_fn, prompts, completions, answers, timeout_s=timeout_s, max_abs=max_abs, dims=dims
    )


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
    start_method: str = "forkserver",
    max_abs: float = FLOAT32_MAX,
    dims: int | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """Rewards of B completions scored on a one-off pool, with failed calls scored 0.

    Args:
      reward_fn: `RewardFn` called per row, or with batched=True a `BatchedRewardFn`.
      prompts, completions, answers: B strings each, row i one sample.
      timeout_s: per-call time limit in seconds (per chunk when batched), from dispatch or,
        for a fresh process, from when it has loaded the function; hard in process mode,
        abandon-only in thread mode (module docstring); None for none.
      max_workers: workers running calls at once.
      kind: "thread" or "process" (the reward function must pickle).
      batched: reward_fn takes lists of a chunk's rows and returns one reward per row.
      batch_size: rows per batched call; None for all B in one call.
      start_method: multiprocessing start method of process workers.
      max_abs: a reward beyond +-max_abs is a failure of kind "out_of_range".
      dims: K where reward_fn returns K components of one reward; None for one number.

    Returns:
      rewards: [B] float32 ([B, K] with `dims`), in input order.
      failures: count of failed rows per kind, every kind of `FAILURE_KINDS` present.

    Raises:
      ValueError: on mismatched lengths, a bad timeout_s, max_workers, kind or batch_size, or
        a process-mode reward function that does not pickle.
    """
    with RewardPool(kind, max_workers, start_method) as pool:
        return pool.score_completions(
            reward_fn,
            prompts,
            completions,
            answers,
            timeout_s,
            batched,
            batch_size,
            max_abs,
            dims,
        )
