"""REINFORCE++-baseline (group mean removed, then batch whitening) + PPO clip; the addition
task of grpo_addition.py.

  python -m launchers.train --config=configs/reinforce_pp_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/reinforce_pp_addition"
    config.algorithm = ConfigDict(dict(name="reinforce_pp", clip_eps=0.2))
    return config
