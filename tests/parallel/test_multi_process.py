"""Two processes with 4 CPU devices each (jax.distributed, gloo collectives) train what one
process with 8 devices does: the multi-host path of the driver, tested on one machine.

Both continue from the same checkpoint (SFT warm start + one RL step, written by one process):
gloo sums in another order than one process does, and over a 100-step SFT at a high learning
rate float32 rounding differences of 1e-7 grow until sampled tokens flip, so the comparison
starts from identical parameters and covers the multi-process restore as well.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from rljax.train.timing import measures_the_machine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# 1-digit sums after a short SFT: rewards are mixed, so the GRPO updates are not zero.
FLAGS = [
    "--config=configs/grpo_addition.py",
    "--config.model.d_model=32",
    "--config.model.n_layers=1",
    "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1",
    "--config.model.d_ff=64",
    "--config.task.max_digits=1",
    "--config.task.eval_size=16",
    "--config.sft.steps=100",
    "--config.sft.batch_size=32",
    "--config.sft.learning_rate=1e-2",
    "--config.train.prompts_per_step=8",
    "--config.rollout.n_samples=4",
    "--config.train.checkpoint_every=1",
    "--config.train.eval_every=3",
    "--config.train.minibatches=2",
    # Multi-process runs sample with the static sampler (the engine schedules one process's
    # rows); one process must too, or the two draw different samples.
    "--config.rollout.engine=static",
]


def start(run_dir, devices, *extra):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    files = [f for f in extra if f.startswith("--config=")]  # another preset than FLAGS[0]
    flags = [*(files or FLAGS[:1]), *FLAGS[1:], *(f for f in extra if f not in files)]
    return subprocess.Popen(
        [sys.executable, "-m", "launchers.train", *flags, f"--config.run_dir={run_dir}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]


def records(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {r["step"]: {k: v for k, v in r.items() if not measures_the_machine(k)} for r in rows}


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~60 s on 2 cores: run with -m slow (the default suite is at its time budget)
def test_two_processes_match_one_process_with_the_same_devices(tmp_path):
    a, b = two_processes(tmp_path)  # only process 0 writes metrics
    assert sorted(a) == sorted(b) and max(a) == 3
    assert a[3]["grad_norm"] > 0 and 0 < a[3]["reward/mean"] < 1  # real updates
    for step in (2, 3):  # after the restore
        assert a[step].keys() == b[step].keys(), step
        for key, value in a[step].items():
            # Different summation order in the collectives: float32 rounding, e.g. the
            # |sampler - trainer| log-prob gaps of ~2e-7 differ by ~3e-8.
            np.testing.assert_allclose(
                b[step][key], value, rtol=1e-5, atol=1e-6, err_msg=f"step {step}: {key}"
            )
    kept = [sorted(os.listdir(tmp_path / name / "checkpoints")) for name in ("single", "multi")]
    assert kept[0] == kept[1] == ["2", "3"]  # train.max_checkpoints=2, written by both


def two_processes(tmp_path, *extra, steps=3):
    """One process with 8 devices and two with 4 each, from the same 1-step checkpoint."""
    finish(start(tmp_path / "start", 8, "--config.train.steps=1", *extra))
    for name in ("single", "multi"):
        shutil.copytree(tmp_path / "start", tmp_path / name)
    single = start(tmp_path / "single", 8, f"--config.train.steps={steps}", *extra)
    address = f"localhost:{free_port()}"
    workers = [
        start(
            tmp_path / "multi",
            4,
            f"--config.train.steps={steps}",
            f"--coordinator_address={address}",
            "--num_processes=2",
            f"--process_id={i}",
            *extra,
        )
        for i in range(2)
    ]
    for proc in (single, *workers):
        finish(proc)
    return records(tmp_path / "single"), records(tmp_path / "multi")


@pytest.mark.slow  # ~60 s on 2 cores
def test_dapo_refill_runs_in_lockstep_on_two_processes(tmp_path):
    """Whether to draw again is decided on both processes' counts: the run finishes (no
    process waits in a rollout the other skipped), and from the same parameters it draws as
    many rounds as one process with the same devices."""
    a, b = two_processes(tmp_path, "--config.rollout.max_refill_rounds=3")
    assert sorted(a) == sorted(b) and max(a) == 3
    assert max(a[s]["refill/rounds"] for s in (2, 3)) >= 1  # refill really drew again
    for key in ("refill/rounds", "refill/informative_frac", "refill/short_groups"):
        np.testing.assert_allclose(b[2][key], a[2][key], rtol=1e-6, err_msg=key)


# Collectors that decide on host data, each keeping its state whole and equal on every process
# (`rljax.train.lockstep`): from the same checkpoint, two processes choose, sample and learn
# what one process with the same devices does.
LOCKSTEP = {
    "heapa": ["--config.prompt_selection.name=heapa", "--config.prompt_selection.pool_size=64"],
    "dare": ["--config.prompt_selection.name=dare", "--config.prompt_selection.pool_size=64"],
    "replay": ["--config.replay.name=fresh_per"],
    "lope": ["--config.lope.num_perturbed=2", "--config.lope.rollouts_per_perturbed=2"],
    "remax": ["--config=configs/remax_addition.py"],
    # The sampler on 2 devices of each process, the trainer on the other 2: the weights move
    # between them every step (`rljax.train.sampler_mesh.moved_to`).
    "sampler_devices": ["--config.mesh.sampler_devices=4"],
    "uec_rl": [
        "--config=configs/uec_rl_addition.py",
        "--config.algorithm.explore_samples=4",
        "--config.algorithm.replay_every=1",
    ],
}
# A metric each case must have logged: the feature really ran.
RAN = {
    "heapa": "selection/cold",
    "dare": "selection/seen_frac",
    "replay": "replay/buffer",
    "lope": "lope/failed_groups",
    "remax": "reward/mean",
    "sampler_devices": "time/reshard_s",
    "uec_rl": "uec/kept_frac",
}


@pytest.mark.slow  # ~60-90 s each on 2 cores
@pytest.mark.parametrize("name", sorted(LOCKSTEP))
def test_host_side_collectors_run_in_lockstep_on_two_processes(tmp_path, name):
    a, b = two_processes(tmp_path, *LOCKSTEP[name])
    assert sorted(a) == sorted(b) and max(a) == 3
    logged = [json.loads(line) for line in open(tmp_path / "multi" / "metrics.jsonl")]
    assert RAN[name] in logged[-1], sorted(logged[-1])
    for step in (2, 3):
        assert a[step].keys() == b[step].keys(), step
        for key, value in a[step].items():
            np.testing.assert_allclose(
                b[step][key], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} step {step}: {key}"
            )
