"""Checkpointer: driver state, manifests that name corrupted files, mismatches, partial writes."""

import os

import numpy as np
import optax
import pytest

from rljax.train import checkpoint
from rljax.train.checkpoint import MANIFEST, Checkpointer, write_manifest

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


def test_a_per_layer_checkpoint_is_named_as_the_layout_before_the_layer_scan():
    """Checkpoints written before the blocks were stacked hold layers/0/..., layers/1/...."""
    stored = {"params": {"layers": {"0": {"q": np.zeros(2)}, "1": {"q": np.zeros(2)}}}}
    like = {"params": {"layers": {"q": np.zeros((2, 2))}}}
    message = checkpoint.describe_mismatch(stored, like)
    assert message.startswith("params/layers/0/q is in the checkpoint: it holds one entry per")
    assert "rljax version that wrote it" in message
    stacked = {"params": {"layers": {"q": np.zeros((3, 2))}}}
    assert "one entry per layer" not in checkpoint.describe_mismatch(stacked, like)


def test_a_half_written_checkpoint_is_not_picked_up(tmp_path):
    checkpointer, step_dir = saved(tmp_path, False)
    checkpointer.close()
    partial = tmp_path / "2.orbax-checkpoint-tmp"  # what a kill mid-write leaves
    partial.mkdir()
    (partial / "state").mkdir()
    checkpointer = Checkpointer(str(tmp_path), async_save=False)
    assert checkpointer.latest_step() == 1
    assert checkpointer.all_steps() == [1]


def test_the_manifest_is_written_before_the_checkpoint_becomes_visible(tmp_path, monkeypatch):
    seen = []

    def recording(step_dir):
        seen.append((os.path.basename(step_dir), os.path.exists(tmp_path / "1")))
        write_manifest(step_dir)

    monkeypatch.setattr(checkpoint, "write_manifest", recording)
    saved(tmp_path, async_save=False)  # a synchronous save too: no window without a manifest
    [(written, visible)] = seen
    assert written.startswith("1.orbax-checkpoint-tmp") and not visible
    assert (tmp_path / "1" / MANIFEST).exists()


def test_a_checkpoint_without_a_manifest_is_refused_unless_allowed(tmp_path):
    checkpointer, step_dir = saved(tmp_path, False)
    (step_dir / MANIFEST).unlink()
    like = {"params": {"w": np.zeros((4, 3), np.float32)}}
    with pytest.raises(ValueError) as info:
        checkpointer.restore(1, like)
    assert str(info.value) == (
        f"checkpoint {step_dir} has no {MANIFEST}, so its files cannot be verified; delete it "
        "to resume from an earlier checkpoint, or set train.allow_unverified_checkpoint=True to "
        "restore it anyway"
    )
    allowed = Checkpointer(str(tmp_path), async_save=False, allow_unverified=True)
    state, _ = allowed.restore(1, like)
    np.testing.assert_array_equal(state["params"]["w"], np.ones((4, 3)))
    (step_dir / "state" / "_METADATA").unlink()  # unverified, a damage orbax cannot read
    with pytest.raises(ValueError, match=f"checkpoint {step_dir} has no readable state metadata"):
        allowed.restore(1, like)


def adam_state(nu_w=1.0):
    """Parameters and Adam's state, with `nu_w` at one entry of the second moment."""
    params = {"w": np.ones((4, 3), np.float32)}
    opt_state = optax.adam(1e-3).init(params)
    nu = np.ones((4, 3), np.float32)
    nu[2, 1] = nu_w
    return {"params": params, "opt_state": (opt_state[0]._replace(nu={"w": nu}), opt_state[1])}


def test_first_non_finite_names_the_first_float_leaf_with_nan_or_inf():
    assert checkpoint.first_non_finite(adam_state()) is None
    assert checkpoint.first_non_finite(adam_state(np.inf)) == "['opt_state'][0].nu['w']"
    assert checkpoint.first_non_finite({"count": np.int32(3), "b": np.float32(np.nan)}) == "['b']"


def test_a_non_finite_state_is_not_saved(tmp_path):
    checkpointer = Checkpointer(str(tmp_path), async_save=False)
    checkpointer.save(1, adam_state(), {"pos": 1})
    with pytest.raises(ValueError) as info:
        checkpointer.save(2, adam_state(np.nan), {"pos": 2})
    assert str(info.value).startswith(
        "refusing to save checkpoint 2: ['opt_state'][0].nu['w'] of the train state holds NaN "
        f"or inf (the run diverged); the checkpoints in {tmp_path} are kept: resume from step 1"
    )
    checkpointer.wait()
    assert checkpointer.all_steps() == [1]


def test_a_damaged_optimizer_state_without_manifest_is_refused_even_when_allowed(
    tmp_path, monkeypatch
):
    """The issue's case: the manifest deleted and the stored second moment damaged into a NaN
    (written deterministically, past the save's own check: a flipped byte may or may not make
    one). Restoring it would train on (Adam's nu -> NaN parameters, then a NaN checkpoint)."""
    checkpointer = Checkpointer(str(tmp_path), async_save=False)
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "first_non_finite", lambda tree: None)
        checkpointer.save(1, adam_state(np.nan), {"pos": 1})
    step_dir = tmp_path / "1"
    (step_dir / MANIFEST).unlink()
    with pytest.raises(ValueError, match=f"checkpoint {step_dir} has no {MANIFEST}"):
        checkpointer.restore(1, adam_state())
    allowed = Checkpointer(str(tmp_path), async_save=False, allow_unverified=True)
    with pytest.raises(ValueError) as info:
        allowed.restore(1, adam_state())
    assert str(info.value).startswith(
        f"checkpoint {step_dir}: ['opt_state'][0].nu['w'] holds NaN or inf after restoring"
    )
