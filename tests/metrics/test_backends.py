"""W&B (offline) and MLflow (a local SQLite store) receive what metrics.jsonl holds, resume
into the same run, and a bad `log.backends` fails in one line."""

import glob
import json
import math
import os

import pytest

from rljax.metrics.backends import MlflowBackend, WandbBackend, parse_backends
from rljax.metrics.writers import MetricsWriter, read_metrics

wandb = pytest.importorskip("wandb")
pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

CONFIG = {"train": {"steps": 3, "learning_rate": 1e-3}, "algorithm": {"name": "grpo"}}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def wandb_records(path: str) -> list:
    """The protobuf records of a W&B run file (`run-<id>.wandb`): a 7-byte header, then
    LevelDB-log blocks of 32 KiB whose chunks (crc32 4, length 2, type 1, data) join into
    records (type 1 whole, 2 first, 3 middle, 4 last)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:8]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: str) -> dict[int, dict[str, float]]:
    """step -> the metrics W&B recorded, over every offline run file of the run's id."""
    out: dict[int, dict[str, float]] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "*.wandb"))):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            step = int(items.pop("_step"))
            out[step] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


def write_steps(run_dir, steps, resume_step=None, backends=()):
    with MetricsWriter(str(run_dir), False, resume_step, backends) as writer:
        for step in steps:
            writer.write(step, {"loss": 1.0 / (step + 1), "reward/mean": 0.25 * step})


def test_wandb_offline_gets_every_step_and_a_resume_continues_the_run(tmp_path):
    write_steps(tmp_path, [0, 1, 2], backends=[WandbBackend(str(tmp_path), CONFIG, "p", "run")])
    run_id = open(tmp_path / "wandb_id").read().strip()
    # Resumed from the step-1 checkpoint: step 2 again, then 3; the same W&B run id.
    write_steps(tmp_path, [2, 3], 1, backends=[WandbBackend(str(tmp_path), CONFIG, "p", "run")])
    assert open(tmp_path / "wandb_id").read().strip() == run_id
    runs = glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{run_id}"))
    assert len(runs) == 2, runs
    history = wandb_history(str(tmp_path))
    jsonl = {r["step"]: r for r in read_metrics(str(tmp_path))}
    assert sorted(history) == sorted(jsonl) == [0, 1, 2, 3]
    for step, metrics in history.items():
        assert metrics == {k: v for k, v in jsonl[step].items() if k != "step"}, step


def test_mlflow_gets_every_step_params_once_and_a_resume_continues_the_run(tmp_path):
    backend = MlflowBackend(str(tmp_path), CONFIG, "rljax-test", "run")
    with MetricsWriter(str(tmp_path), False, None, [backend]) as writer:
        writer.write(0, {"loss": 0.5, "reward/mean": float("nan")})
        writer.write(1, {"loss": 0.25, "reward/mean": 0.5})
    run_id = backend.run_id
    resumed = MlflowBackend(str(tmp_path), CONFIG, "rljax-test", "run")
    assert resumed.run_id == run_id
    with MetricsWriter(str(tmp_path), False, 1, [resumed]) as writer:
        writer.write(2, {"loss": 0.125, "reward/mean": 1.0})
    client = MlflowClient("sqlite:///" + str(tmp_path / "mlflow.db"))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params == {
        "train.steps": "3",
        "train.learning_rate": "0.001",
        "algorithm.name": "grpo",
    }
    loss = [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")]
    assert sorted(loss) == [(0, 0.5), (1, 0.25), (2, 0.125)]
    reward = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "reward/mean"))
    assert math.isnan(reward[0][1]) and reward[1:] == [(1, 0.5), (2, 1.0)]


@pytest.mark.parametrize(
    "spec,match",
    [
        ("jsonl,wandbb", r"unknown backends \['wandbb'\]"),
        ("tensorboard,wandb", "must include 'jsonl'"),
    ],
)
def test_bad_backends_name_the_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_backends(spec)


def test_backends_parse_with_spaces_and_sequences():
    assert parse_backends(" jsonl , wandb,") == ("jsonl", "wandb")
    assert parse_backends(["jsonl", "mlflow"]) == ("jsonl", "mlflow")


def test_a_training_run_logs_the_same_numbers_to_every_backend(tmp_path):
    from configs.grpo_addition import get_config
    from rljax.train.loop import train
    from tests.train.launching import tiny_driver_run

    config = tiny_driver_run(get_config(), tmp_path, steps=2)
    config.log.update(backends="jsonl,tensorboard,wandb,mlflow", project="rljax-test", name="tiny")
    train(config)
    jsonl = {r["step"]: r for r in read_metrics(str(tmp_path))}
    assert sorted(jsonl) == [0, 1, 2] and "reward/mean" in jsonl[2]
    history = wandb_history(str(tmp_path))
    assert sorted(history) == [0, 1, 2]
    client = MlflowClient("sqlite:///" + str(tmp_path / "mlflow.db"))
    run_id = open(tmp_path / "mlflow_run_id").read().strip()
    assert client.get_run(run_id).data.params["log.name"] == "tiny"
    for step, record in jsonl.items():
        logged = {k: v for k, v in record.items() if k != "step" and v is not None}
        assert {k: history[step][k] for k in logged} == logged, step
    for key in ("reward/mean", "loss", "eval/accuracy"):
        mlflow_values = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        assert mlflow_values == {s: r[key] for s, r in jsonl.items() if key in r}, key
    assert os.listdir(tmp_path / "tensorboard")
