"""GPG: plain policy gradient on group-centred rewards; the addition task of grpo_addition.py.

python -m launchers.train --config=configs/gpg_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/gpg_addition"
    config.algorithm = ConfigDict(dict(name="gpg", valid_group_scaling=True))
    return config
