"""Dr. GRPO: no std normalisation, constant normaliser = the generation budget; the addition
task of grpo_addition.py.

python -m launchers.train --config=configs/dr_grpo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/dr_grpo_addition"
    config.algorithm = ConfigDict(dict(name="dr_grpo", max_len=5))
    return config
