"""Checkpointer: driver state, manifests that name corrupted files, mismatches, partial writes."""

import numpy as np
import pytest

from rljax.train.checkpoint import MANIFEST, Checkpointer

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


def saved(tmp_path, async_save):
    checkpointer = Checkpointer(str(tmp_path), async_save=async_save)
    checkpointer.save(1, {"params": {"w": np.ones((4, 3), np.float32)}}, {"pos": 1})
    checkpointer.wait()
    return checkpointer, tmp_path / "1"


def array_files(step_dir):
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d")


@pytest.mark.parametrize("async_save", [False, True])
def test_a_flipped_byte_in_an_array_file_is_named(tmp_path, async_save):
    checkpointer, step_dir = saved(tmp_path, async_save)
    assert (step_dir / MANIFEST).exists()
    like = {"params": {"w": np.zeros((4, 3), np.float32)}}
    state, _ = checkpointer.restore(1, like)  # intact: restores
    np.testing.assert_array_equal(state["params"]["w"], np.ones((4, 3)))
    for target in array_files(step_dir):  # orbax alone restores these without a word
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"checkpoint file .*/1/state/(.*/)?d/\w+ differs from"):
        checkpointer.restore(1, like)


def test_truncated_and_missing_files_are_named(tmp_path):
    checkpointer, step_dir = saved(tmp_path, False)
    like = {"params": {"w": np.zeros((4, 3), np.float32)}}
    target = array_files(step_dir)[0]
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[:10])
    with pytest.raises(ValueError, match=f"{target} has 10 bytes, {size} were written"):
        checkpointer.restore(1, like)
    target.unlink()
    with pytest.raises(ValueError, match=f"{target} is missing"):
        checkpointer.restore(1, like)


def test_a_checkpoint_of_another_model_names_the_first_differing_tensor(tmp_path):
    checkpointer, _ = saved(tmp_path, False)
    with pytest.raises(
        ValueError, match=r"params/w has shape \(4, 3\) in the checkpoint, \(5, 3\)"
    ):
        checkpointer.restore(1, {"params": {"w": np.zeros((5, 3), np.float32)}})
    with pytest.raises(ValueError, match="params/b is in this run's state but not in the"):
        checkpointer.restore(1, {"params": {"w": np.zeros((4, 3), np.float32), "b": np.zeros(2)}})


def test_a_half_written_checkpoint_is_not_picked_up(tmp_path):
    checkpointer, step_dir = saved(tmp_path, False)
    checkpointer.close()
    partial = tmp_path / "2.orbax-checkpoint-tmp"  # what a kill mid-write leaves
    partial.mkdir()
    (partial / "state").mkdir()
    checkpointer = Checkpointer(str(tmp_path), async_save=False)
    assert checkpointer.latest_step() == 1
    assert checkpointer.all_steps() == [1]
