"""DPPO (Binary-TV): a trust region on the sampled token's probability change instead of
PPO's ratio clip; the addition task of grpo_addition.py. `divergence="kl"` bounds the binary
KL instead.

python -m launchers.train --config=configs/dppo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/dppo_addition"
    config.algorithm = ConfigDict(
        dict(name="dppo", divergence="tv", delta_low=0.2, delta_high=0.2, ratio_cap=20.0)
    )
    return config
