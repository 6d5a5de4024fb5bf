"""GRPO with LoRA adapters on SmolLM2-135M-Instruct, arithmetic word problems, on CPU.

The recipe of grpo_smollm2_arith.py, training rank-16 adapters on the attention projections
instead of every weight (`rljax.models.lora`): the optimizer holds the adapters' moments only,
the frozen base is also the KL reference, and a checkpoint holds the adapters. LoRA takes a
larger learning rate than full fine-tuning (its B starts at zero).

  python -m launchers.train --config=configs/grpo_smollm2_arith_lora.py
"""

from ml_collections import ConfigDict

from configs.grpo_smollm2_arith import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_smollm2_arith_lora"
    config.lora.update(rank=16, alpha=32.0, targets=("q", "k", "v", "o"))
    config.train.learning_rate = 1e-4
    return config
