"""The lockstep helpers on one process (the two-process behaviour is
`tests/parallel/test_multi_process.py::test_host_side_collectors_run_in_lockstep_on_two_processes`,
slow-marked): blocks follow the process order of the global batch, and errors name the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.parallel.mesh import make_mesh
from rljax.train import lockstep
from rljax.train.host_batch import HostBatch


def batch(groups: int, g: int = 2) -> HostBatch:
    b = groups * g
    rows = {
        "prompt_tokens": np.arange(b * 3).reshape(b, 3),
        "prompt_mask": np.ones((b, 3), bool),
        "completion_tokens": np.arange(b * 2).reshape(b, 2),
        "completion_mask": np.ones((b, 2), bool),
        "rollout_logprobs": np.zeros((b, 2), np.float32),
        "rewards": np.arange(b, dtype=np.float32),
        "prompt_id": np.repeat(np.arange(groups), g),
    }
    return HostBatch(rows, g)


def as_process(monkeypatch, index: int, count: int) -> None:
    monkeypatch.setattr(jax, "process_index", lambda: index)
    monkeypatch.setattr(jax, "process_count", lambda: count)


def test_one_process_keeps_everything():
    whole = batch(4)
    assert lockstep.gather_batch(whole) is whole and lockstep.own_batch(whole) is whole
    rows = {"a": np.arange(6)}
    np.testing.assert_array_equal(lockstep.gather_rows(rows)["a"], rows["a"])
    np.testing.assert_array_equal(lockstep.own_rows(rows)["a"], rows["a"])


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_process_keeps_its_block_in_process_order(monkeypatch, index):
    whole = batch(6)  # 6 groups of 2 over 3 processes: 2 groups (4 rows) each
    as_process(monkeypatch, index, 3)
    mine = lockstep.own_batch(whole)
    np.testing.assert_array_equal(mine.rows["rewards"], np.arange(4 * index, 4 * index + 4))
    np.testing.assert_array_equal(mine.rows["prompt_id"], np.repeat([2 * index, 2 * index + 1], 2))
    rows = lockstep.own_rows({"x": np.arange(12) * 10})
    np.testing.assert_array_equal(rows["x"], np.arange(4 * index, 4 * index + 4) * 10)


def test_groups_that_do_not_split_name_the_settings(monkeypatch):
    as_process(monkeypatch, 0, 4)
    with pytest.raises(ValueError, match="6 groups does not split over 4 processes.*replay.groups"):
        lockstep.own_batch(batch(6))
    with pytest.raises(ValueError, match="6 rows does not split over 4 processes"):
        lockstep.own_rows({"x": np.arange(6)})


def test_shared_steps_return_the_whole_result_as_numpy():
    mesh = make_mesh(-1)  # 8 CPU devices: rows split 8 ways

    def logprobs(state, prompt_tokens, prompt_mask, completion_tokens, completion_mask):
        return state * prompt_tokens.sum(axis=1, keepdims=True) + completion_tokens

    prompt = np.ones((8, 3), np.float32)
    completion = np.arange(16, dtype=np.float32).reshape(8, 2)
    out = lockstep.shared_logprobs(jax.jit(logprobs), mesh)(
        2.0, prompt, prompt, completion, completion
    )
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, 6.0 + completion)

    def rollout(state, tokens, mask, attempt):
        return {"tokens": tokens + attempt, "mask": jnp.logical_not(mask)}

    got = lockstep.shared_rollout(rollout, mesh)(None, np.zeros((8, 2), np.int32), prompt > 0, 3)
    assert all(isinstance(v, np.ndarray) for v in got.values())
    np.testing.assert_array_equal(got["tokens"], np.full((8, 2), 3))
    assert not got["mask"].any()
