"""MXFP4 rollouts with QeRL's adaptive quantization noise: Gaussian noise on the sampler's
RMSNorm weights, sigma decaying geometrically from 1e-2 to 1e-4 over 10 stages of the run
(none in the first), to raise the sampler's entropy early in training. The addition task of
grpo_addition.py.

python -m launchers.train --config=configs/mxfp4_aqn_addition.py
"""

from ml_collections import ConfigDict

from configs.mxfp4_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/mxfp4_aqn_addition"
    config.rollout.update(aqn_sigma_start=1e-2, aqn_sigma_end=1e-4, aqn_stages=10)
    return config
