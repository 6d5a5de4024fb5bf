"""GRPO whose rollouts sample with MXFP4 fake-quantized kernels while the trainer keeps float32
weights, uncorrected: the gradient is computed on samples from a slightly different policy.
The addition task of grpo_addition.py; the run logs the sampler/trainer gap (`mismatch/*`) and
the MXFP4 error of each kind of kernel (`quant/*`) every step.

python -m launchers.train --config=configs/mxfp4_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/mxfp4_addition"
    config.rollout.weight_format = "mxfp4"
    return config
