"""run_episode's containment (raised, garbage, timeout, turn limit), tally, and SingleTurn with
a real task reward."""

import math
import threading
import time

import numpy as np
import pytest

from rljax.data.tasks import get_task
from rljax.envs import (
    EPISODE_FAILURE_KINDS,
    EpisodeResult,
    SingleTurn,
    Step,
    run_episode,
    tally,
)
from rljax.train.scoring import TaskReward


class Scripted:
    """An environment whose step returns `outputs` in turn (an exception is raised)."""

    def __init__(self, *outputs):
        self.outputs = list(outputs)

    def reset(self, task):
        return "start"

    def step(self, action):
        out = self.outputs.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out


def _play(*outputs, max_turns=5, time_limit_s=5.0) -> EpisodeResult:
    return run_episode(
        lambda: Scripted(*outputs),
        {},
        lambda obs: "a",
        max_turns=max_turns,
        time_limit_s=time_limit_s,
    )


def test_rewards_sum_and_policy_sees_observations():
    seen = []

    def policy(observations):
        seen.append(observations)
        return f"a{len(observations)}"

    env = Scripted(Step("o1", 0.5, False, {}), ("o2", np.float32(0.25), np.bool_(True), {"k": 1}))
    result = run_episode(lambda: env, {}, policy, max_turns=5, time_limit_s=5)
    assert result == EpisodeResult(
        [("a1", Step("o1", 0.5, False, {})), ("a2", Step("o2", 0.25, True, {"k": 1}))],
        0.75,
        None,
        None,
    )
    assert seen == [["start"], ["start", "o1"]]


@pytest.mark.parametrize(
    "outputs, kind",
    [
        ([ValueError("boom")], "raised"),
        ([SystemExit(3)], "raised"),
        ([Step("o", 1.0, False, {}), KeyError("later")], "raised"),
        (["a string"], "garbage"),
        ([("o", 1.0, True)], "garbage"),
        ([Step("o", math.nan, True, {})], "garbage"),
        ([Step("o", "1.0", True, {})], "garbage"),
        ([Step("o", 10**400, True, {})], "garbage"),
        ([Step("o", 1.0, "yes", {})], "garbage"),
        ([Step(None, 1.0, True, {})], "garbage"),
    ],
)
def test_failures_score_zero_with_their_kind(outputs, kind):
    result = _play(*outputs)
    assert result.failure == kind and result.total_reward == 0.0
    assert result.error and "\n" not in result.error


def test_failing_reset_and_constructor_are_contained():
    def broken():
        raise RuntimeError("no env")

    result = run_episode(broken, {}, lambda obs: "a", max_turns=3, time_limit_s=5)
    assert (result.turns, result.failure) == ([], "raised")
    assert "no env" in result.error

    class BadReset(Scripted):
        def reset(self, task):
            return None

    result = run_episode(BadReset, {}, lambda obs: "a", max_turns=3, time_limit_s=5)
    assert result.failure == "garbage"


@pytest.mark.parametrize("where", ["reset", "step"])
def test_hanging_call_times_out_within_the_limit(where):
    release = threading.Event()

    class Hangs(Scripted):
        def reset(self, task):
            if where == "reset":
                release.wait(5)
            return "start"

        def step(self, action):
            release.wait(5)
            return Step("o", 1.0, True, {})

    try:
        start = time.perf_counter()
        result = run_episode(Hangs, {}, lambda obs: "a", max_turns=3, time_limit_s=0.2)
        elapsed = time.perf_counter() - start
    finally:
        release.set()  # let the abandoned thread finish
    assert result.failure == "timeout" and result.total_reward == 0.0
    assert where in result.error
    assert 0.2 <= elapsed < 1.5


def test_turn_limit_keeps_the_rewards_so_far():
    result = _play(*[Step("o", 0.5, False, {})] * 3, max_turns=3)
    assert (len(result.turns), result.total_reward, result.failure) == (3, 1.5, "turn_limit")
    assert result.error is None


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="max_turns=0"):
        _play(max_turns=0)
    with pytest.raises(ValueError, match="time_limit_s=0"):
        _play(time_limit_s=0)


def test_tally_counts_every_kind():
    results = [
        _play(Step("o", 1.0, True, {})),
        _play(Step("o", 0.5, False, {}), Step("o", 0.0, False, {}), max_turns=2),
        _play(ValueError("x")),
        _play("garbage"),
    ]
    metrics = tally(results)
    assert metrics == {
        "env/episodes": 4.0,
        "env/failed/raised": 1.0,
        "env/failed/timeout": 0.0,
        "env/failed/garbage": 1.0,
        "env/failed/turn_limit": 1.0,
        "env/failed/token_budget": 0.0,
        "env/mean_turns": (1 + 2 + 0 + 0) / 4,
        "env/mean_reward": (1.0 + 0.5) / 4,
    }
    assert set(tally([])) == {"env/episodes", "env/mean_turns", "env/mean_reward"} | {
        f"env/failed/{kind}" for kind in EPISODE_FAILURE_KINDS
    }


def test_single_turn_with_the_addition_reward():
    reward_fn = TaskReward(get_task("addition"))
    task = {"prompt": "12+30=", "answer": "42"}
    for action, reward in [(" 42\n", 1.0), ("41", 0.0)]:
        result = run_episode(
            lambda: SingleTurn(reward_fn),
            task,
            lambda obs, a=action: a,
            max_turns=4,
            time_limit_s=5,
        )
        assert result == EpisodeResult([(action, Step("", reward, True, {}))], reward, None, None)
    assert SingleTurn(reward_fn).reset(task) == ""
