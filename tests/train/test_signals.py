"""SIGINT/SIGTERM: the step in flight finishes, is checkpointed, and the launcher says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from launching import ROOT, TINY_MODEL, launcher_env

from configs.grpo_addition import get_config
from rljax.train import sft
from rljax.train.checkpoint import Checkpointer
from rljax.train.loop import train
from rljax.train.signals import Stopped, StoppedInWarmStart, StopSignals


def test_the_first_signal_is_recorded_and_the_old_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopSignals() as stop:
        assert stop.received is None
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process without the handler
        assert stop.received == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a repeated SIGTERM changes nothing
        assert stop.received == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C after a signal: abort now
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_first_ctrl_c_only_asks_to_stop():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_stopped_says_what_to_do_and_exits_like_the_signal():
    stopped = Stopped(signal.SIGTERM, 7)
    assert str(stopped) == (
        "stopped by SIGTERM at step 7; checkpoint saved: resume with the same command"
    )
    assert stopped.exit_code == 143


def test_a_signal_during_the_warm_start_stops_the_run_at_the_next_sft_log(tmp_path, monkeypatch):
    """SIGTERM at SFT step 3 of 100: the run stops when the loss is next logged (step 11),
    before any RL step, and says that the warm start will start over."""
    make_step = sft.make_sft_step

    def make_signalling_step(*args, **kwargs):
        step_fn, calls = make_step(*args, **kwargs), []

        def signalling_step(*step_args):
            calls.append(None)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return step_fn(*step_args)

        return signalling_step

    monkeypatch.setattr(sft, "make_sft_step", make_signalling_step)
    config = get_config()
    config.run_dir = str(tmp_path / "run")
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.update(steps=100, batch_size=8)
    with pytest.raises(StoppedInWarmStart) as stopped:
        train(config)
    assert str(stopped.value) == (
        "stopped by SIGTERM during the SFT warm start (step 11 of 100); the warm start is not "
        "checkpointed: rerunning the same command starts it over"
    )
    assert stopped.value.exit_code == 143
    assert _logged_steps(config.run_dir) == [-100, -90]  # SFT steps 1 and 11; no RL step


TINY = [
    *TINY_MODEL,
    "--config.sft.steps=0",
    "--config.train.prompts_per_step=4",
    "--config.rollout.n_samples=4",
    "--config.task.eval_size=8",
    "--config.train.checkpoint_every=1000",
    "--config.train.eval_every=1000",
    "--config.train.minibatches=2",
]


def _command(run_dir, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launchers.train",
        "--config=configs/grpo_addition.py",
        f"--config.run_dir={run_dir}",
        f"--config.train.steps={steps}",
        *TINY,
    ]


def _logged_steps(run_dir) -> list[int]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["step"] for line in f if line.endswith("\n")]


@pytest.mark.slow
def test_sigterm_mid_run_saves_the_step_in_flight_and_resumes_from_it(tmp_path):
    run_dir = tmp_path / "run"
    env = launcher_env()  # one CPU device
    run = subprocess.Popen(
        _command(run_dir, 200),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while max(_logged_steps(run_dir), default=0) < 2:  # RL steps are being taken
            assert run.poll() is None, run.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no RL step logged in 300 s"
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    steps = _logged_steps(run_dir)
    stopped_at = steps[-1]
    assert 2 <= stopped_at < 200
    assert stderr.strip().splitlines()[-1] == (
        f"stopped by SIGTERM at step {stopped_at}; checkpoint saved: resume with the same command"
    )
    checkpoints = Checkpointer(str(run_dir / "checkpoints"))
    try:
        assert checkpoints.all_steps() == [stopped_at]  # only the step in flight's
    finally:
        checkpoints.close()

    resumed = subprocess.run(
        _command(run_dir, stopped_at + 2),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _logged_steps(run_dir) == steps + [stopped_at + 1, stopped_at + 2]
