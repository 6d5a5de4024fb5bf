"""SIGINT and SIGTERM stop a run cleanly: the step in flight finishes and is checkpointed.

A scheduler's SIGTERM (preemption, `scancel`, `kill`) or a first Ctrl-C used to kill the
trainer wherever it was, losing the steps since the last checkpoint. `StopSignals` only
records the first signal; the driver checks it at the end of each step, saves that step and
raises `Stopped`, and the launcher exits with one line and code 128 + the signal number, as a
shell reports a process killed by it. During the SFT warm start the driver checks it whenever
the SFT loss is logged (every 10 SFT steps) and raises `StoppedInWarmStart`: nothing is saved
there yet. A second Ctrl-C aborts at once (KeyboardInterrupt).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from absl import logging

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """The run stopped on a signal after checkpointing step `step`; resuming continues there."""

    def __init__(self, signum: int, step: int):
        self.signum, self.step = signum, step
        name = signal.Signals(signum).name
        super().__init__(
            f"stopped by {name} at step {step}; checkpoint saved: resume with the same command"
        )

    @property
    def exit_code(self) -> int:
        """128 + the signal number: what a shell reports for a process the signal ended."""
        return 128 + self.signum


class StoppedInWarmStart(Stopped):
    """The run stopped on a signal during its SFT warm start, after SFT step `sft_step`; the
    warm start keeps no checkpoint, so a rerun starts it over."""

    def __init__(self, signum: int, sft_step: int, sft_steps: int):
        Exception.__init__(
            self,
            f"stopped by {signal.Signals(signum).name} during the SFT warm start (step "
            f"{sft_step} of {sft_steps}); the warm start is not checkpointed: rerunning the "
            "same command starts it over",
        )
        self.signum, self.step = signum, 0


class StopSignals:
    """Context manager: while open, the first SIGINT or SIGTERM is recorded in `received`
    instead of ending the process; a second SIGINT raises KeyboardInterrupt (a second
    SIGTERM is ignored: schedulers may repeat it). The previous handlers come back on exit.

    Outside the main thread Python cannot install handlers: it then does nothing.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            logging.warning(
                "%s received: finishing the step in flight and saving a checkpoint "
                "(Ctrl-C again to abort without saving)",
                signal.Signals(signum).name,
            )
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
