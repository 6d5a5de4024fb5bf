"""SAPO: a smooth sigmoid gate on the importance ratio instead of PPO's clip; the addition
task of grpo_addition.py.

python -m launchers.train --config=configs/sapo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/sapo_addition"
    config.algorithm = ConfigDict(dict(name="sapo", tau_pos=1.0, tau_neg=1.05))
    return config
