"""End to end through the launcher: a run killed at any point resumes exactly.

A run of 2N steps and a run SIGKILLed (rljax.train.faults) during a rollout, an update, an
asynchronous checkpoint write or after a checkpoint, then resumed, must log the same metrics,
each step once.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from launching import ROOT, TINY_MODEL, launcher_env

from rljax.train.timing import measures_the_machine

TINY = [
    *TINY_MODEL,
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


def launch(run_dir, *extra, config="configs/grpo_addition.py", kill_at=""):
    env = launcher_env()  # one CPU device
    env["RLJAX_KILL_AT"] = kill_at
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
    """step -> metrics without timings; each step must be logged exactly once."""
    lines = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    out = {r["step"]: {k: v for k, v in r.items() if not measures_the_machine(k)} for r in lines}
    assert len(out) == len(lines), "a step was logged twice"
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
# A masked-diffusion policy on the same driver (model.kind="diffusion"): RLDF replaying states
# drawn in prepare, Block-R1's measured per-prompt block sizes, 2 optimizer steps (minibatches)
# per rollout, after a short masked SFT on 1-digit sums.
DIFFUSION = (
    "--config.algorithm.name=rldf",
    "--config.rollout.block_sizes=(1, 2, 4)",
    "--config.task.max_digits=1",
    "--config.sft.steps=100",
    "--config.sft.batch_size=64",
    "--config.sft.warmup_steps=10",
)
# LoRA adapters (rank 4 on q, v and the MLP's down projection) on the policy as initialised,
# with a KL term to the frozen base. The untrained policy's samples earn no reward, so an
# entropy bonus gives the adapters a gradient (kl_to_ref > 0).
LORA = (
    "--config.lora.rank=4",
    "--config.lora.targets=('q', 'v', 'down')",
    "--config.sft.steps=0",
    "--config.algorithm.kl_coef=0.05",
    "--config.algorithm.entropy_coef=0.01",
)
# Multi-turn episodes (configs/agent_guess_number.py): the kill lands in step 3's rollout,
# while environments step on their worker threads between the engine's decode calls.
AGENT = ("--config.sft.steps=20",)
# Where each recipe's run is killed, in turn, before the last resume. GRPO: in step 4's
# update (after the step-2 checkpoint), then while the step-4 checkpoint is being written in
# the background, which must not be picked up half-written. (Kills in a rollout: "agent" and
# "staleness" below, the latter on the same GRPO recipe.)
RECIPES = {
    "grpo": ("configs/grpo_addition.py", (), ("4:update", "4:checkpoint")),
    "uec_rl": ("configs/uec_rl_addition.py", UEC, ("2:saved",)),
    "agent": ("configs/agent_guess_number.py", AGENT, ("3:rollout",)),
    "diffusion": ("configs/diffusion_lm.py", DIFFUSION, ("4:update",)),
    "samplers": ("configs/grpo_addition.py", SAMPLERS, ("2:saved",)),
    # Bounded staleness: step 3 samples with the parameters of step 1, which only the
    # checkpointed version queue still holds after the crash.
    "staleness": ("configs/grpo_addition.py", ("--config.train.max_staleness=2",), ("3:rollout",)),
    # An overlapped sampler (deterministic mode): the kill lands while the sampler thread has
    # batches queued ahead; the checkpoint's queue, data position and old versions resume it.
    "overlap": (
        "configs/grpo_addition.py",
        ("--config.train.max_staleness=2", "--config.train.overlap=deterministic"),
        ("3:rollout", "4:update"),
    ),
    # LoRA: checkpoints hold the adapters only; the resumed run rebuilds the frozen base (the
    # KL reference) from the model source.
    "lora": ("configs/grpo_addition.py", LORA, ("4:update",)),
    # QLoRA: the rebuilt base is quantized to int8 again, to the same codes.
    "qlora": ("configs/grpo_addition.py", (*LORA, "--config.lora.base_quant=int8"), ("4:update",)),
}


# The default suite kills GRPO in an update and a checkpoint write and an agent in its
# rollout (an overlapped sampler's queue is resumed in tests/train/test_overlap.py); the
# other recipes (one to two minutes each on 2 cores) run with `make test-slow`.
SLOW = ("lora", "qlora", "samplers", "diffusion", "uec_rl", "staleness", "overlap")


@pytest.mark.parametrize(
    "recipe",
    [pytest.param(r, marks=pytest.mark.slow) if r in SLOW else r for r in sorted(RECIPES)],
)
def test_killed_run_resumes_with_identical_metrics(tmp_path, recipe):
    config, flags, kills = RECIPES[recipe]
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    done = launch(straight, *flags, config=config)
    assert done.returncode == 0, done.stderr[-3000:]

    for kill_at in kills:
        killed = launch(crashed, *flags, config=config, kill_at=kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr[-3000:])
        complete = sorted(p for p in os.listdir(crashed / "checkpoints") if p.isdigit())
        assert complete == ["2"] or (kill_at == "4:checkpoint" and complete == ["2", "4"])
    resumed = launch(crashed, *flags, config=config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a, b = records(straight), records(crashed)
    assert max(a) == 4 and "eval/accuracy" in a[4]
    assert a == b  # SFT, every step, and the held-out evaluations
    if recipe == "samplers":  # the restored buffers were used after the crash
        assert a[3]["selection/replay"] == 3 * 4 * 4  # DARE: three steps of 4 x 4 rollouts
        assert a[3]["replay/buffer"] > 0 and "replay/loss" in a[3]
        assert "lope/failed_groups" in a[3]
    if recipe == "diffusion":  # every step sampled at measured block sizes and updated twice
        assert all("block_size/mean" in a[s] and "rldf/scored_tokens" in a[s] for s in a if s > 0)
        assert a[-1]["sft/loss"] < a[-100]["sft/loss"]
    # LoRA: A [in, 4] + B [4, out]: q 32 -> 2 x 16, v 32 -> 16, down 64 -> 32
    if recipe in ("lora", "qlora"):
        assert a[4]["lora/trainable_params"] == 4 * ((32 + 32) + (32 + 16) + (64 + 32))
        assert a[4]["kl_to_ref"] > 0
    if recipe in ("staleness", "overlap"):  # batch i sampled by version max(i - 2, 0)
        assert [a[s]["staleness/versions"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 2.0, 2.0]


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
