"""GMPO: the geometric mean of log-space-clipped token ratios as each sequence's ratio; the
addition task of grpo_addition.py.

python -m launchers.train --config=configs/gmpo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/gmpo_addition"
    config.algorithm = ConfigDict(dict(name="gmpo", eps_low=0.4, eps_high=0.4))
    return config
