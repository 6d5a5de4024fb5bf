"""Pass@k training: analytical pass@k advantages (binary rewards); the addition task of
grpo_addition.py.

python -m launchers.train --config=configs/pass_at_k_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/pass_at_k_addition"
    config.algorithm = ConfigDict(dict(name="pass_at_k", k=2, clip_eps=0.2))
    return config
