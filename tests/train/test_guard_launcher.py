"""Through the launcher: a run stopped by its numerical guard prints one line, not tracebacks.

The checkpoint of the last skipped step is still being written when the guard stops the run;
left to interpreter shutdown, orbax's commit thread failed and printed its traceback after the
error (~130 lines); the driver now closes the checkpointer first (`Checkpointer.__exit__`).
"""

import os
import re
import subprocess
import sys

import pytest
from launching import ROOT, TINY_MODEL, launcher_env

# A tiny run whose learning rate x weight decay overflows float32: every update is rolled back.
OVERFLOWING = [
    *TINY_MODEL,
    "--config.sft.steps=0",
    "--config.task.eval_size=8",
    "--config.rollout.n_samples=2",
    "--config.train.prompts_per_step=8",
    "--config.train.steps=4",
    "--config.train.checkpoint_every=1",
    "--config.train.max_consecutive_skips=2",
    "--config.train.warmup_steps=0",
    "--config.train.learning_rate=1e30",
    "--config.train.weight_decay=1e30",
]
# What else a stopped run shows: the progress bar (each redraw starts a line once universal
# newlines turn its carriage return into one; a log line may follow it on that line) and the
# guard's own warning for each skipped step before the last (absl's format, from guard.py).
PROGRESS = re.compile(r"^grpo: +\d+%\|[^|\n]*\|[^\]\n]*\]", re.MULTILINE)
SKIP_WARNING = re.compile(r"^W\d{4} [\d:.]+ +\d+ guard\.py:\d+\] step \d+: update skipped")


@pytest.mark.slow
def test_a_run_stopped_by_the_guard_prints_one_line(tmp_path):
    # One CPU device, and no persistent compilation cache: other test processes evict entries
    # of the shared one, and JAX warns about each entry it then fails to write.
    env = launcher_env(compile_cache=False)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "launchers.train",
            "--config=configs/grpo_addition.py",
            f"--config.run_dir={tmp_path / 'run'}",
            *OVERFLOWING,
            "--config.train.compilation_cache=",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 1
    lines = PROGRESS.sub("", run.stdout + run.stderr).splitlines()
    warnings = [line for line in lines if SKIP_WARNING.match(line)]
    rest = [line for line in lines if line.strip() and line not in warnings]
    assert len(warnings) == 1  # step 1's skip
    assert rest == [
        "error: step 2: update skipped for non-finite values (2 in a row, 2 in all); the update "
        "made update.params['embed'].value non-finite (learning rate too high?); stopping after "
        "train.max_consecutive_skips=2 skipped steps in a row (check the rewards and inputs, "
        "lower train.learning_rate, or resume from an earlier checkpoint)"
    ]
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["1"]  # step 1's, committed
