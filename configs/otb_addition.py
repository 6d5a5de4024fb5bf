"""Optimal Token Baseline: logit-gradient-proxy weighted per-position baseline + PPO clip;
the addition task of grpo_addition.py.

python -m launchers.train --config=configs/otb_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/otb_addition"
    config.algorithm = ConfigDict(dict(name="otb", clip_eps=0.2))
    return config
