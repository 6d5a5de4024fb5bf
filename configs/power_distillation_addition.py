"""Power-distribution self-distillation (SFT towards p^4 on reweighted own samples); the
addition task of grpo_addition.py. It uses no reward: it sharpens the policy's own distribution.

python -m launchers.train --config=configs/power_distillation_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/power_distillation_addition"
    config.algorithm = ConfigDict(dict(name="power_distillation", alpha=4.0, teacher="old"))
    return config
