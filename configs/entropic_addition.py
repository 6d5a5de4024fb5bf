"""Entrocraft's entropic baseline: GRPO advantages with positives weighted 1 + alpha and
negatives 1 - alpha, alpha a PI controller holding the batch entropy at a target; the
addition task of grpo_addition.py.

python -m launchers.train --config=configs/entropic_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/entropic_addition"
    config.algorithm = ConfigDict(
        dict(name="entropic", target_entropy=0.5, proportional_gain=1.0, integral_gain=0.01)
    )
    return config
