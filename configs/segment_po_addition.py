"""segment_po (Segment-Aligned Policy Optimization): segment-level importance ratios and
advantages (segments end at a space or newline); the addition task of grpo_addition.py.

python -m launchers.train --config=configs/segment_po_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/segment_po_addition"
    config.algorithm = ConfigDict(
        dict(name="segment_po", delimiter_ids=(32, 10), eps_low=0.2, eps_high=0.2)
    )
    return config
