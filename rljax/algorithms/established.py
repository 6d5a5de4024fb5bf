"""Presets of the established algorithms (what verl, TRL and OpenRLHF offer), a few lines each.

Presets that take `ppo: PPOSettings` (clip ranges, KL loss, entropy bonus, aggregation) or
`regularizers: Regularizers` (aggregation, KL loss, entropy bonus) have each field as an
`algorithm.*` config key, beside their own parameters (`rljax.train.builders.preset_settings`).
"""

from rljax.advantages.gae import gae_advantages
from rljax.advantages.group import group_advantages
from rljax.advantages.optimal_baseline import length_weighted_baseline_advantages
from rljax.advantages.pass_at_k import pass_at_k_group_advantages
from rljax.advantages.reinforce_pp import batch_whitened_advantages
from rljax.advantages.remax import greedy_baseline_advantages
from rljax.advantages.rloo import leave_one_out_advantages
from rljax.algorithms.base import (
    Algorithm,
    PPOSettings,
    Regularizers,
    ppo_preset,
    with_regularizers,
)
from rljax.core.transform import chain
from rljax.filters import dynamic_sampling, overlong_filter, overlong_punishment
from rljax.objectives.cispo import cispo as cispo_objective
from rljax.objectives.gpg import gpg as gpg_objective
from rljax.objectives.gpg import valid_group_scaling as gpg_valid_group_scaling
from rljax.objectives.gspo import gspo as gspo_objective
from rljax.objectives.gspo import gspo_token
from rljax.objectives.surrogate import ppo_clip
from rljax.objectives.value import clipped_value_loss


