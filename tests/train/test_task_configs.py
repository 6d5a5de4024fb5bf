"""The task recipes (configs/grpo_<task>.py): valid, and their pipelines fit every example."""

import importlib
import json

import numpy as np
import pytest

from rljax.config import validate_config
from rljax.data import prompt_batches, prompt_dataset, sft_dataset
from rljax.train.builders import build_policy, build_task
from rljax.train.loop import train

RECIPES = ["grpo_countdown", "grpo_logic", "grpo_gaussian_mixture"]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_pipelines_hold_their_examples(name):
    config = importlib.import_module(f"configs.{name}").get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config = validate_config(config)
    tokenizer = build_policy(config)[0]
    task = build_task(config)
    t = config.task
    for split, seed in (("train", 0), ("test", None)):
        prompts = prompt_dataset(
            task,
            split,
            tokenizer,
            t.max_prompt_len,
            seed,
            max_answer_len=t.get("max_answer_len", 32),
            num_examples=64,
            shard_index=0,
            shard_count=1,
        )
        batch = next(prompt_batches(prompts, 64, num_epochs=1))  # reading raises if overlong
        assert batch["prompt_mask"].any(axis=1).all()
    sft = sft_dataset(
        task,
        "train",
        tokenizer,
        t.max_prompt_len,
        config.rollout.max_new_tokens,
        seed=0,
        num_examples=64,
        shard_index=0,
        shard_count=1,
    )
    next(prompt_batches(sft, 64, num_epochs=1))


def test_ppo_mbpp_trains_on_sandboxed_token_level_code_rewards(tmp_path):
    rows = [
        {"text": f"Return {k} plus x.", "test_list": [f"assert f(1) == {k + 1}"], "code": ""}
        for k in range(8)
    ]
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = importlib.import_module("configs.ppo_mbpp").get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.task.update(train_path=str(path), test_path=str(path), max_prompt_len=80, eval_size=2)
    # The static sampler's draws: under the engine's keys one of the 16 random 8-byte
    # completions happens to parse as Python and earns the syntax/style/security 0.3.
    config.rollout.update(n_samples=2, max_new_tokens=8, engine="static")
    config.train.update(steps=2, prompts_per_step=8, eval_every=2, checkpoint_every=2)
    config.sft.steps = 0
    config.run_dir = str(tmp_path / "run")
    records = train(config)
    last = records[-1]
    assert last["step"] == 2 and np.isfinite(last["loss"]) and "gae/returns_mean" in last
    # Random bytes are not Python: every completion fails to parse, so it earns 0 and its
    # tokens on the failing line share the penalty; the returns are below 0, not exactly 0.
    assert last["reward/mean"] == 0.0 and last["gae/returns_mean"] < 0.0
