"""The 80/20 rule: GRPO whose policy-gradient term trains only on the 20% highest-entropy
tokens of each minibatch (arXiv 2506.01939); the addition task of grpo_addition.py.

python -m launchers.train --config=configs/top_entropy_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/top_entropy_addition"
    config.train.top_entropy_fraction = 0.2
    return config
