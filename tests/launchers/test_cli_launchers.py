"""`rljax train` and `rljax eval` are the launchers (`python -m launchers.train|eval`): the
same flags and the same one-line errors (a full run through the launchers is in
tests/train/test_resume.py and tests/train/test_eval_launcher.py)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rljax(*args):
    return subprocess.run(
        [sys.executable, "-m", "rljax.cli", *args], cwd=ROOT, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["train", "--config=configs/grpo_addition.py", "--config.train.stepz=3"],
            "unknown config key 'stepz'",
        ),
        (["eval", "--config=configs/no_such_recipe.py"], "no_such_recipe.py"),
    ],
)
def test_launcher_subcommands_take_the_launchers_flags_and_errors(args, message):
    done = rljax(*args)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert message in lines[-1] and lines[-1].startswith("error:"), lines


def test_the_console_script_loads_configs_that_import_their_siblings(tmp_path):
    """`.venv/bin/rljax` (no working directory on sys.path, unlike `python -m`) loads
    configs/small_models.py, which imports configs.grpo_smollm2_arith, from the repository
    and from another folder."""
    script = os.path.join(os.path.dirname(sys.executable), "rljax")
    config = os.path.join(ROOT, "configs", "small_models.py")
    for cwd, path in ((ROOT, "configs/small_models.py"), (tmp_path, config)):
        argv = [script, "train", f"--config={path}:smollm2,dapo", "--config.train.stepz=3"]
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 1, done.stderr[-2000:]
        assert last.startswith("error: unknown config key 'stepz'"), last


def test_importing_the_console_script_does_not_import_jax():
    """The launchers restart themselves with glibc tunables before JAX loads."""
    code = "import sys, rljax.cli, rljax.launch.huge_pages; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
