"""DGPO: GRPO advantage redistributed over tokens by entropy-gated Hellinger deviation;
the addition task of grpo_addition.py.

python -m launchers.train --config=configs/dgpo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/dgpo_addition"
    config.algorithm = ConfigDict(dict(name="dgpo", temperature=1.0))
    return config
