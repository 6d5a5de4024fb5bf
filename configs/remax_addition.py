"""ReMax: the reward of the policy's greedy completion as baseline + PPO clip; the addition task
of grpo_addition.py. Each step also decodes every prompt greedily.

python -m launchers.train --config=configs/remax_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/remax_addition"
    config.algorithm = ConfigDict(dict(name="remax", clip_eps=0.2))
    return config
