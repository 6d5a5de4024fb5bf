"""What `env.isolation="process"` costs: episodes played in the trainer's threads against the
same episodes in a child process each.

Plays `--episodes` GuessNumber games (bisecting expert, about 4 turns each) on a thread pool of
`--workers`, as a rollout steps them, once per isolation, alternating, `--repeats` times; the
process runs pay for one process start per episode and a pipe round trip per call. The
forkserver is warmed first (a run pays that once).

  python -m benchmarks.env_isolation

Writes benchmarks/results/env_isolation.json and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import time

import numpy as np

from benchmarks.rollout import machine
from rljax.envs import run_episode
from rljax.envs.guess_number import GuessNumberTask
from rljax.envs.process_env import process_factory

ISOLATIONS = ("thread", "process")


def play(task: GuessNumberTask, isolation: str, episodes: int, workers: int) -> float:
    """Seconds to play `episodes` games on `workers` threads."""
    make_env = task.make_env if isolation == "thread" else process_factory(task.make_env, 60.0)

    def one(index: int) -> float:
        answer = task.example(index, "train")["answer"]
        policy = task.expert_policy(np.random.default_rng(index))
        result = run_episode(
            make_env, task.env_task(answer), policy, max_turns=task.max_turns, time_limit_s=60.0
        )
        assert result.failure is None, result
        return result.total_reward

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(episodes)))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "env_isolation.json")
    )
    args = p.parse_args(argv)
    task = GuessNumberTask(expert="bisect")
    play(task, "process", 2, 1)  # warms the forkserver
    times = {isolation: [] for isolation in ISOLATIONS}
    for _ in range(args.repeats):
        for isolation in ISOLATIONS:
            times[isolation].append(play(task, isolation, args.episodes, args.workers))
    median = {k: statistics.median(v) for k, v in times.items()}
    report = dict(
        benchmark="env_isolation",
        args=vars(args),
        times_s=times,
        median_s=median,
        process_ms_per_episode=1e3 * (median["process"] - median["thread"]) / args.episodes,
        load=os.getloadavg(),
        machine=machine(),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"{args.episodes} GuessNumber episodes on {args.workers} threads")
    print("| isolation | median s |\n|---|---|")
    for isolation, s in median.items():
        print(f"| {isolation} | {s:.3f} |")
    print(f"process isolation adds {report['process_ms_per_episode']:.1f} ms per episode")
    return report


if __name__ == "__main__":
    main()
