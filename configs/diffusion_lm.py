"""RL on a tiny masked-diffusion LM (LLaDA-style) on 1-2-digit addition, from scratch on CPU.

An SFT warm start (LLaDA's masked-token cross-entropy) teaches the answer format, then an RL
algorithm for diffusion LMs trains on the rewards, on the same driver as every recipe
(checkpoints, resume, metrics.jsonl / TensorBoard, validation):

  python -m launchers.train --config=configs/diffusion_lm.py
  python -m launchers.train --config=configs/diffusion_lm.py --config.algorithm.name=rldf

`algorithm.name`: "diffu_grpo" (d1), "rldf", "wd1", "rspo" or "daca" (DACA-GRPO); which
likelihood estimator each pairs with is in `rljax.diffusion.algorithms`. The values are those
of the former `rljax.diffusion.train.DiffusionRLConfig` (its `inner_steps=2` is
`train.epochs=2` over one minibatch; `gen_length` is `rollout.max_new_tokens`), and the SFT
stage is bit-identical to the former driver's (same losses, same held-out accuracy). Measured
numbers (`python -m scripts.compare_diffusion`) are in the README: 1700 SFT steps reach only
0.034 held-out accuracy on today's code, with the former driver too (the 0.138 it once
reported does not reproduce), so RL starts from a weak policy.
"""

from ml_collections import ConfigDict

from rljax.config import default_config


def get_config() -> ConfigDict:
    config = default_config()
    config.run_dir = "runs/diffusion_lm"

    # A 2-layer bidirectional transformer from scratch, MASK appended after the byte vocabulary.
    config.model.update(kind="diffusion", d_model=128, n_layers=2, n_heads=4, n_kv_heads=2)
    config.model.d_ff = 384

    config.task.update(name="addition", min_digits=1, max_digits=2, max_prompt_len=8)
    config.task.eval_size = 1000  # greedy accuracy on the first 1000 test problems

    # LLaDA's SFT: t ~ U(mask_eps, 1); mask_eps 0.2 (LLaDA: 1e-3) caps the 1/t weight at 5.
    # AdamW with weight decay 0.1 (without it the model memorises the train sums), a linear
    # warm-up, then cosine decay to 0 at the last step.
    config.sft.update(steps=1700, batch_size=64, learning_rate=3e-3)
    config.sft.update(warmup_steps=100, weight_decay=0.1, mask_eps=0.2)

    # Completions of 4 tokens, one block of 4 denoised in 4 steps (16 = 4 forward passes).
    config.rollout.update(max_new_tokens=4, n_samples=8, temperature=1.0)
    config.rollout.update(block_size=4, steps_per_block=4, remasking="low_confidence")
    # Block-R1: e.g. (1, 2, 4) measures each prompt's reward at every size and samples its
    # group at the best; () samples at block_size.
    config.rollout.block_sizes = ()

    # Every diffusion preset reads these (rljax.diffusion.algorithms.DiffusionSettings).
    config.algorithm.update(
        name="diffu_grpo",
        clip_eps=0.2,
        beta=0.04,
        p_mask_prompt=0.15,
        rldf_k=2,
        rldf_temperature=1.0,
        rldf_threshold=0.0,
        num_strata=2,
        elbo_samples=1,
        rspo_beta=1.0,
    )

    # 60 steps of 16 prompts x 8 samples; two optimizer steps per rollout (d1's inner steps),
    # each with fresh estimator masks; constant learning rate (no warm-up, no weight decay).
    config.train.update(steps=60, prompts_per_step=16, learning_rate=1e-4, max_grad_norm=1.0)
    config.train.update(warmup_steps=0, weight_decay=0.0, epochs=2, minibatches=1)
    config.train.update(eval_every=10, checkpoint_every=10)
    return config
