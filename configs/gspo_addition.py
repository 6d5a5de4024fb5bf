"""GSPO: sequence-level importance ratio; the addition task of grpo_addition.py.

python -m launchers.train --config=configs/gspo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/gspo_addition"
    config.algorithm = ConfigDict(dict(name="gspo", eps_low=3e-4, eps_high=4e-4, token_level=False))
    return config
