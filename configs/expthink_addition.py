"""ExpThink: three-tier rewards against the shortest correct answer per prompt and the
difficulty-adaptive advantage; the addition task of grpo_addition.py.

python -m launchers.train --config=configs/expthink_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/expthink_addition"
    config.algorithm = ConfigDict(dict(name="expthink", capacity=1 << 16, discount=0.5))
    return config
