"""The task recipes (configs/grpo_<task>.py): valid, and their pipelines fit every example."""

import importlib

import pytest

from rljax.data import prompt_batches, prompt_dataset, sft_dataset
from rljax.train.builders import build_policy, build_task, validate_config

RECIPES = ["grpo_countdown", "grpo_logic", "grpo_gaussian_mixture"]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_pipelines_hold_their_examples(name):
    config = importlib.import_module(f"configs.{name}").get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    validate_config(config)
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
