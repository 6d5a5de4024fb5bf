"""Soak test (slow): 500 steps with a checkpoint every 20, killed again and again at random.

The run is SIGKILLed at random moments (after a random delay) and at random (step, phase)
points of the driver (rljax.train.faults: rollout, update, mid-checkpoint-write, saved), and
resumed each time until it finishes. Against one uninterrupted run of the same config, its logs
must hold every step once with the same metrics, and every step's rollouts (prompt ids,
completions, rewards) once and identical: no data, step or sample lost or repeated.

Both runs also get NaN rewards injected at a few steps (RLJAX_NAN_AT): those updates are
non-finite, and the guard must roll them back alike in both runs, so no checkpoint ever holds
a NaN. And while the killed run is alive, a second run started on its run_dir (with another
learning rate) must be refused by the lock, naming the holder, and change nothing.

  pytest -m slow tests/train/test_soak.py -s   # prints what each kill hit
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from launching import ROOT, TINY_MODEL, launcher_env

from rljax.train.faults import PHASES
from rljax.train.timing import measures_the_machine

STEPS, EVERY, KILLS = 500, 20, 16
POISONED = (7, 133, 260, 261, 499)  # steps whose batch gets a NaN reward (RLJAX_NAN_AT)
FLAGS = [
    *TINY_MODEL,
    "--config.task.max_digits=1",  # with a longer SFT: mixed rewards, so the policy moves
    "--config.sft.steps=300",
    "--config.sft.batch_size=32",
    "--config.sft.learning_rate=3e-3",
    "--config.train.prompts_per_step=4",
    "--config.rollout.n_samples=4",
    "--config.task.eval_size=16",
    f"--config.train.steps={STEPS}",
    f"--config.train.checkpoint_every={EVERY}",
    "--config.train.eval_every=100",
    "--config.train.log_samples=-1",
    "--config.train.learning_rate=1e-3",
]


def start(run_dir, kill_at="", stderr_path=None, extra=()):
    """Launches the run in the background; its stderr goes to run_dir.stderr (a pipe left
    unread would fill up with progress bars and block the run)."""
    env = launcher_env()
    env["RLJAX_KILL_AT"] = kill_at
    env["RLJAX_NAN_AT"] = ",".join(map(str, POISONED))
    command = [sys.executable, "-m", "launchers.train", "--config=configs/grpo_addition.py"]
    with open(stderr_path or f"{run_dir}.stderr", "w") as stderr:
        return subprocess.Popen(
            [*command, f"--config.run_dir={run_dir}", *FLAGS, *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def tail(run_dir):
    return open(f"{run_dir}.stderr").read()[-3000:]


def logged_steps(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    steps = [json.loads(line)["step"] for line in open(path) if line.endswith("}\n")]
    return max(steps, default=0)


def lock_holder(run_dir):
    """The pid written into run_dir's lock file, or None before the run has locked it."""
    try:
        return json.loads(open(os.path.join(run_dir, "rljax.lock")).read())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def intrude(run_dir, holder):
    """Starts a second run (another learning rate) on `run_dir` while `holder` runs there; it
    must stop at once with the lock's one line and touch none of the run's files."""
    config = os.path.join(run_dir, "config.json")
    while lock_holder(run_dir) != holder.pid or not os.path.exists(config):
        assert holder.poll() is None, "the run ended before it locked its run_dir"
        time.sleep(0.05)
    stderr = f"{run_dir}.intruder.stderr"
    intruder = start(run_dir, stderr_path=stderr, extra=["--config.train.learning_rate=5e-3"])
    assert intruder.wait(timeout=120) == 1
    lines = [line for line in open(stderr).read().splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: run_dir {run_dir} is in use by pid {holder.pid}"), lines
    assert json.load(open(config))["train"]["learning_rate"] == 1e-3
    assert holder.poll() is None  # the run goes on


def checkpoints_are_finite(run_dir):
    """Every float tensor of every checkpoint left in run_dir is finite."""
    root = os.path.join(run_dir, "checkpoints")
    steps = [name for name in os.listdir(root) if name.isdigit()]
    assert steps
    for step in steps:
        state = ocp.StandardCheckpointer().restore(os.path.join(root, step, "state"))
        floats = [
            np.asarray(x) for x in jax.tree.leaves(state) if np.issubdtype(x.dtype, np.floating)
        ]
        assert floats and all(np.isfinite(x).all() for x in floats), step


def jsonl(run_dir, name):
    return [json.loads(line) for line in open(os.path.join(run_dir, name))]


@pytest.mark.slow
def test_random_kills_lose_and_repeat_nothing(tmp_path):
    rng = random.Random(0)
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    process = start(straight)
    assert process.wait(timeout=3600) == 0, tail(straight)

    kills = []
    for attempt in range(KILLS + 1):
        done = logged_steps(crashed)
        if attempt == KILLS:  # enough: let it finish
            target, process = None, start(crashed)
        elif attempt % 2:  # a random point of the driver, a few steps ahead
            step, phase = min(done + rng.randint(1, 3 * EVERY), STEPS), rng.choice(PHASES)
            if phase in ("checkpoint", "saved"):  # only checkpoint steps have these points
                step = min(-(-step // EVERY) * EVERY, STEPS)
            target = f"{step}:{phase}"
            process = start(crashed, target)
        else:  # a random moment: start-up takes ~8 s, 500 steps ~10 s on 2 cores
            target = None
            process = start(crashed)
            if attempt == 0:  # a second writer while this one runs: refused, nothing changed
                intrude(str(crashed), process)
            try:
                process.wait(timeout=rng.uniform(4.0, 14.0))
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
        code = process.wait(timeout=3600)
        if code == 0:
            break
        assert code == -signal.SIGKILL, tail(crashed)
        kills.append((target or "random moment", done, logged_steps(crashed)))
        time.sleep(0.1)
    assert code == 0, "the killed run did not finish once left alone"
    print(f"{len(kills)} kills (target, last logged step before, after): {kills}")
    assert len(kills) >= KILLS // 2

    a, b = jsonl(straight, "metrics.jsonl"), jsonl(crashed, "metrics.jsonl")
    assert sum(r.get("reward/std", 0.0) > 0 for r in a) > STEPS // 2  # the updates did move
    assert [r["step"] for r in b] == [r["step"] for r in a]  # each step once, in order
    assert sorted({r["step"] for r in a if r["step"] > 0}) == list(range(1, STEPS + 1))
    strip = lambda r: {k: v for k, v in r.items() if not measures_the_machine(k)}  # noqa: E731
    for x, y in zip(a, b):
        assert strip(x) == strip(y), x["step"]

    skipped = {r["step"] for r in a if r.get("guard/skipped", 0.0) > 0}
    assert skipped == set(POISONED)  # the injected non-finite updates, and only those
    checkpoints_are_finite(straight)
    checkpoints_are_finite(crashed)

    a, b = jsonl(straight, "samples.jsonl"), jsonl(crashed, "samples.jsonl")
    assert len(a) == STEPS * 4 and a == b  # every step's 4 groups: prompts, completions, rewards
    ids = [r["prompt_id"] for r in b]
    assert len(set(ids)) == len(ids)  # 2000 prompts of a larger split: none drawn twice
