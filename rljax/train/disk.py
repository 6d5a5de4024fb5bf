"""A full disk, said once: what was being written, where, and the step a resume starts from.

When the disk fills, orbax's writer threads, tensorboardX's event thread and the metrics file
each fail with their own traceback (699 lines before the one useful line). `DiskFullErrors`
turns the run's failure into one `DiskFull` and keeps the background threads' disk-full
tracebacks quiet (thread exceptions, and orbax's error logs through absl's logger): the main
thread reports it. Not quieted: tensorstore's C++ callbacks print "Event loop is closed"
tracebacks of orbax's stopped event loops directly, in some runs (2 of 9 measured).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType

_NO_SPACE = "No space left on device"  # tensorstore reports ENOSPC as a ValueError with this


class DiskFull(OSError):
    """The disk of the run directory is full; the message is the one line the launcher prints."""


def is_disk_full(err: BaseException | None) -> bool:
    """Whether `err` or an exception it was raised from or during is a full disk (ENOSPC)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if _NO_SPACE in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _filename(err: BaseException | None) -> str | None:
    """The file the first ENOSPC OSError in `err`'s chain names, if any."""
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename:
            return os.fspath(err.filename)
        err = err.__cause__ or err.__context__
    return None


class DiskFullErrors:
    """Context manager over a run: a disk-full error leaving it becomes one `DiskFull`.

    Args:
      run_dir: the run directory (metrics, TensorBoard events, checkpoints below it).
      latest_step: the newest complete checkpoint's step (None: none yet), asked on failure.
    """

    def __init__(self, run_dir: str, latest_step: Callable[[], int | None]):
        self.run_dir, self.latest_step = run_dir, latest_step
        self._hook = threading.excepthook
        self._absl = logging.getLogger("absl")

    def __enter__(self) -> DiskFullErrors:
        previous = self._hook = threading.excepthook

        def quiet(args: threading.ExceptHookArgs) -> None:  # the main thread reports it
            if not is_disk_full(args.exc_value):
                previous(args)

        threading.excepthook = quiet
        self._absl.addFilter(self._quiet_log)
        return self

    @staticmethod
    def _quiet_log(record: logging.LogRecord) -> bool:
        """False (drop) for a log record of a disk-full error."""
        err = record.exc_info[1] if record.exc_info else None
        return not (is_disk_full(err) or _NO_SPACE in record.getMessage())

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        threading.excepthook = self._hook
        self._absl.removeFilter(self._quiet_log)
        if err is None or isinstance(err, DiskFull) or not is_disk_full(err):
            return
        checkpoints = os.path.join(self.run_dir, "checkpoints")
        file = _filename(err)
        if file is None:  # tensorstore names no file: a checkpoint write
            what, where = "a checkpoint", checkpoints
        elif file.startswith(checkpoints):
            what, where = "a checkpoint", checkpoints
        else:
            what, where = os.path.basename(file), os.path.dirname(file)
        try:
            step = self.latest_step()
        except Exception:  # the checkpointer may be closed or broken by now
            step = None
        last = "no checkpoint yet" if step is None else f"the last checkpoint is step {step}"
        full = DiskFull(f"disk full writing {what} under {where}: free space and resume ({last})")
        full.errno = errno.ENOSPC
        raise full from None
