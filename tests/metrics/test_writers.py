"""MetricsWriter and SamplesWriter: JSONL content, NaN handling, resuming, TensorBoard events."""

import glob
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.metrics.writers import MetricsWriter, SamplesWriter, read_metrics, to_scalars


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


def test_resume_drops_what_a_crashed_run_logged_after_its_checkpoint(tmp_path):
    with MetricsWriter(str(tmp_path), tensorboard=False) as w:
        w.write(-1, {"sft/loss": 0.5})
        w.write(0, {"a": 1.0})
        w.write(1, {"a": 2.0})  # logged, then the run died before checkpointing step 1
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "a"')  # a line the kill cut short
    with MetricsWriter(str(tmp_path), tensorboard=False, resume_step=0) as w:
        w.write(1, {"a": 3.0, "b": 4.0})
        w.write(2, {"a": 5.0})
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert lines == [
        {"step": -1, "sft/loss": 0.5},
        {"step": 0, "a": 1.0},
        {"step": 1, "a": 3.0, "b": 4.0},
        {"step": 2, "a": 5.0},
    ]
    assert read_metrics(str(tmp_path)) == lines
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "a"')  # read_metrics skips a cut last line too
    assert read_metrics(str(tmp_path)) == lines
    with MetricsWriter(str(tmp_path), tensorboard=False) as w:  # a new run starts afresh
        w.write(0, {"a": 6.0})
    assert read_metrics(str(tmp_path)) == [{"step": 0, "a": 6.0}]


def test_samples_writer_writes_groups_and_resumes(tmp_path):
    group = {"prompt_id": 7, "prompt": "1+2=", "completions": ["3", "4"], "rewards": [1.0, 0.0]}
    writer = SamplesWriter(str(tmp_path))
    writer.write(1, [group])
    writer.write(2, [{**group, "prompt_id": 8}])
    writer.close()
    writer = SamplesWriter(str(tmp_path), resume_step=1)
    writer.write(2, [{**group, "prompt_id": 9}])
    writer.close()
    lines = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert lines == [{"step": 1, **group}, {"step": 2, **group, "prompt_id": 9}]


def test_non_scalar_metric_is_an_error():
    with pytest.raises(ValueError, match="'v' has shape"):
        to_scalars({"v": np.zeros(3)})


def _tensorboard_scalars(logdir):
    """(tag, step, value) from TensorBoard event files, read as TFRecords by hand."""
    import struct

    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4  # length, its crc, the record, its crc
            out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
    # tensorboardX imports torch (seconds) when it is installed; the writer keeps it out and
    # leaves it importable afterwards.
    program = f"""
import importlib.util, sys
from rljax.metrics.writers import MetricsWriter
with MetricsWriter({str(tmp_path)!r}) as w:
    w.write(3, {{"reward": 0.25}})
assert "torch" not in sys.modules
assert importlib.util.find_spec("torch") is None or __import__("torch")
"""
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120)
    assert _tensorboard_scalars(tmp_path / "tensorboard") == [("reward", 3, 0.25)]
