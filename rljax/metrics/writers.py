"""Metrics sinks: a JSONL file (one object per step, easy to plot) and TensorBoard events."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Device arrays and numpy scalars -> plain floats (one host transfer per metric)."""
    out = {}
    for key, value in metrics.items():
        value = np.asarray(value)
        if value.size != 1:
            raise ValueError(f"metric {key!r} has shape {value.shape}; metrics must be scalars")
        out[key] = float(value.reshape(()))
    return out


class MetricsWriter:
    """Writes `{"step": s, **metrics}` lines to `run_dir/metrics.jsonl` and TensorBoard events.

    Non-finite values are written as null in JSON (strict JSON has no NaN) and kept in
    TensorBoard. Appends, so a resumed run continues the same file.
    """

    def __init__(self, run_dir: str, tensorboard: bool = True):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # optional and slow to import

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Records one step's scalar metrics; returns them as floats."""
        scalars = to_scalars(metrics)
        record = {"step": int(step)}
        record.update({k: (v if math.isfinite(v) else None) for k, v in scalars.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, int(step))
        return scalars

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`, in order; the last record per step wins."""
    by_step: dict[int, dict[str, Any]] = {}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                by_step[record["step"]] = {**by_step.get(record["step"], {}), **record}
    return [by_step[s] for s in sorted(by_step)]
