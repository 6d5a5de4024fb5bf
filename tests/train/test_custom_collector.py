"""A collector of one's own is one file: this one replays the previous step's fresh batch
(a one-step-delayed replay), keeps it as checkpointed host state, and trains through the
driver with `train(config, wrap_collector=...)`."""

from typing import Any

import numpy as np
from launching import tiny_driver_run

from configs.grpo_addition import get_config
from rljax.core.state import TrainState
from rljax.train.collector import Collection, Collector
from rljax.train.host_batch import HostBatch
from rljax.train.loop import train


class ReplayPrevious:
    """Learns from each step's fresh batch, then from the previous step's once more."""

    def __init__(self, inner: Collector):
        self.inner = inner
        self.previous: HostBatch | None = None

    def collect(self, state: TrainState, step: int) -> Collection:
        fresh, replay, metrics = self.inner.collect(state, step)
        replay = [*replay, *([] if self.previous is None else [self.previous])]
        self.previous = fresh[0]
        return Collection(fresh, replay, {**metrics, "previous/held": float(len(replay))})

    def state(self) -> dict[str, Any]:
        return {
            **self.inner.state(),
            "previous": {} if self.previous is None else self.previous.rows,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.inner.load(state)
        rows = state.get("previous") or None
        self.previous = None if rows is None else HostBatch(rows, self.inner.group_size)


def test_a_custom_collector_trains_through_the_driver(tmp_path):
    config = tiny_driver_run(get_config(), tmp_path / "run", steps=3)
    made = []

    def wrap(inner):
        made.append(ReplayPrevious(inner))
        return made[0]

    records = {r["step"]: r for r in train(config, wrap_collector=wrap)}
    assert "replay/loss" not in records[1] and records[1]["previous/held"] == 0
    assert np.isfinite(records[2]["replay/loss"]) and records[3]["previous/held"] == 1
    # Its host state is what the checkpoint stores: a second collector resumes from it.
    resumed = ReplayPrevious(made[0].inner)
    resumed.load(made[0].state())
    for key, value in made[0].previous.rows.items():
        np.testing.assert_array_equal(resumed.previous.rows[key], value)
