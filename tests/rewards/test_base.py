"""score_completions: valid rewards pass through; failures score 0, are counted and logged."""

import logging
import sys
import time

import numpy as np
import pytest

from rljax.data import AdditionTask
from rljax.rewards import FAILURE_KINDS, score_completions


def _flaky(prompt: str, completion: str, answer: str):
    """Misbehaves according to the completion text."""
    if completion == "raise":
        raise RuntimeError("boom")
    if completion == "none":
        return None
    if completion == "str":
        return "1.0"
    if completion == "nan":
        return float("nan")
    if completion == "inf":
        return -np.inf
    if completion == "bool":
        return True
    return np.float64(len(completion) * 0.5)


def test_valid_rewards_pass_through():
    task = AdditionTask()
    rewards, failures = score_completions(
        lambda p, c, a: task.reward(c, a), ["1+1=", "2+2="], [" 2", "5"], ["2", "4"]
    )
    np.testing.assert_array_equal(rewards, [1.0, 0.0])
    assert rewards.dtype == np.float32
    assert failures == dict.fromkeys(FAILURE_KINDS, 0)


def test_failures_score_zero_counted_by_kind(caplog):
    completions = ["ab", "raise", "none", "str", "nan", "inf", "bool", "raise", "abcd"]
    with caplog.at_level(logging.WARNING, logger="rljax.rewards.base"):
        rewards, failures = score_completions(_flaky, [""] * 9, completions, [""] * 9)
    np.testing.assert_array_equal(rewards, [1.0, 0, 0, 0, 0, 0, 1.0, 0, 2.0])
    assert failures == dict(
        dict.fromkeys(FAILURE_KINDS, 0), exception=2, wrong_type=2, non_finite=2
    )
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3  # one warning per kind, not per sample
    assert any(
        "raised on 2 of 9" in m and "RuntimeError('boom')" in m and "sample 1" in m
        for m in messages
    )
    assert any("non-number on 2 of 9" in m and "NoneType" in m for m in messages)
    assert any("non-finite number on 2 of 9" in m and "nan" in m for m in messages)


def test_sys_exit_is_caught_and_absurd_rewards_are_out_of_range(caplog):
    def hostile(prompt, completion, answer):
        if completion == "exit":
            sys.exit(3)
        return {"huge": 1e39, "int": 10**400, "big": -2e6, "edge": 1e6}.get(completion, 1.0)

    completions = ["exit", "huge", "int", "big", "edge", "ok"]
    with caplog.at_level(logging.WARNING, logger="rljax.rewards.base"):
        rewards, failures = score_completions(hostile, [""] * 6, completions, [""] * 6, max_abs=1e6)
    np.testing.assert_array_equal(rewards, [0, 0, 0, 0, 1e6, 1])
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0), exit=1, out_of_range=3)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "called sys.exit(3)" in messages and "1e+39 > max_abs=1e+06" in messages
    # Without a bound of its own, 1e39 still fails: it overflows the float32 rewards.
    assert score_completions(hostile, [""], ["huge"], [""])[1]["out_of_range"] == 1


def test_soft_timeout_discards_slow_calls():
    def slow(prompt, completion, answer):
        time.sleep(0.05 if completion == "slow" else 0.0)
        return 1.0

    rewards, failures = score_completions(
        slow, ["", ""], ["slow", "fast"], ["", ""], timeout_s=0.02
    )
    np.testing.assert_array_equal(rewards, [0.0, 1.0])
    assert failures["timeout"] == 1


def test_mismatched_lengths_and_bad_timeout_raise():
    with pytest.raises(ValueError, match="2 prompts, 1 completions and 2 answers"):
        score_completions(_flaky, ["", ""], [""], ["", ""])
    with pytest.raises(ValueError, match="timeout_s=0"):
        score_completions(_flaky, [""], [""], [""], timeout_s=0)


def _components(prompt: str, completion: str, answer: str):
    """K = 2 reward components, or a misbehaving value, according to the completion text."""
    return {
        "one": 1.0,  # a plain number where two are expected
        "three": (1.0, 2.0, 3.0),
        "nan": [0.5, float("nan")],
        "str": (1.0, "2"),
        "huge": np.asarray([1.0, 1e39]),
    }.get(completion, (len(completion), np.float32(0.25)))


def test_reward_components_pass_through_and_a_wrong_arity_fails(caplog):
    completions = ["ab", "one", "three", "nan", "str", "huge", "abcd"]
    with caplog.at_level(logging.WARNING, logger="rljax.rewards.base"):
        rewards, failures = score_completions(_components, [""] * 7, completions, [""] * 7, dims=2)
    assert rewards.dtype == np.float32 and rewards.shape == (7, 2)
    np.testing.assert_array_equal(rewards, [[2, 0.25], *[[0, 0]] * 5, [4, 0.25]])
    assert failures == dict(
        dict.fromkeys(FAILURE_KINDS, 0), wrong_type=3, non_finite=1, out_of_range=1
    )
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "expected 2 numbers" in messages and "sample 1" in messages


def test_components_where_one_number_is_expected_are_the_wrong_type():
    rewards, failures = score_completions(_components, [""] * 2, ["ab", "one"], [""] * 2)
    np.testing.assert_array_equal(rewards, [0.0, 1.0])
    assert failures["wrong_type"] == 1
