"""GRPO on multi-digit addition with a tiny byte-level transformer trained from scratch on CPU.

A short SFT warm start teaches the answer format, then GRPO raises held-out accuracy. The
recipe starts from `rljax.config.default_config()` (every key with its default and doc in
`rljax.config.SCHEMA`) and sets what it chooses.

  python -m launchers.train --config=configs/grpo_addition.py
  python -m launchers.train --config=configs/grpo_addition.py --config.train.steps=10
"""

from ml_collections import ConfigDict

from rljax.config import default_config


def get_config() -> ConfigDict:
    config = default_config()
    config.run_dir = "runs/grpo_addition"

    # A 2-layer byte-level model from scratch (model.checkpoint = "").
    config.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)

    # 1-2-digit operands (AdditionTask's own settings): prompts fit in 8 bytes.
    config.task.update(name="addition", min_digits=1, max_digits=2, max_prompt_len=8)
    config.task.eval_size = 512
    config.sft.update(steps=800, batch_size=64, learning_rate=1e-3)
    config.rollout.update(max_new_tokens=5, n_samples=8, temperature=1.0)

    config.algorithm.update(
        name="grpo",
        clip_eps=0.2,
        clip_eps_high=0.2,
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        normalize_std=True,
        aggregation="token-mean",
    )
    config.train.update(steps=300, prompts_per_step=64, learning_rate=1e-4, eval_every=50)
    return config