def grpo(
    group_size: int,
    normalize_std: bool = True,
    std_scope: str = "group",
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """GRPO (Shao et al. 2024, arXiv 2402.03300): group advantages + PPO clip (+ KL, entropy).

    `normalize_std=False` with `PPOSettings(aggregation="seq-mean-token-sum-norm", max_len=...)`
    gives Dr. GRPO (`dr_grpo`); `clip_eps_high > clip_eps` gives DAPO's clip-higher. The KL
    and entropy terms are added only when their coefficient is non-zero. The KL estimator's
    default "k3" is the GRPO paper's unclamped estimator; verl's default KL loss is
    "low_var_kl" (see `PPOSettings`), which a ported verl config sets. "k3" stays the default
    here because this preset implements the paper, and the clamp zeroes the gradient of
    exactly the tokens farthest from the reference (pi/ref below ~0.09).

    Args:
      group_size: samples per prompt.
      normalize_std: divide group-centred rewards by a std.
      std_scope: "group" (the group's std, GRPO) or "batch" (the std of all the batch's
        rewards plus 1e-4: TRL's `scale_rewards="batch"`, `batch_std_advantages`).
      ppo: the clip ranges, KL loss, entropy bonus and loss aggregation (`PPOSettings`).

    Returns:
      An `Algorithm`.
    """
    eps = 1e-4 if std_scope == "batch" else 1e-6
    advantages = group_advantages(group_size, normalize_std, eps=eps, std_scope=std_scope)
    return ppo_preset(advantages, ppo)


def dr_grpo(
    group_size: int,
    max_len: int,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
) -> Algorithm:
    """Dr. GRPO ("Understanding R1-Zero-Like Training: A Critical Perspective", arXiv
    2503.20783): `grpo` with no std normalisation and the "seq-mean-token-sum-norm"
    aggregation, whose constant normaliser is max_len (the generation budget). The other
    arguments are `PPOSettings`'s; the aggregation is not one of them (it is what makes
    Dr. GRPO), so they are named here rather than taken as a `PPOSettings`."""
    ppo = PPOSettings(
        clip_eps,
        clip_eps_high,
        kl_coef,
        kl_estimator,
        entropy_coef,
        aggregation="seq-mean-token-sum-norm",
        max_len=max_len,
    )
    return grpo(group_size, normalize_std=False, ppo=ppo)


def dapo(
    group_size: int,
    cache_len: int,
    max_len: int | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    eos_id: int | None = None,
    penalty_factor: float = 1.0,
    entropy_coef: float = 0.0,
) -> Algorithm:
    """DAPO ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv
    2503.14476): dynamic-sampling filter, soft overlong punishment (and overlong filtering when
    `eos_id` is given), GRPO advantages, clip-higher PPO with token-mean aggregation, no KL.

    The filter sees the unshaped rewards (DAPO filters on accuracy); the shaping runs before the
    advantages. Refilling the batch with new groups is the collector's job
    (`rollout.max_refill_rounds`, see `rljax.train.collector.refill`); groups still all-equal
    after it are masked out by the filter.
    """
    stages = [dynamic_sampling(group_size)]
    if eos_id is not None:
        stages.append(overlong_filter(eos_id))
    stages += [
        overlong_punishment(cache_len, max_len, penalty_factor),
        group_advantages(group_size),
    ]
    main = ppo_clip(clip_eps_low, clip_eps_high, aggregation="token-mean")
    objective = with_regularizers(main, Regularizers(entropy_coef=entropy_coef))
    return Algorithm(chain(*stages), objective, "token-mean")


def gspo(
    group_size: int,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    token_level: bool = False,
    kl_coef: float = 0.0,
    kl_estimator: str = "low_var_kl",
    entropy_coef: float = 0.0,
) -> Algorithm:
    """GSPO ("Group Sequence Policy Optimization", arXiv 2507.18071): GRPO advantages with a
    length-normalised sequence-level importance ratio; `token_level` gives GSPO-token. The
    aggregation is GSPO's own ("seq-mean-token-mean"), so the regularisers are named here
    (`Regularizers`' KL and entropy fields) rather than taken as a `Regularizers`."""
    aggregation = "seq-mean-token-mean"
    main = (gspo_token if token_level else gspo_objective)(eps_low, eps_high, aggregation)
    regularizers = Regularizers(aggregation, None, kl_coef, kl_estimator, entropy_coef)
    objective = with_regularizers(main, regularizers)
    return Algorithm(chain(group_advantages(group_size)), objective, aggregation)


def cispo(
    group_size: int,
    eps_high: float = 0.2,
    eps_low: float | None = None,
    regularizers: Regularizers = Regularizers(kl_estimator="low_var_kl"),
) -> Algorithm:
    """CISPO (MiniMax-M1 report, arXiv 2506.13585): GRPO advantages + REINFORCE with a clipped,
    stop-gradient importance weight, so no token's gradient is dropped. The KL loss, when on,
    defaults to verl's "low_var_kl"."""
    r = regularizers
    main = cispo_objective(eps_high, eps_low, r.aggregation, r.max_len)
    objective = with_regularizers(main, r)
    return Algorithm(chain(group_advantages(group_size)), objective, r.aggregation)


def gpg(
    group_size: int,
    valid_group_scaling: bool = True,
    regularizers: Regularizers = Regularizers(kl_estimator="low_var_kl"),
) -> Algorithm:
    """GPG ("GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    arXiv 2504.02546): group-centred rewards (no std) + plain policy gradient, no ratio or clip.
    `valid_group_scaling` multiplies the advantages by B / B_valid (computed on the whole batch
    by a transform, so minibatch shuffling cannot change it). The KL loss, when on, defaults
    to verl's "low_var_kl"."""
    r = regularizers
    objective = with_regularizers(gpg_objective(r.aggregation, r.max_len), r)
    stages = [group_advantages(group_size, normalize_std=False)]
    if valid_group_scaling:
        stages.append(gpg_valid_group_scaling(group_size))
    return Algorithm(chain(*stages), objective, r.aggregation)


def rloo(
    group_size: int,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """RLOO leave-one-out advantages ("Back to Basics: Revisiting REINFORCE Style Optimization
    for Learning from Human Feedback in LLMs", arXiv 2402.14740) + PPO clip."""
    return ppo_preset(leave_one_out_advantages(group_size), ppo)


def reinforce_pp(
    group_size: int | None = None,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """REINFORCE++ ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models", arXiv 2501.03262): rewards whitened over the whole batch + PPO clip. With a
    `group_size`, the group mean is subtracted first (REINFORCE++-baseline)."""
    return ppo_preset(batch_whitened_advantages(group_size), ppo)


def opo(
    group_size: int,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """OPO's length-weighted optimal baseline ("On-Policy RL with Optimal Reward Baseline",
    arXiv 2505.23585) + PPO clip."""
    return ppo_preset(length_weighted_baseline_advantages(group_size), ppo)


def pass_at_k(
    group_size: int,
    k: int,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """Pass@k training ("Pass@k Training for Adaptively Balancing Exploration and Exploitation
    of Large Reasoning Models", arXiv 2508.10751): analytical pass@k group advantages for
    binary rewards + PPO clip."""
    return ppo_preset(pass_at_k_group_advantages(group_size, k), ppo)


def ppo(
    group_size: int | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    value_coef: float = 0.5,
    value_clip: float | None = 0.2,
    kl_coef: float = 0.0,
    kl_estimator: str = "k1",
    entropy_coef: float = 0.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Algorithm:
    """PPO with a learned critic ("Proximal Policy Optimization Algorithms", arXiv 1707.06347,
    as applied to language models in "Training language models to follow instructions with
    human feedback", arXiv 2203.02155): GAE advantages (whitened) from the critic's values,
    the KL to the reference as a per-token reward penalty, the clipped surrogate (optionally
    dual-clipped) and the clipped value loss. `group_size` is accepted for a uniform preset
    signature and unused: GAE needs no groups."""
    del group_size
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    main = ppo_clip(clip_eps, eps_high, dual_clip_c, aggregation, max_len)
    objective = with_regularizers(main, Regularizers(aggregation, max_len, 0.0, "k3", entropy_coef))
    return Algorithm(
        chain(gae_advantages(gamma, lam, kl_coef=kl_coef, kl_estimator=kl_estimator)),
        objective,
        aggregation,
        value_loss=clipped_value_loss(value_coef, value_clip, aggregation, max_len),
    )


def remax(
    group_size: int | None = None,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """ReMax ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models", arXiv 2310.10505): the reward of the policy's greedy
    completion as baseline, + PPO clip. The driver runs the greedy decoding
    (the transform reads `extras.baseline_reward`); `group_size` is unused (the baseline is
    per prompt)."""
    del group_size
    return ppo_preset(greedy_baseline_advantages(), ppo)
