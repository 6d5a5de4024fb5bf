"""Kernel-smoothing value baseline over prompt embeddings + PPO clip;
the addition task of grpo_addition.py.

python -m launchers.train --config=configs/kernel_baseline_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/kernel_baseline_addition"
    config.algorithm = ConfigDict(dict(name="kernel_baseline", bandwidth=1.0))
    return config
