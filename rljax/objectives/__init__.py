"""Loss terms: policy-gradient surrogates, KL and entropy."""

from rljax.objectives.cispo import cispo
from rljax.objectives.entropy import entropy_bonus
from rljax.objectives.gpg import gpg, valid_group_scale
from rljax.objectives.gspo import gspo, gspo_token, sequence_log_ratio
from rljax.objectives.kl import KL_ESTIMATORS, kl_loss, kl_penalty, kl_reward_penalty
from rljax.objectives.surrogate import ppo_clip

__all__ = [
    "cispo",
    "gpg",
    "gspo",
    "gspo_token",
    "sequence_log_ratio",
    "valid_group_scale",
    "KL_ESTIMATORS",
    "entropy_bonus",
    "kl_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "ppo_clip",
]
