"""UEC-RL: 5 samples per prompt; prompts where all 5 fail get 20 more at temperature 1.2, of
which only rare successes/failures (|A| > 1) are kept; samples wait in a batch buffer for a
full batch; high-advantage samples are replayed every 5 steps (EFRame's settings). The
addition task of grpo_addition.py.

python -m launchers.train --config=configs/uec_rl_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/uec_rl_addition"
    config.rollout.n_samples = 5
    config.algorithm = ConfigDict(
        dict(
            name="uec_rl",
            explore_samples=20,
            explore_temperature=1.2,
            keep_threshold=0.05,
            explore_keep_threshold=1.0,
            replay_threshold=1.0,
            replay_capacity=2.0,
            replay_every=5,
            kl_coef=0.01,
            kl_estimator="low_var_kl",
        )
    )
    return config
