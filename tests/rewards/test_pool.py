"""score_completions_parallel: order, failure accounting, a hard timeout and batched calls."""

import os
import time

import numpy as np
import pytest

from rljax.rewards import FAILURE_KINDS
from rljax.rewards.pool import score_completions_parallel


def _reward(prompt: str, completion: str, answer: str):
    """Misbehaves according to the completion text; otherwise len(completion)."""
    if completion == "hang":
        time.sleep(1000)
    if completion == "raise":
        raise RuntimeError("boom")
    if completion == "none":
        return None
    if completion == "nan":
        return float("nan")
    if completion == "exit":
        os._exit(3)
    return float(len(completion))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_order_and_failures(kind):
    completions = ["a", "raise", "abc", "none", "nan", "ab", "abcd", "raise"]
    rewards, failures = score_completions_parallel(
        _reward, [""] * 8, completions, [""] * 8, timeout_s=2.0, max_workers=3, kind=kind
    )
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(rewards, [1, 0, 3, 0, 0, 2, 4, 0])
    assert failures == dict(
        dict.fromkeys(FAILURE_KINDS, 0), exception=2, wrong_type=1, non_finite=1
    )


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_call_that_never_returns_is_cut_off(kind, caplog):
    timeout = 0.3
    completions = ["hang", "a", "ab", "hang", "abc"]
    start = time.monotonic()
    rewards, failures = score_completions_parallel(
        _reward, [""] * 5, completions, [""] * 5, timeout_s=timeout, max_workers=2, kind=kind
    )
    elapsed = time.monotonic() - start
    np.testing.assert_array_equal(rewards, [0, 1, 2, 0, 3])
    assert failures["timeout"] == 2 and sum(failures.values()) == 2
    # The hangs sleep 1000 s: finishing at all shows they were cut off. The bound is loose
    # because forking workers from a large, busy test process can take seconds.
    assert elapsed < 60
    assert any("ran past timeout_s" in r.getMessage() for r in caplog.records)


def test_dead_worker_process_is_replaced():
    rewards, failures = score_completions_parallel(
        _reward, [""] * 3, ["ab", "exit", "abc"], [""] * 3, max_workers=1, kind="process"
    )
    np.testing.assert_array_equal(rewards, [2, 0, 3])
    assert failures["exit"] == 1


def _batch_reward(prompts, completions, answers):
    if "raise" in completions:
        raise ValueError("bad batch")
    if "short" in completions:
        return [1.0]
    return [len(c) if c != "none" else None for c in completions]


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_batched(kind):
    completions = ["a", "none", "abc", "ab", "raise", "x", "short", "abcd"]
    rewards, failures = score_completions_parallel(
        _batch_reward,
        [""] * 8,
        completions,
        [""] * 8,
        kind=kind,
        batched=True,
        batch_size=2,
        max_workers=2,
    )
    # chunks: [a, none] [abc, ab] [raise, x] -> all 0, [short, abcd] -> wrong length, all 0
    np.testing.assert_array_equal(rewards, [1, 0, 3, 2, 0, 0, 0, 0])
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0), exception=2, wrong_type=3)


def test_batched_one_call_and_timeout():
    def slow_batch(prompts, completions, answers):
        time.sleep(0.6 if "slow" in completions else 0.0)
        return [1.0] * len(completions)

    rewards, failures = score_completions_parallel(
        slow_batch, [""] * 3, ["a", "b", "c"], [""] * 3, timeout_s=0.3, batched=True
    )
    np.testing.assert_array_equal(rewards, [1, 1, 1])
    rewards, failures = score_completions_parallel(
        slow_batch, [""] * 3, ["a", "slow", "c"], [""] * 3, timeout_s=0.3, batched=True
    )
    np.testing.assert_array_equal(rewards, [0, 0, 0])
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0), timeout=3)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="2 prompts, 1 completions"):
        score_completions_parallel(_reward, ["", ""], [""], ["", ""])
    with pytest.raises(ValueError, match="kind='gpu'"):
        score_completions_parallel(_reward, [""], [""], [""], kind="gpu")
    with pytest.raises(ValueError, match="workers=0 must be >= 1"):
        score_completions_parallel(_reward, [""], [""], [""], max_workers=0)
    with pytest.raises(ValueError, match="timeout_s=-1"):
        score_completions_parallel(_reward, [""], [""], [""], timeout_s=-1)


def test_empty_batch():
    rewards, failures = score_completions_parallel(_reward, [], [], [])
    assert rewards.shape == (0,) and sum(failures.values()) == 0


def _two_components(prompt: str, completion: str, answer: str):
    """K = 2 reward components; an exit or a wrong arity according to the completion text."""
    if completion == "exit":
        os._exit(3)
    return (float(len(completion)), 1.0) if completion != "one" else 1.0


def test_reward_components_on_a_process_pool():
    rewards, failures = score_completions_parallel(
        _two_components, [""] * 4, ["ab", "exit", "one", "a"], [""] * 4, kind="process", dims=2
    )
    np.testing.assert_array_equal(rewards, [[2, 1], [0, 0], [0, 0], [1, 1]])
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0), exit=1, wrong_type=1)
