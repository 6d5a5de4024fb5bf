"""A diffusion policy on the one driver: greedy evaluation, and every diffusion algorithm
trained by `rljax.train.train` (validation, SFT, collector, steps, metrics, checkpoints)."""

import json
import os

import numpy as np
import pytest

from rljax.data import AdditionTask
from rljax.diffusion import DIFFUSION_ALGORITHMS
from rljax.diffusion.engine import diffusion_greedy_eval
from rljax.train import train
from rljax.train.prompts import Prompts


def test_greedy_eval_is_an_accuracy(run):
    prompts = Prompts.from_config(run.config, run.tokenizer)
    out = diffusion_greedy_eval(
        run.graphdef, run.params, AdditionTask(max_digits=2), prompts, run.config
    )
    acc, size = out["eval/accuracy"], run.config.task.eval_size
    assert 0.0 <= acc <= 1.0 and acc * size == int(acc * size)
    assert out["eval/reward"] == acc  # addition's rewards are 0 or 1


@pytest.mark.parametrize("name", sorted(DIFFUSION_ALGORITHMS))
def test_each_algorithm_trains_a_step_with_finite_loss(
    tmp_path, tiny_config, alternating_task, name
):
    config = tiny_config(name=name)
    config.task.name = alternating_task
    config.train.update(steps=1, eval_every=1, checkpoint_every=1)
    config.sft.update(steps=2, batch_size=8, warmup_steps=1)  # a few SFT steps
    config.run_dir = str(tmp_path)
    records = train(config)
    step = [r for r in records if r["step"] == 1][0]
    assert np.isfinite(step["loss"]) and step["grad_norm"] > 0 and step["guard/skipped"] == 0
    assert step["reward/mean"] == 0.5  # the alternating task: every group is informative
    assert "eval/accuracy" in step and any(r["step"] < 0 and "sft/loss" in r for r in records)
    assert step["time/rollout_s"] > 0 and step["time/reward_s"] > 0  # the phases are timed
    # The same writers and checkpointer as every run.
    logged = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in logged] == [r["step"] for r in records]
    assert os.path.isdir(tmp_path / "checkpoints" / "1")
