"""Where a step's time goes: timed calls and the time JAX spends compiling.

Every run logs, per step, `time/rollout_s` (sampling), `time/reward_s` (decoding and scoring
on the host), `time/old_logprobs_s` (the prepare pass: old and reference log-probs, statistics,
transforms), `time/update_s` and `time/other_s` (the rest), which add up to `time/step_s`;
`time/compile_s` is the part of the step JAX spent tracing, lowering and compiling (it overlaps
the phases). Evaluation and checkpoints are timed apart (`time/eval_s`, `time/checkpoint_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import jax

T = TypeVar("T")
# Phases that add up to a step, with the rest as "time/other_s".
STEP_PHASES = ("time/rollout_s", "time/reward_s", "time/old_logprobs_s", "time/update_s")
# jax.monitoring duration events of a compilation (trace, lowering to MLIR, XLA compile).
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def measures_the_machine(key: str) -> bool:
    """Whether a metric is a measurement of wall time (`time/*`, `perf/mfu` and a replay's
    `replay/perf/mfu`) or of how an overlapped run's two threads met (`sampler/*` times,
    `overlap/*` waits and queue depths), which differs between two otherwise identical runs
    (resume and reproducibility checks leave it out)."""
    return key.startswith(("time/", "sampler/", "overlap/")) or key.split("/")[-2:] == [
        "perf",
        "mfu",
    ]


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """(fn's result once its arrays are ready, the seconds it took)."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - start


def add_time(metrics: dict[str, float], key: str, seconds: float) -> None:
    """Adds `seconds` to `metrics[key]` (phases are summed over a step's calls)."""
    metrics[key] = metrics.get(key, 0.0) + seconds


class CompileClock:
    """Seconds JAX spent compiling while open, read per step with `take()`.

    A context manager: it listens to JAX's compilation events (`jax.monitoring`) between
    `__enter__` and `__exit__`.
    """

    def __init__(self):
        self._seconds = 0.0
        self._taken = 0.0

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        del kwargs
        if event in COMPILE_EVENTS:
            self._seconds += duration

    def __enter__(self) -> CompileClock:
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc: Any) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listen)

    def take(self) -> float:
        """Compile seconds since the last `take()` (or since the clock opened)."""
        seconds, self._taken = self._seconds - self._taken, self._seconds
        return seconds
