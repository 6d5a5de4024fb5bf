"""Entrocraft: GRPO advantages filtered so the batch entropy follows a linearly annealed band
(positive samples only above the band, negative only below); the addition task of
grpo_addition.py. The band starts near the warm-started policy's entropy (about 0.6
nats/token) and anneals to a slightly lower one, the schedule the paper found best.

On this task the paper's rule does not hold the band: the negative-only branch lowers the
entropy too (README, "Entropy control, measured"); entrocraft_cov_addition.py does hold it.

python -m launchers.train --config=configs/entrocraft_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/entrocraft_addition"
    config.algorithm = ConfigDict(
        dict(
            name="entrocraft",
            schedule="linear",
            lower=(0.55, 0.45),
            upper=(0.65, 0.55),
            outside="estimator",
        )
    )
    return config
