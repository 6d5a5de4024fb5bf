"""GRPO with TRL's batch-level reward scaling (`scale_rewards="batch"`): group-centred rewards
divided by the std of the whole batch's rewards; the addition task of grpo_addition.py.

python -m launchers.train --config=configs/batch_std_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/batch_std_addition"
    config.algorithm.std_scope = "batch"
    return config
