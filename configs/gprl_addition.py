"""GPRL on the addition task's three reward components (correct, digits, length): per-component
group-relative advantages, weighted, with the drift monitor that down-weights a component
taking over the reward gain. Accuracy and the logs still count the exact-sum reward.

python -m launchers.train --config=configs/gprl_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/gprl_addition"
    config.algorithm = ConfigDict(
        dict(
            name="gprl",
            reward_components=True,
            num_dimensions=3,
            weights=(1.0, 0.5, 0.5),
            drift_window=8,
            drift_threshold=0.6,
        )
    )
    return config
