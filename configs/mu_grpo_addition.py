"""Mu-GRPO: relaxed asymmetric clip and the negative-advantage veto, two PPO epochs of two
minibatches per rollout batch (stale-policy updates); the addition task of grpo_addition.py.

python -m launchers.train --config=configs/mu_grpo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/mu_grpo_addition"
    config.algorithm = ConfigDict(dict(name="mu_grpo", eps_low=0.2, eps_high=0.28))
    config.train.epochs = 2
    return config
