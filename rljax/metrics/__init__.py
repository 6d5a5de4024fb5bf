"""Metrics: JSONL and TensorBoard writers."""

from rljax.metrics.writers import MetricsWriter, read_metrics, to_scalars

__all__ = ["MetricsWriter", "read_metrics", "to_scalars"]
