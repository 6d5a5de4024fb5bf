"""Entrocraft with covariance selection: the band of entrocraft_addition.py, but outside it
only the tokens whose share of Cov(log pi, A) moves the entropy back toward the band keep
their advantage (rljax's interpretation of Entrocraft's rule through Cui et al.'s covariance
law). Outside the band the advantage is the authors' raw +-1 reward, so failures of prompts
the policy never solves can be pushed down too; inside it, plain GRPO. The addition task of
grpo_addition.py.

python -m launchers.train --config=configs/entrocraft_cov_addition.py
"""

from ml_collections import ConfigDict

from configs.entrocraft_addition import get_config as _entrocraft


def get_config() -> ConfigDict:
    config = _entrocraft()
    config.run_dir = "runs/entrocraft_cov_addition"
    config.algorithm.selection = "covariance"
    config.algorithm.outside = "reward"
    config.algorithm.signed_reward_threshold = 0.5
    return config
