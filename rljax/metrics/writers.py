"""Metrics sinks: a JSONL file (one object per step, easy to plot), TensorBoard events, and
the optional backends of `rljax.metrics.backends` (W&B, MLflow)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rljax.metrics.backends import Backend


@contextlib.contextmanager
def _naming(path: str):
    """An OSError while writing `path` names it (a file object's write, flush and close errors,
    a full disk's ENOSPC among them, carry no file name)."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = path
        raise


def _summary_writer_class() -> type:
    """tensorboardX's SummaryWriter, imported without torch.

    tensorboardX imports torch whenever it is installed, only to accept torch tensors, which
    costs a launch 3 s; we log floats. A None entry in sys.modules makes `import torch` fail
    inside tensorboardX, and removing it afterwards leaves torch importable.
    """
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Device arrays and numpy scalars -> plain floats (one host transfer per metric)."""
    out = {}
    for key, value in metrics.items():
        value = np.asarray(value)
        if value.size != 1:
            raise ValueError(f"metric {key!r} has shape {value.shape}; metrics must be scalars")
        out[key] = float(value.reshape(()))
    return out


def keep_records_until(path: str, resume_step: int | None) -> None:
    """Drops the records of a JSONL log (objects with a "step") after `resume_step`.

    A run killed after its last checkpoint logged steps that the resumed run does again; they
    go, so each step keeps one record. None (a new run) drops them all. A last line cut short
    by the kill is dropped too. The file is rewritten atomically.
    """
    if not os.path.exists(path):
        return
    kept = []
    if resume_step is not None:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # the line the kill cut short
                    break
                if record["step"] <= resume_step:
                    kept.append(line.rstrip("\n") + "\n")
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(partial, path)


class MetricsWriter:
    """Writes `{"step": s, **metrics}` lines to `run_dir/metrics.jsonl` and TensorBoard events.

    Non-finite values are written as null in JSON (strict JSON has no NaN) and kept in
    TensorBoard. A resumed run continues the same file and event log from `resume_step`:
    what a crashed run logged after that step is dropped (`keep_records_until`; TensorBoard's
    purge_step), so the log holds each step once.

    Args:
      run_dir: where metrics.jsonl and tensorboard/ go.
      tensorboard: also write TensorBoard events.
      resume_step: the step the run continues from; None for a new run (earlier logs in
        run_dir are replaced).
      backends: more places every step's scalars go (W&B, MLflow:
        `rljax.metrics.backends`); closed with the writer.
    """

    def __init__(
        self,
        run_dir: str,
        tensorboard: bool = True,
        resume_step: int | None = None,
        backends: Sequence[Backend] = (),
    ):
        self.backends = list(backends)
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        keep_records_until(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            logdir = os.path.join(run_dir, "tensorboard")
            if resume_step is None:
                shutil.rmtree(logdir, ignore_errors=True)
            purge = None if resume_step is None else resume_step + 1
            self._tb = _summary_writer_class()(logdir, purge_step=purge)
            self._tb_dir = logdir

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Records one step's scalar metrics; returns them as floats."""
        scalars = to_scalars(metrics)
        record = {"step": int(step)}
        record.update({k: (v if math.isfinite(v) else None) for k, v in scalars.items()})
        with _naming(self.path):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, int(step))
        for backend in self.backends:
            backend.write(int(step), scalars)
        return scalars

    def close(self) -> None:
        """Closes the file, the event log and the backends (each even if another fails)."""
        with contextlib.ExitStack() as closing:
            for backend in self.backends:
                closing.callback(backend.close)
            if self._tb is not None:
                closing.callback(self._close_events)
            with _naming(self.path):
                self._file.close()

    def _close_events(self) -> None:
        with _naming(self._tb_dir):
            self._tb.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SamplesWriter:
    """Writes rollouts to `run_dir/samples.jsonl`: one line per prompt group and step.

    Each line is `{"step", "prompt_id", "prompt", "completions", "rewards"}`, for reading what
    the policy writes as it trains. Resumes like `MetricsWriter` (records after `resume_step`
    are dropped).
    """

    def __init__(self, run_dir: str, resume_step: int | None = None):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "samples.jsonl")
        keep_records_until(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, groups: list[dict[str, Any]]) -> None:
        """Appends one step's groups (each with prompt_id, prompt, completions, rewards)."""
        lines = [json.dumps({"step": int(step), **group}) + "\n" for group in groups]
        with _naming(self.path):
            self._file.writelines(lines)
            self._file.flush()

    def close(self) -> None:
        with _naming(self.path):
            self._file.close()


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`, in order; the last record per step wins. A last
    line cut short (a run killed while writing it) is skipped."""
    by_step: dict[int, dict[str, Any]] = {}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not line.endswith("\n"):
                break
            raise
        by_step[record["step"]] = {**by_step.get(record["step"], {}), **record}
    return [by_step[s] for s in sorted(by_step)]
