"""Presets that control the policy's entropy: Entrocraft, its entropic baseline, Clip-Cov,
KL-Cov, UEC-RL and the adaptive entropy coefficient.

Presets that take `ppo: PPOSettings` (clip ranges, KL loss, entropy bonus, aggregation) or
`regularizers: Regularizers` (aggregation, KL loss, entropy bonus) have each field as an
`algorithm.*` config key, beside their own parameters (`rljax.train.builders.preset_settings`).
"""

from rljax.advantages.group import group_advantages
from rljax.algorithms.base import (
    Algorithm,
    PPOSettings,
    Regularizers,
    ppo_preset,
    regularized_preset,
)
from rljax.core.objective import sum_objectives
from rljax.core.transform import chain
from rljax.entropy.adaptive_coef import adaptive_entropy_bonus, adaptive_entropy_coef
from rljax.entropy.covariance import clip_cov as clip_cov_objective
from rljax.entropy.covariance import covariance_noise
from rljax.entropy.covariance import kl_cov as kl_cov_objective
from rljax.entropy.entrocraft import (
    entrocraft_advantages,
    entropic_advantages,
    entropy_band,
    raw_reward_advantages,
    signed_rewards,
)
from rljax.entropy.uec import UECSettings, host_advantages


def entrocraft(
    group_size: int,
    total_steps: int,
    schedule: str = "linear",
    lower: tuple[float, float] = (0.6, 0.4),
    upper: tuple[float, float] = (0.7, 0.5),
    outside: str = "estimator",
    selection: str = "sign",
    signed_reward_threshold: float | None = None,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """Entrocraft (arXiv 2604.26326): GRPO whose advantages are filtered to keep the batch
    entropy inside a scheduled band (positives only above it, negatives only below).

    Args:
      group_size: samples per prompt.
      total_steps: the schedule's length (the run's `train.steps`).
      schedule: "constant", "linear" or "cosine" band schedule.
      lower: the band's lower edge at the start and the end (the paper's run: 0.6 -> 0.4).
      upper: the band's upper edge at the start and the end (0.7 -> 0.5).
      outside: what the filtered branches keep: "estimator" (the GRPO advantages' positive
        or negative part) or "reward" (the raw reward's, as the authors' code with ±1 rewards).
      selection: "sign" (the paper's positives-above / negatives-below rule) or "covariance"
        (keep the tokens whose contribution to Cov(log pi, A) moves the entropy back to the
        band; see `rljax.entropy.entrocraft.entrocraft_advantages`).
      signed_reward_threshold: when set, rewards become +1 at or above it and -1 below
        before the estimator, the authors' ±1 reward (GRPO inside the band is unchanged by
        this; the filtered branches of "reward" then push every failure down).
    """
    band = entropy_band(schedule, tuple(lower), tuple(upper), total_steps)
    advantages = entrocraft_advantages(group_advantages(group_size), band, outside, selection)
    if signed_reward_threshold is not None:
        advantages = chain(signed_rewards(signed_reward_threshold), advantages)
    return ppo_preset(advantages, ppo)


def entropic(
    group_size: int,
    target_entropy: float,
    proportional_gain: float = 1.0,
    integral_gain: float = 0.01,
    base: str = "grpo",
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """Entrocraft's entropic baseline: positive advantages weighted by 1 + alpha and negative
    ones by 1 - alpha, alpha a PI controller of (batch entropy - target).

    Args:
      group_size: samples per prompt.
      target_entropy: the entropy the controller holds.
      proportional_gain: alpha's gain on the current error (authors: 1).
      integral_gain: the accumulated error's gain (authors: 0.01).
      base: "grpo" (group advantages) or "reward" (raw rewards, the authors' ±1 form).
    """
    if base not in ("grpo", "reward"):
        raise ValueError(f"base={base!r} must be 'grpo' or 'reward'")
    inner = group_advantages(group_size) if base == "grpo" else raw_reward_advantages()
    advantages = entropic_advantages(inner, target_entropy, proportional_gain, integral_gain)
    return ppo_preset(advantages, ppo)


def clip_cov(
    group_size: int,
    clip_ratio: float = 2e-4,
    cov_lower: float = 1.0,
    cov_upper: float = 5.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """Clip-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617): GRPO advantages, PPO clip, and a random few high-covariance
    tokens detached from the gradient (`regularizers`: the aggregation, KL loss and entropy
    bonus)."""
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    return regularized_preset(
        chain(group_advantages(group_size), covariance_noise()),
        lambda agg, ml: clip_cov_objective(
            clip_eps, eps_high, clip_ratio, cov_lower, cov_upper, agg, ml
        ),
        regularizers,
    )


def kl_cov(
    group_size: int,
    kl_cov_coef: float = 1.0,
    k_ratio: float = 2e-3,
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """KL-Cov (arXiv 2505.22617): GRPO advantages, no ratio clipping, and a |log ratio|
    penalty on the top `k_ratio` tokens by covariance (the authors' k_percent 0.2 = 2e-3;
    `regularizers`: the aggregation, KL loss and entropy bonus)."""
    return regularized_preset(
        chain(group_advantages(group_size)),
        lambda agg, ml: kl_cov_objective(kl_cov_coef, k_ratio, agg, ml),
        regularizers,
    )


def uec_rl(
    group_size: int,
    explore_samples: int = 20,
    explore_temperature: float = 1.2,
    hard_reward_threshold: float = 0.01,
    keep_threshold: float = 0.05,
    explore_keep_threshold: float = 1.0,
    replay_threshold: float = 1.0,
    replay_capacity: float = 2.0,
    replay_every: int = 5,
    drop_truncated_positive: bool = True,
    ppo: PPOSettings = PPOSettings(kl_coef=0.01, kl_estimator="low_var_kl"),
) -> Algorithm:
    """UEC-RL (arXiv 2604.14646, rules from the authors' EFRame code): GRPO advantages chosen
    on the host, extra high-temperature rollouts for hard prompts, a replay of high-advantage
    samples every few steps; PPO clip with EFRame's low-variance KL loss (1e-2).

    `group_size` is the ordinary samples per prompt (EFRame: 5); the settings are
    `rljax.entropy.uec.UECSettings`'s.
    """
    del group_size  # the driver groups samples itself; the update reads host advantages
    settings = UECSettings(
        explore_samples,
        explore_temperature,
        hard_reward_threshold,
        keep_threshold,
        explore_keep_threshold,
        replay_threshold,
        replay_capacity,
        replay_every,
        drop_truncated_positive,
    )
    algorithm = ppo_preset(host_advantages(), ppo)
    return algorithm._replace(collection=settings)


def adaptive_entropy(
    group_size: int,
    target_entropy: float = 0.2,
    coef_step: float = 0.005,
    max_coef: float = 0.05,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """GRPO + an entropy bonus whose coefficient steers the batch entropy toward
    `target_entropy` (Skywork-OR1's adaptive entropy control, arXiv 2505.22312, as we read
    it; `rljax.entropy.adaptive_coef`): it grows by `coef_step` per step below the target,
    shrinks above it, and applies only at or below it. `ppo.entropy_coef` adds a fixed bonus
    on top (0 by default)."""
    base = ppo_preset(
        chain(
            group_advantages(group_size), adaptive_entropy_coef(target_entropy, coef_step, max_coef)
        ),
        ppo,
    )
    bonus = adaptive_entropy_bonus(ppo.aggregation, ppo.max_len)
    return base._replace(objective=sum_objectives(base.objective, bonus))
