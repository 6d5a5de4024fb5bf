"""RewardPool: hostile rewards are counted by kind, the workers persist, ignore SIGINT and die
with the trainer; what cannot be sent to a worker is refused in one line."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from rljax.rewards import FAILURE_KINDS
from rljax.rewards.pool import RewardPool, close_shared_pools, shared_pool
from rljax.train.scoring import TaskReward

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hostile(prompt: str, completion: str, answer: str):
    """Misbehaves as the completion says; otherwise len(completion)."""
    if completion == "raise":
        raise RuntimeError("boom")
    if completion == "sleep":
        time.sleep(float(answer))
    if completion == "sys.exit":
        sys.exit(3)
    if completion == "os._exit":
        os._exit(7)
    if completion == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    values = {"none": None, "str": "1.0", "list": [1.0], "1e39": 1e39, "nan": float("nan")}
    return values.get(completion, float(len(completion)))


@pytest.fixture(name="pool", scope="module")
def pool_fixture():
    with RewardPool("process", 2) as pool:
        yield pool


def _score(pool, completions, timeout_s=5.0, answer="0"):
    n = len(completions)
    return pool.score_completions(
        _hostile, [""] * n, completions, [answer] * n, timeout_s=timeout_s, max_abs=1e6
    )


def test_hostile_rewards_are_counted_by_kind_and_the_pool_survives(pool):
    completions = ["a", "raise", "none", "str", "list", "sys.exit", "os._exit"]
    completions += ["segfault", "1e39", "nan", "sleep", "abc"]
    chunks = [[("", c, "30")] for c in completions]  # "sleep" sleeps 30 s
    start = time.monotonic()
    outcomes = [chunk[0] for chunk in pool.map(_hostile, chunks, timeout_s=1.0)]
    assert time.monotonic() - start < 20  # the 30 s sleep was cut off at 1 s
    kinds = [kind for _, kind, _ in outcomes]
    assert kinds == [
        None,
        "exception",
        "wrong_type",
        "wrong_type",
        None,  # [1.0] is one reward component: the arity check is the tally's (below)
        "exit",
        "exit",
        "exit",
        None,  # 1e39 is a float: the range check is the tally's (below)
        "non_finite",
        "timeout",
        None,
    ]
    details = dict(zip(completions, (detail for _, _, detail in outcomes)))
    assert details["sys.exit"] == "called sys.exit(3)"
    assert details["os._exit"] == "worker process exited with code 7"
    assert details["segfault"] == "worker process killed by SIGSEGV"
    assert "abandoned after 1.0 s" in details["sleep"]

    rewards, failures = _score(pool, completions, timeout_s=1.0, answer="30")
    np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3])
    want = dict(exception=1, wrong_type=3, exit=3, out_of_range=1, non_finite=1, timeout=1)
    assert failures == dict(dict.fromkeys(FAILURE_KINDS, 0), **want)
    # Replaced workers score the next call.
    np.testing.assert_array_equal(_score(pool, ["ab", "abcd"])[0], [2, 4])


def test_workers_persist_across_calls_when_nothing_fails(pool):
    _score(pool, ["a", "b", "c"])
    pids = pool.pids()
    assert len(pids) == 2 and all(pids) and os.getpid() not in pids
    for _ in range(3):
        rewards, failures = _score(pool, ["a", "bb", "ccc", "dddd"])
        np.testing.assert_array_equal(rewards, [1, 2, 3, 4])
        assert sum(failures.values()) == 0
    assert pool.pids() == pids


def test_a_worker_killed_while_idle_is_replaced(pool):
    _score(pool, ["a", "b"])
    victim = pool.pids()[0]
    os.kill(victim, signal.SIGKILL)
    while _alive(victim):
        time.sleep(0.01)
    rewards, failures = _score(pool, ["a", "bb", "ccc"])
    np.testing.assert_array_equal(rewards, [1, 2, 3])
    assert sum(failures.values()) == 0 and victim not in pool.pids()


def test_sigint_does_not_stop_workers_mid_call(pool):
    _score(pool, ["a", "b"])
    pids = pool.pids()
    # What a Ctrl-C sends the whole process group, sent to the workers only (not to pytest).
    timer = threading.Timer(0.3, lambda: [os.kill(pid, signal.SIGINT) for pid in pids])
    timer.start()
    rewards, failures = _score(pool, ["sleep", "sleep"], answer="1.0")
    timer.join()
    assert failures["exit"] == 0 and failures["exception"] == 0
    np.testing.assert_array_equal(rewards, [5, 5])
    assert pool.pids() == pids


def test_thread_pool_reuses_its_threads_and_abandons_a_late_call():
    with RewardPool("thread", 1) as pool:
        rewards, failures = _score(pool, ["sleep", "ab"], timeout_s=0.2, answer="1.0")
        np.testing.assert_array_equal(rewards, [0, 2])
        assert failures["timeout"] == 1
        threads = threading.active_count()
        for _ in range(3):
            np.testing.assert_array_equal(_score(pool, ["a", "sys.exit"])[0], [1, 0])
        assert threading.active_count() <= threads  # no thread per call


class _LocalTask:
    """A task whose reward cannot be pickled (it holds a lambda)."""

    def __init__(self):
        self.check = lambda completion: 1.0

    def reward(self, completion, answer):
        return self.check(completion)


def test_a_reward_that_does_not_pickle_is_refused_naming_it(pool):
    with pytest.raises(ValueError) as info:
        pool.score_completions(TaskReward(_LocalTask()), [""], ["a"], [""])
    message = str(info.value)
    assert message.startswith("the reward of task _LocalTask cannot be sent to reward.kind=")
    assert "reward.kind='thread' or 'inline'" in message and "\n" not in message
    np.testing.assert_array_equal(_score(pool, ["abc"])[0], [3])  # the pool is unharmed


def test_shared_pools_are_reused_until_closed():
    pool = shared_pool("thread", 1)
    assert shared_pool("thread", 1) is pool and shared_pool("thread", 2) is not pool
    close_shared_pools()
    assert pool.closed and shared_pool("thread", 1) is not pool
    close_shared_pools()


TRAINER = textwrap.dedent(
    """
    import os, sys, time
    os.environ["JAX_PLATFORMS"] = "none-such"  # the trainer's accelerator; not the workers'
    from rljax.rewards.pool import RewardPool

    def reward(prompt, completion, answer):
        import jax
        if completion == "hang":
            time.sleep(600)
        return float(os.environ["JAX_PLATFORMS"] == jax.config.jax_platforms == "cpu")

    if __name__ == "__main__":
        pool = RewardPool("process", 2)
        rewards, _ = pool.score_completions(reward, ["", ""], ["a", "b"], ["", ""])
        print(rewards.tolist(), *pool.pids(), flush=True)
        pool.score_completions(reward, ["", ""], ["hang", "b"], ["", ""])  # killed in here
    """
)


def test_workers_run_jax_on_the_cpu_and_die_with_the_trainer(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    trainer = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = trainer.stdout.readline().split("]")
        rewards, pids = line[0] + "]", [int(p) for p in line[1].split()]
        assert rewards == "[1.0, 1.0]"
        time.sleep(0.5)  # a worker is now in the 600 s call
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between open and read
        return False
