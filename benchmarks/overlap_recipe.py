"""`make train`'s recipe synchronous and overlapped (`train.overlap=free`, K = 1), run in
the order given (ABBA by default, so drift in the machine's load hits both alike), on one CPU
device as `make train` runs it: wall time, the median step and the held-out accuracy.

  python -m benchmarks.overlap_recipe --root=/tmp/overlap_runs

A run directory that already holds a finished run (its `wall_s.txt`) is reused. Writes
benchmarks/results/overlap_recipe.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.rollout import machine

RESULTS = os.path.join(os.path.dirname(__file__), "results", "overlap_recipe.json")
MODES = {
    "sync": (),
    "free": ("--config.train.overlap=free", "--config.train.max_staleness=1"),
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_string("root", "/tmp/overlap_runs", "where the run directories go")
flags.DEFINE_list("order", ["sync", "free", "free", "sync"], "modes, in the order to run them")


def run(mode: str, run_dir: str) -> float:
    """Trains the recipe in `mode` into `run_dir` (unless done before); its wall seconds."""
    done = os.path.join(run_dir, "wall_s.txt")
    if not os.path.exists(done):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "launchers.train",
                "--config=configs/grpo_addition.py",
                f"--config.run_dir={run_dir}",
                *MODES[mode],
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        with open(done, "w") as f:
            f.write(str(time.perf_counter() - start))
    with open(done) as f:
        return float(f.read())


def summary(run_dir: str, wall_s: float) -> dict:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    rl = [r for r in records if r["step"] > 5]
    return {
        "wall_s": wall_s,
        "median_step_s": statistics.median(r["time/step_s"] for r in rl),
        "eval_accuracy": {r["step"]: r["eval/accuracy"] for r in records if "eval/accuracy" in r},
    }


def main(argv) -> None:
    del argv
    seen: dict[str, int] = {}
    runs = []
    for mode in flags.FLAGS.order:
        if mode not in MODES:
            raise ValueError(f"--order has {mode!r}; the modes are {sorted(MODES)}")
        i = seen[mode] = seen.get(mode, -1) + 1
        run_dir = os.path.join(flags.FLAGS.root, f"{mode}_{i}")
        wall = run(mode, run_dir)
        runs.append({"mode": mode, **summary(run_dir, wall)})
        print(runs[-1]["mode"], round(wall, 1), "s", runs[-1]["eval_accuracy"].get(300))
    steps = {m: [r["median_step_s"] for r in runs if r["mode"] == m] for m in MODES}
    result = {
        "machine": machine(),
        "load_average_at_end": os.getloadavg(),
        "order": flags.FLAGS.order,
        "runs": runs,
        "median_step_ratio_sync_over_free": statistics.median(steps["sync"])
        / statistics.median(steps["free"]),
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=2)
    print("median step, sync / free:", round(result["median_step_ratio_sync_over_free"], 3))


if __name__ == "__main__":
    app.run(main)
