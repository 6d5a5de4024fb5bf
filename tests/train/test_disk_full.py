"""A full disk ends a run with one line: what was written, where, and the step to resume from."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import threading

import pytest
from launching import ROOT, TINY_MODEL, launcher_env

from rljax.metrics.writers import MetricsWriter
from rljax.train.disk import DiskFull, DiskFullErrors


def _no_space(filename=None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def test_a_full_disk_under_the_run_becomes_one_line(tmp_path):
    run_dir = str(tmp_path)
    hook = threading.excepthook
    with pytest.raises(DiskFull) as full:
        with DiskFullErrors(run_dir, lambda: 6):
            assert threading.excepthook is not hook  # writer threads' tracebacks are quieted
            raise _no_space(os.path.join(run_dir, "metrics.jsonl"))
    assert threading.excepthook is hook
    assert str(full.value) == (
        f"disk full writing metrics.jsonl under {run_dir}: free space and resume "
        "(the last checkpoint is step 6)"
    )
    assert full.value.errno == errno.ENOSPC
    # tensorstore's ValueError for a checkpoint write names no file.
    with pytest.raises(
        DiskFull,
        match=rf"writing a checkpoint under {run_dir}/checkpoints: .*"
        r"\(no checkpoint yet\)$",
    ):
        with DiskFullErrors(run_dir, lambda: None):
            raise ValueError('RESOURCE_EXHAUSTED: Failed writing "x": No space left on device')
    with pytest.raises(KeyError):  # anything else goes through untouched
        with DiskFullErrors(run_dir, lambda: 6):
            raise KeyError("other")


def test_the_metrics_writer_names_its_file_on_enospc(tmp_path):
    writer = MetricsWriter(str(tmp_path), tensorboard=False)

    class Full:
        def write(self, text):
            raise _no_space()

        def close(self):
            pass

    writer._file = Full()
    with pytest.raises(OSError) as err:
        writer.write(1, {"loss": 1.0})
    assert err.value.errno == errno.ENOSPC and err.value.filename == writer.path


@pytest.mark.slow
def test_a_run_on_a_tiny_tmpfs_stops_with_one_line_and_resumes(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        run_dir = mount / "run"
        env = launcher_env(compile_cache=False)  # the test reads every line of the output

        def launch(steps: int):
            command = [
                sys.executable,
                "-m",
                "launchers.train",
                "--config=configs/grpo_addition.py",
                f"--config.run_dir={run_dir}",
                *TINY_MODEL,
                "--config.sft.steps=0",
                "--config.train.prompts_per_step=4",
                "--config.rollout.n_samples=4",
                "--config.task.eval_size=8",
                "--config.train.checkpoint_every=1",
                "--config.train.eval_every=1000",
                "--config.train.minibatches=2",
                "--config.train.max_checkpoints=100",
                "--config.train.compilation_cache=",
                f"--config.train.steps={steps}",
            ]
            return subprocess.run(
                command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
            )

        full = launch(60)
        assert full.returncode == 1, full.stderr[-3000:]
        shown = re.split(r"[\r\n]", full.stderr)  # tqdm redraws its bar with \r
        lines = [line for line in shown if line.strip() and not line.startswith("grpo:")]
        # Every disk-full traceback is quieted. What is left, in some runs, are tracebacks
        # tensorstore's C++ callbacks print directly (orbax's stopped event loops).
        assert "No space left on device" not in full.stderr
        residue = "Traceback (most recent call last):", "RuntimeError: Event loop is closed"
        odd = [line for line in lines[:-1] if line not in residue and not line.startswith("  ")]
        assert not odd, odd
        lines = lines[-1:]
        match = re.fullmatch(
            rf"error: disk full writing (a checkpoint|\S+) under {run_dir}\S*: free space and "
            r"resume \(the last checkpoint is step (\d+)\)",
            lines[0],
        )
        assert match, lines[0]
        step = int(match[2])
        assert str(step) in os.listdir(run_dir / "checkpoints")
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        resumed = launch(step + 1)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
