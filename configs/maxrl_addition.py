"""MaxRL: group advantages normalised by the group's mean reward (the log-likelihood of
success); the addition task of grpo_addition.py.

python -m launchers.train --config=configs/maxrl_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/maxrl_addition"
    config.algorithm = ConfigDict(dict(name="maxrl"))
    return config
