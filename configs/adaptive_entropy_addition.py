"""GRPO with an adaptive entropy coefficient that steers the batch entropy toward a target
(Skywork-OR1's adaptive entropy control, as we read it); the addition task of grpo_addition.py.

python -m launchers.train --config=configs/adaptive_entropy_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/adaptive_entropy_addition"
    config.algorithm = ConfigDict(
        dict(name="adaptive_entropy", target_entropy=0.1, coef_step=0.002, max_coef=0.02)
    )
    return config
