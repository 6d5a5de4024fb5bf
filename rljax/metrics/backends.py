"""More places a run's metrics go: Weights & Biases and MLflow, chosen by `log.backends`.

`MetricsWriter` always writes `metrics.jsonl` (resume, reports and `rljax report` read it)
and, with "tensorboard" in `log.backends`, TensorBoard events. The backends here get the same
floats every step through one small interface (`write(step, scalars)`, `close()`); each is an
optional extra (`pip install rljax[wandb]`, `rljax[mlflow]`), imported only when chosen.

- "wandb": one W&B run per run directory. Its id is kept in `run_dir/wandb_id`, so a resumed
  run continues the same W&B run (`resume="allow"`); steps a crashed run logged after its
  checkpoint are logged again with the same values (resume is exact), which W&B ignores as
  already seen. `WANDB_MODE=offline` (or `disabled`) works with no network; files go under
  `run_dir/wandb`.
- "mlflow": a run in an SQLite store in the run directory (`sqlite:///run_dir/mlflow.db`;
  MLflow's file store is in maintenance mode) unless `MLFLOW_TRACKING_URI` names another;
  `log.project` is the experiment. The run id is kept in `run_dir/mlflow_run_id` for resumes;
  the flattened config is logged as parameters once, at the start.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

# What `log.backends` may name; "jsonl" is required.
BACKENDS = ("jsonl", "tensorboard", "wandb", "mlflow")
EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}  # backend -> the pip extra that provides it


class Backend(Protocol):
    """Where a step's scalar metrics go besides metrics.jsonl."""

    def write(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def parse_backends(spec: str | Sequence[str]) -> tuple[str, ...]:
    """`log.backends` ("jsonl,tensorboard,wandb" or a sequence) -> the names, checked.

    Raises:
      ValueError: an unknown name, or a list without "jsonl".
    """
    names = tuple(n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec))
    names = tuple(n for n in names if n)
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise ValueError(f"log.backends names unknown backends {unknown}; choose from {BACKENDS}")
    if "jsonl" not in names:
        raise ValueError(
            f"log.backends={','.join(names)!r} must include 'jsonl' (resume and reports read "
            "metrics.jsonl); e.g. 'jsonl,tensorboard,wandb'"
        )
    return names


def _stored_id(path: str, make: Any) -> tuple[str, bool]:
    """(the id kept in `path`, whether it was there), writing `make()` there if not."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read().strip(), True
    value = str(make())
    with open(path, "w", encoding="utf-8") as f:
        f.write(value + "\n")
    return value, False


def _require(module: str, backend: str) -> Any:
    try:
        return __import__(module)
    except ImportError as err:
        raise ImportError(
            f"log.backends names {backend!r} but {module} is not installed; "
            f"pip install 'rljax[{EXTRAS[backend]}]'"
        ) from err


class WandbBackend:
    """Metrics to a Weights & Biases run (see the module docstring).

    Args:
      run_dir: the run directory (W&B's files and the run id go there).
      config: the run's config as a plain dict (W&B's run config).
      project: the W&B project.
      name: the run's display name.
    """

    def __init__(self, run_dir: str, config: dict[str, Any], project: str, name: str):
        wandb = _require("wandb", "wandb")
        run_id, _ = _stored_id(os.path.join(run_dir, "wandb_id"), lambda: uuid.uuid4().hex[:12])
        self.run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            dir=run_dir,
            config=config,
            settings=wandb.Settings(console="off", silent=True),
        )

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=int(step))

    def close(self) -> None:
        self.run.finish()


class MlflowBackend:
    """Metrics to an MLflow run (see the module docstring).

    Args:
      run_dir: the run directory (the SQLite store and the run id go there).
      config: the run's config as a plain dict (flattened into parameters).
      project: the MLflow experiment.
      name: the run's name.
    """

    def __init__(self, run_dir: str, config: dict[str, Any], project: str, name: str):
        _require("mlflow", "mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (
            "sqlite:///" + os.path.join(os.path.abspath(run_dir), "mlflow.db")
        )
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(project)
        experiment = found.experiment_id if found else self.client.create_experiment(project)

        def new_run() -> str:
            return self.client.create_run(experiment, run_name=name).info.run_id

        self.run_id, resumed = _stored_id(os.path.join(run_dir, "mlflow_run_id"), new_run)
        if resumed:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            params = [Param(k, str(v)[:6000]) for k, v in sorted(_flat(config).items())]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 per batch
                self.client.log_batch(self.run_id, params=params[i : i + 100])

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, float(v), now, int(step)) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 per batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict -> {"section.key": value}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def build_backends(
    names: Sequence[str], run_dir: str, config: dict[str, Any], project: str, name: str
) -> list[Backend]:
    """The backends of `names` beyond jsonl and tensorboard (which `MetricsWriter` writes)."""
    made: list[Backend] = []
    for backend in names:
        if backend == "wandb":
            made.append(WandbBackend(run_dir, config, project, name))
        elif backend == "mlflow":
            made.append(MlflowBackend(run_dir, config, project, name))
    return made
