"""PPO with a learned critic (GAE); the addition task of grpo_addition.py.

The critic is a value head on the policy's hidden states; `--config.critic.separate=True` gives
it its own copy of the network instead.

python -m launchers.train --config=configs/ppo_addition.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/ppo_addition"
    config.algorithm = ConfigDict(
        dict(name="ppo", gamma=1.0, lam=0.95, clip_eps=0.2, value_coef=0.5, value_clip=0.2)
    )
    config.critic = ConfigDict(dict(separate=False))
    return config
