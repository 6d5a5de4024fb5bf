"""Environments in child processes (`env.isolation="process"`): the same episodes as in threads,
a call past the limit kills its process (the work stops, not just the wait), a process that
exits or raises ends only its episode, and every process is gone when its episode ends."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from rljax.envs import Step, run_episode
from rljax.envs.chat import CHAT_FORMATS
from rljax.envs.guess_number import GuessNumberTask
from rljax.envs.process_env import ProcessEnvironment, process_factory
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.episodes import EpisodeSettings, scripted_episode_rows

LIMIT_S = 1.0


class Misbehaving:
    """Its first observation is its process id; step does what the action says: "spin"
    (a busy loop), "exit" (os._exit(7)), "raise", "unpicklable" (a lambda in info), "done"
    (ends the episode); anything else continues. `close` writes its process id to the task's
    "closed_file"."""

    closed_file = None

    def reset(self, task):
        if task.get("raise_in_reset"):
            raise KeyError("no such level")
        self.closed_file = task.get("closed_file")
        return str(os.getpid())

    def close(self):
        if self.closed_file:
            with open(self.closed_file, "w") as f:
                f.write(str(os.getpid()))

    def step(self, action):
        if action == "spin":
            while True:
                pass
        if action == "exit":
            os._exit(7)
        if action == "raise":
            raise RuntimeError("environment bug")
        info = {"f": lambda: 0} if action == "unpicklable" else {}
        return Step("ok", 1.0, action == "done", info)


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether process `pid` has exited (and been reaped) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_spinning_step_is_killed_at_the_limit():
    env = ProcessEnvironment(Misbehaving, LIMIT_S)
    pid = int(env.reset({}))
    assert pid != os.getpid() and env.pid == pid
    assert env.step("go") == Step("ok", 1.0, False, {})
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="killed"):
        env.step("spin")
    assert time.monotonic() - start < LIMIT_S + 2.0
    assert gone(pid)  # the busy loop no longer runs
    with pytest.raises(RuntimeError, match="killed by SIGKILL"):
        env.step("go")


def test_failures_end_only_their_episode_and_every_process_ends():
    pids = []

    def watched(actions, task=None):
        seen = []

        def policy(observations):
            seen.append(int(observations[0]))
            return actions[len(observations) - 1]

        result = run_episode(
            process_factory(Misbehaving, LIMIT_S),
            task or {},
            policy,
            max_turns=len(actions),
            time_limit_s=LIMIT_S,
        )
        pids.append(seen[0])
        return result

    done = watched(["go", "done"])
    assert done.failure is None and done.total_reward == 2.0
    out_of_turns = watched(["go", "go"])
    assert out_of_turns.failure == "turn_limit" and out_of_turns.total_reward == 2.0
    spun = watched(["go", "spin"])
    assert spun.failure == "timeout" and spun.total_reward == 0.0
    exited = watched(["exit"])
    assert exited.failure == "raised" and "exited with code 7" in exited.error
    raised = watched(["raise"])
    assert raised.failure == "raised" and "environment bug" in raised.error
    unpicklable = watched(["unpicklable"])
    assert unpicklable.failure == "raised" and "pickle" in unpicklable.error.lower()
    assert all(gone(pid) for pid in pids)
    failed_reset = run_episode(
        process_factory(Misbehaving, LIMIT_S),
        {"raise_in_reset": True},
        lambda observations: "go",
        max_turns=1,
        time_limit_s=LIMIT_S,
    )
    assert failed_reset.failure == "raised" and "no such level" in failed_reset.error


def test_the_environment_is_closed_in_its_process_when_the_episode_ends(tmp_path):
    closed = tmp_path / "closed"
    result = run_episode(
        process_factory(Misbehaving, LIMIT_S),
        {"closed_file": str(closed)},
        lambda observations: "go",
        max_turns=2,
        time_limit_s=LIMIT_S,
    )
    assert result.failure == "turn_limit"  # ended from outside: closed all the same
    pid = int(closed.read_text())
    assert pid != os.getpid() and gone(pid)


def test_a_factory_that_does_not_pickle_is_refused_up_front():
    with pytest.raises(ValueError, match="env.isolation='process'"):
        process_factory(lambda: Misbehaving(), LIMIT_S)


def test_scripted_episodes_are_the_same_in_processes_and_threads():
    """The SFT warm start's rows of GuessNumber, played in threads and in processes."""
    task = GuessNumberTask(expert="bisect")
    rows = {}
    for isolation in ("thread", "process"):
        settings = EpisodeSettings(CHAT_FORMATS["plain"], 32, isolation=isolation)
        rows[isolation] = scripted_episode_rows(task, ByteTokenizer(), settings, 72, 8, seed=3)
    for key, value in rows["thread"].items():
        np.testing.assert_array_equal(rows["process"][key], value)
