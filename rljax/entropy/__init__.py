"""Entropy control: Entrocraft's scheduled band and entropic baseline, Cui et al.'s
covariance law with Clip-Cov / KL-Cov, UEC-RL's exploration and replay rules, the 80/20
high-entropy token mask and the adaptive entropy coefficient."""

from rljax.entropy.adaptive_coef import adaptive_entropy_bonus, adaptive_entropy_coef
from rljax.entropy.covariance import (
    clip_cov,
    covariance_noise,
    kl_cov,
    logprob_advantage_covariance,
    token_covariance,
)
from rljax.entropy.entrocraft import (
    batch_entropy,
    entrocraft_advantages,
    entropic_advantages,
    entropy_band,
    raw_reward_advantages,
)
from rljax.entropy.high_entropy import high_entropy_mask, high_entropy_tokens
from rljax.entropy.uec import (
    UECSettings,
    hard_prompts,
    host_advantages,
    keep_samples,
    truncated_rows,
)

__all__ = [
    "adaptive_entropy_bonus",
    "adaptive_entropy_coef",
    "batch_entropy",
    "clip_cov",
    "covariance_noise",
    "entropic_advantages",
    "high_entropy_mask",
    "high_entropy_tokens",
    "entropy_band",
    "entrocraft_advantages",
    "kl_cov",
    "logprob_advantage_covariance",
    "raw_reward_advantages",
    "token_covariance",
    "UECSettings",
    "hard_prompts",
    "host_advantages",
    "keep_samples",
    "truncated_rows",
]
