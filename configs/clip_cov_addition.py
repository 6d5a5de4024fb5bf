"""Clip-Cov: GRPO advantages and PPO clip, with a random few of the tokens whose
log-prob/advantage covariance lies in (1, 5) detached from the gradient; the addition task
of grpo_addition.py.

A minibatch here holds about 800 completion tokens, so the authors' clip_ratio of 2e-4 (set
for batches of millions of tokens) would detach one token per minibatch; this recipe detaches
2% of them instead.

python -m launchers.train --config=configs/clip_cov_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/clip_cov_addition"
    config.algorithm = ConfigDict(
        dict(name="clip_cov", clip_ratio=0.02, cov_lower=1.0, cov_upper=5.0, clip_eps=0.2)
    )
    return config
