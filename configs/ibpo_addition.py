"""IBPO: implicit process advantages from each group's prefix tree + PPO clip;
the addition task of grpo_addition.py.

python -m launchers.train --config=configs/ibpo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/ibpo_addition"
    config.algorithm = ConfigDict(dict(name="ibpo", clip_eps=0.2))
    return config
