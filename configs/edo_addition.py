"""ED-GRPO: exploration-driven reward bias (bonus for unlikely correct responses) + GRPO;
the addition task of grpo_addition.py.

python -m launchers.train --config=configs/edo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/edo_addition"
    config.algorithm = ConfigDict(dict(name="edo", coef=0.1, only_correct=True))
    return config
