"""IPO (prime-rl's default RL loss): the policy gradient through the ratio to the sampler,
masked where a token's probability moved by more than 0.1, plus a squared-log-ratio KL term;
the addition task of grpo_addition.py.

python -m launchers.train --config=configs/ipo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/ipo_addition"
    config.algorithm = ConfigDict(dict(name="ipo", threshold=0.1, kl_tau=1e-3))
    return config
