"""Fault injection for crash-safety tests: SIGKILL the trainer at a chosen step and phase.

`RLJAX_KILL_AT="STEP:PHASE"` in the environment kills the process with SIGKILL (no cleanup,
no flush, as the OOM killer or a preempted node would) when the driver reaches that point:

  rollout     step STEP's samples are generated, rewards not yet scored;
  update      step STEP's update is dispatched and still computing;
  checkpoint  step STEP's checkpoint is being written in the background;
  saved       step STEP's checkpoint is complete on disk.

Except at `checkpoint`, the driver lets earlier checkpoint writes finish first (`settle`), so
a test knows which checkpoints a resume can find.

Unset, `maybe_kill` does nothing. Tests start the launcher with it; users never need it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

PHASES = ("rollout", "update", "checkpoint", "saved")
ENV = "RLJAX_KILL_AT"


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
