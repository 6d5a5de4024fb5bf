"""Loss terms: policy-gradient surrogates, KL and entropy."""

from rljax.objectives.entropy import entropy_bonus
from rljax.objectives.kl import KL_ESTIMATORS, kl_loss, kl_penalty, kl_reward_penalty
from rljax.objectives.surrogate import ppo_clip

__all__ = [
    "KL_ESTIMATORS",
    "entropy_bonus",
    "kl_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "ppo_clip",
]
