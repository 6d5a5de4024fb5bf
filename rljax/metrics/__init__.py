"""Metrics: JSONL and TensorBoard writers, the rollout samples log, and run reports."""

from rljax.metrics.report import moving_average, write_report
from rljax.metrics.writers import (
    MetricsWriter,
    SamplesWriter,
    keep_records_until,
    read_metrics,
    to_scalars,
)

__all__ = [
    "MetricsWriter",
    "SamplesWriter",
    "keep_records_until",
    "moving_average",
    "read_metrics",
    "to_scalars",
    "write_report",
]
