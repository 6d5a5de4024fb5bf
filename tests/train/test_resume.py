"""End to end through the launcher: a run killed after a checkpoint resumes exactly.

A run of 2N steps and a run of N steps + SIGKILL + resume + N steps must log the same metrics.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--config.model.d_model=32",
    "--config.model.n_layers=1",
    "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1",
    "--config.model.d_ff=64",
    "--config.sft.steps=30",
    "--config.sft.batch_size=16",
    "--config.train.prompts_per_step=4",
    "--config.rollout.n_samples=4",
    "--config.task.eval_size=16",
    "--config.train.steps=4",
    "--config.train.checkpoint_every=2",
    "--config.train.eval_every=2",
    "--config.train.minibatches=2",
]
TIMING = ("time/step_s", "time/tokens_per_s")


def launch(run_dir, *extra, config="configs/grpo_addition.py"):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "launchers.train",
            f"--config={config}",
            f"--config.run_dir={run_dir}",
            *TINY,
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def records(run_dir):
    out = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        out[r["step"]] = {k: v for k, v in r.items() if k not in TIMING}
    return out


# UEC-RL keeps host-side sample buffers (rljax.train.uec) that must survive the crash too: with
# a replay every 2 steps and every kept sample replayed, step 4's replay reads the buffer that
# was restored from the step-2 checkpoint.
UEC = (
    "--config.algorithm.explore_samples=4",
    "--config.algorithm.replay_threshold=0.0",
    "--config.algorithm.replay_every=2",
)
# The host-side samplers together: DARE picks steps 3-4's prompts from the replay of rollouts
# restored from the step-2 checkpoint (rescored by the restored policy), FreshPER replays groups
# from its restored buffer at steps 3-4, and LoPE perturbs all-failed prompts. A longer SFT on
# 1-digit sums makes the rewards mixed, so groups are informative.
SAMPLERS = (
    "--config.prompt_selection.name=dare",
    "--config.prompt_selection.pool_size=8",
    "--config.replay.name=fresh_per",
    "--config.lope.num_perturbed=2",
    "--config.lope.rollouts_per_perturbed=2",
    "--config.task.max_digits=1",
    "--config.sft.steps=300",
    "--config.sft.batch_size=32",
    "--config.sft.learning_rate=3e-3",
)
RECIPES = {
    "grpo": ("configs/grpo_addition.py", ()),
    "uec_rl": ("configs/uec_rl_addition.py", UEC),
    "samplers": ("configs/grpo_addition.py", SAMPLERS),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_killed_run_resumes_with_identical_metrics(tmp_path, recipe):
    config, flags = RECIPES[recipe]
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    done = launch(straight, *flags, config=config)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = launch(crashed, *flags, "--config.train.kill_at_step=2", config=config)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted(os.listdir(crashed / "checkpoints")) == ["2"]
    resumed = launch(crashed, *flags, config=config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a, b = records(straight), records(crashed)
    assert sorted(a) == sorted(b) and max(a) == 4
    for step in (3, 4):  # the steps after the crash, including the held-out evaluation
        assert a[step] == b[step], step
    assert "eval/accuracy" in a[4]
    if recipe == "samplers":  # the restored buffers were used after the crash
        assert a[3]["selection/replay"] == 3 * 4 * 4  # DARE: three steps of 4 x 4 rollouts
        assert a[3]["replay/buffer"] > 0 and "replay/loss" in a[3]
        assert "lope/failed_groups" in a[3]


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--config.train.stepz=3", "stepz"),
        ("--config.train.steps=abc", "steps"),
        ("--config.train.minibatches=3", "not divisible by train.minibatches"),
        ("--config.algorithm.name=ppo2", "algorithm.name='ppo2' is unknown"),
        ("--config.rollout.weight_format=int4", "rollout weight_format='int4' is unknown"),
        ("--config=configs/no_such_recipe.py", "no_such_recipe.py"),
        (
            "--config.model.checkpoint=/no/such/dir",
            "model.checkpoint='/no/such/dir' is neither a directory",
        ),
    ],
)
def test_bad_config_gives_a_one_line_error_naming_the_key(tmp_path, flag, message):
    result = launch(tmp_path / "bad", flag)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
