"""DAPO: dynamic sampling with batch refill, soft overlong punishment, clip-higher PPO,
token-mean (set algorithm.eos_id to also filter truncated samples); the addition task of
grpo_addition.py.

python -m launchers.train --config=configs/dapo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/dapo_addition"
    config.algorithm = ConfigDict(
        dict(name="dapo", cache_len=2, max_len=5, clip_eps_low=0.2, clip_eps_high=0.28)
    )
    # Dynamic sampling: draw up to 3 more prompt batches per step to replace all-equal groups.
    config.rollout.max_refill_rounds = 3
    return config
