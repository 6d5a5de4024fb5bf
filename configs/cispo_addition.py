"""CISPO: clipped stop-gradient importance weights on REINFORCE; the addition task of
grpo_addition.py.

python -m launchers.train --config=configs/cispo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/cispo_addition"
    config.algorithm = ConfigDict(dict(name="cispo", eps_high=0.2))
    return config
