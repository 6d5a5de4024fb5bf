"""LEAD: correctness and per-prompt target-length efficiency advantages mixed by adaptive
(PSI) weights; the addition task of grpo_addition.py.

Completions are at most max_new_tokens = 5 tokens (an answer of 1-3 digits and EOS), so the
target length is clipped to [1, 5] tokens instead of the paper's [1000, 8000].

python -m launchers.train --config=configs/lead_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/lead_addition"
    config.algorithm = ConfigDict(dict(name="lead", l_min=1.0, l_max=5.0, mode="max_sym"))
    return config
