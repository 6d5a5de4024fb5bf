"""GRPO with a distribution-aware reward: predict Y drawn from a described Gaussian mixture.

With task.reward_mode="crps" each prompt's 8 samples are scored together: their numbers form
an empirical predictive distribution and each sample gets its leave-one-out CRPS credit
(arXiv 2605.20740), so a group is rewarded for spreading like the mixture, not for all
guessing its mean. reward_mode="distance" scores each sample by exp(-|x - y|).

  python -m launchers.train --config=configs/grpo_gaussian_mixture.py
"""

from ml_collections import ConfigDict

from configs.grpo_addition import get_config as _base


def get_config() -> ConfigDict:
    config = _base()
    config.run_dir = "runs/grpo_gaussian_mixture"
    config.task = ConfigDict(
        dict(
            name="gaussian_mixture",
            num_components=2,
            reward_mode="crps",
            max_prompt_len=320,
            max_answer_len=128,
            eval_size=256,
            chat_template=False,
        )
    )
    config.rollout.max_new_tokens = 8
    return config
