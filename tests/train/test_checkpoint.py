"""Checkpointer: the driver state (UEC-RL's buffers) round-trips beside the train state."""

import numpy as np
import pytest

from rljax.train.checkpoint import Checkpointer

STATE = {"w": np.arange(3, dtype=np.float32)}  # any pytree stands in for a TrainState here


def test_driver_state_round_trips_and_missing_driver_state_is_named(tmp_path):
    checkpointer = Checkpointer(str(tmp_path), async_save=False)
    rows = {"rewards": np.array([1.0, 0.0], np.float32), "ids": np.array([[1, 2], [3, 4]])}
    checkpointer.save(1, STATE, {"pos": 7}, {"batch": rows, "replay": {}})
    checkpointer.save(2, STATE, {"pos": 9})
    checkpointer.wait()

    state, data = checkpointer.restore(1, STATE)
    np.testing.assert_array_equal(state["w"], STATE["w"])
    assert data == {"pos": 7}
    driver = checkpointer.restore_driver(1)
    assert sorted(driver["batch"]) == ["ids", "rewards"]
    for key, value in rows.items():
        np.testing.assert_array_equal(driver["batch"][key], value)
    assert not driver.get("replay")

    with pytest.raises(FileNotFoundError, match="2 holds no driver state"):
        checkpointer.restore_driver(2)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint for step 3"):
        checkpointer.restore_driver(3)
    checkpointer.close()
