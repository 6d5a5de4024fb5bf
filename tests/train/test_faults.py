"""Fault injection (rljax.train.faults): what the crash-safety tests set is read exactly."""

import numpy as np
import pytest

from rljax.train.faults import NAN_ENV, maybe_poison, poisoned_steps
from rljax.train.host_batch import HostBatch


def host_batch():
    rows = {
        "prompt_tokens": np.ones((4, 2), np.int32),
        "prompt_mask": np.ones((4, 2), bool),
        "completion_tokens": np.ones((4, 3), np.int32),
        "completion_mask": np.ones((4, 3), bool),
        "rollout_logprobs": np.zeros((4, 3), np.float32),
        "rewards": np.array([1.0, 0.0, 1.0, 0.5], np.float32),
        "prompt_id": np.array([0, 0, 1, 1]),
    }
    return HostBatch(rows, group_size=2)


def test_named_steps_get_a_nan_reward_in_a_copy(monkeypatch):
    monkeypatch.setenv(NAN_ENV, "3, 7")
    assert poisoned_steps() == {3, 7}
    batch = host_batch()
    assert maybe_poison(2, batch) is batch
    poisoned = maybe_poison(7, batch)
    assert np.isnan(poisoned.rows["rewards"][0])
    np.testing.assert_array_equal(poisoned.rows["rewards"][1:], [0.0, 1.0, 0.5])
    assert batch.rows["rewards"][0] == 1.0  # the collector's batch is untouched
    assert poisoned.group_size == 2


def test_unset_poisons_nothing_and_a_bad_spec_is_named(monkeypatch):
    monkeypatch.delenv(NAN_ENV, raising=False)
    assert poisoned_steps() == frozenset()
    monkeypatch.setenv(NAN_ENV, "3,x")
    with pytest.raises(ValueError, match="RLJAX_NAN_AT='3,x' must be comma-separated"):
        poisoned_steps()
