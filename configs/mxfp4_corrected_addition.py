"""MXFP4 rollouts with both kinds of correction: a float32 scale per macro block of 128 entries
on top of the MX block scales (less quantization error in the sampler's kernels), and
token-level truncated importance sampling, min(pi_trainer / pi_sampler, 2), on the gradient
(corrects for the gap that remains). The addition task of grpo_addition.py.

python -m launchers.train --config=configs/mxfp4_corrected_addition.py
"""

from ml_collections import ConfigDict

from configs.mxfp4_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/mxfp4_corrected_addition"
    config.rollout.update(weight_correction="macro_block", macro_block=128)
    config.rollout_correction = ConfigDict(dict(name="tis", cap=2.0, level="token"))
    return config
