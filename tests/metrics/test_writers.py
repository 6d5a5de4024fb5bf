"""MetricsWriter: JSONL content, NaN handling, appending on resume, TensorBoard events."""

import glob
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.metrics.writers import MetricsWriter, read_metrics, to_scalars


def test_jsonl_and_tensorboard(tmp_path):
    with MetricsWriter(str(tmp_path)) as w:
        w.write(0, {"reward": jnp.asarray(0.5), "loss": np.float32(1.25)})
        w.write(1, {"reward": 0.75, "loss": float("nan")})
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert lines == [
        {"step": 0, "reward": 0.5, "loss": 1.25},
        {"step": 1, "reward": 0.75, "loss": None},
    ]
    assert glob.glob(os.path.join(tmp_path, "tensorboard", "events.out.tfevents.*"))


def test_resume_appends_and_read_keeps_last_per_step(tmp_path):
    with MetricsWriter(str(tmp_path), tensorboard=False) as w:
        w.write(0, {"a": 1.0})
        w.write(1, {"a": 2.0})
    with MetricsWriter(str(tmp_path), tensorboard=False) as w:  # resumed after step 0
        w.write(1, {"a": 3.0, "b": 4.0})
        w.write(2, {"a": 5.0})
    assert read_metrics(str(tmp_path)) == [
        {"step": 0, "a": 1.0},
        {"step": 1, "a": 3.0, "b": 4.0},
        {"step": 2, "a": 5.0},
    ]


def test_non_scalar_metric_is_an_error():
    with pytest.raises(ValueError, match="'v' has shape"):
        to_scalars({"v": np.zeros(3)})
