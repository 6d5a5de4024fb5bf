"""Fault injection for crash-safety tests: SIGKILL the trainer at a chosen step and phase, or
poison chosen steps' batches with a NaN.

`RLJAX_KILL_AT="STEP:PHASE"` in the environment kills the process with SIGKILL (no cleanup,
no flush, as the OOM killer or a preempted node would) when the driver reaches that point:

  rollout     step STEP's samples are generated, rewards not yet scored;
  update      step STEP's update is dispatched and still computing;
  checkpoint  step STEP's checkpoint is being written in the background;
  saved       step STEP's checkpoint is complete on disk.

Except at `checkpoint`, the driver lets earlier checkpoint writes finish first (`settle`), so
a test knows which checkpoints a resume can find.

`RLJAX_NAN_AT="STEP,STEP,..."` sets the first row's reward to NaN in the batches those steps
learn from, after scoring (as a buggy collector or transform would): the update of such a step
is non-finite and the numerical guard must roll it back (`rljax.train.guard`).

Unset, `maybe_kill` and `maybe_poison` do nothing. Tests start the launcher with them; users
never need them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import numpy as np

from rljax.train.host_batch import HostBatch

PHASES = ("rollout", "update", "checkpoint", "saved")
ENV = "RLJAX_KILL_AT"
NAN_ENV = "RLJAX_NAN_AT"


def kill_target() -> tuple[int, str] | None:
    """The (step, phase) named by RLJAX_KILL_AT, or None.

    Raises:
      ValueError: the variable is set but is not STEP:PHASE with a known phase.
    """
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    step, _, phase = spec.partition(":")
    if not step.lstrip("-").isdigit() or phase not in PHASES:
        raise ValueError(f"{ENV}={spec!r} must be STEP:PHASE with PHASE one of {PHASES}")
    return int(step), phase


def maybe_kill(step: int, phase: str, settle: Callable[[], None] | None = None) -> None:
    """SIGKILLs this process if RLJAX_KILL_AT names (step, phase), after calling `settle`."""
    if kill_target() == (step, phase):
        if settle is not None:
            settle()
        os.kill(os.getpid(), signal.SIGKILL)


def poisoned_steps() -> frozenset[int]:
    """The steps named by RLJAX_NAN_AT (empty when unset).

    Raises:
      ValueError: the variable is set but is not a comma-separated list of steps.
    """
    spec = os.environ.get(NAN_ENV, "")
    steps = [part.strip() for part in spec.split(",") if part.strip()]
    if not all(part.isdigit() for part in steps):
        raise ValueError(f"{NAN_ENV}={spec!r} must be comma-separated step numbers")
    return frozenset(int(part) for part in steps)


def maybe_poison(step: int, batch: HostBatch) -> HostBatch:
    """`batch` with its first reward set to NaN if RLJAX_NAN_AT names `step`, else `batch`."""
    if step not in poisoned_steps():
        return batch
    rewards = np.array(batch.rows["rewards"], copy=True)
    rewards[0] = np.nan
    return HostBatch({**batch.rows, "rewards": rewards}, batch.group_size)
