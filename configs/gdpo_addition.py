"""GDPO on the addition task's three reward components (correct, digits, length): each
normalised in its group, then summed with weights and whitened over the batch's tokens.
Accuracy and the logs still count the exact-sum reward; "reward/<component>" logs each
component's mean.

python -m launchers.train --config=configs/gdpo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/gdpo_addition"
    config.algorithm = ConfigDict(
        dict(name="gdpo", reward_components=True, weights=(1.0, 0.5, 0.5), normalize_std=True)
    )
    return config
