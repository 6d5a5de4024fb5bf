"""Presets of the seed papers' methods (`../shared/seeds`), a few lines each.

Presets that take `ppo: PPOSettings` (clip ranges, KL loss, entropy bonus, aggregation) or
`regularizers: Regularizers` (aggregation, KL loss, entropy bonus) have each field as an
`algorithm.*` config key, beside their own parameters (`rljax.train.builders.preset_settings`).
"""

import jax.numpy as jnp

from rljax.advantages.agent_groups import agent_advantages
from rljax.advantages.dgpo import deviation_gated_advantages
from rljax.advantages.distillation import teacher_advantages
from rljax.advantages.exploration_bias import exploration_bias
from rljax.advantages.expthink import expthink_advantages, expthink_rewards
from rljax.advantages.gdpo import decoupled_group_advantages
from rljax.advantages.gprl import preference_advantages
from rljax.advantages.group import group_advantages
from rljax.advantages.kernel_baseline import kernel_baseline_advantages
from rljax.advantages.lead import lead_advantages
from rljax.advantages.max_likelihood import mean_normalized_advantages
from rljax.advantages.optimal_token_baseline import optimal_token_baseline_advantages
from rljax.advantages.prefix_tree import implicit_process_advantages
from rljax.advantages.reward_components import components_as_rewards
from rljax.algorithms.base import (
    Algorithm,
    PPOSettings,
    Regularizers,
    ppo_preset,
    regularized_preset,
)
from rljax.core.objective import sum_objectives
from rljax.core.transform import Transform, chain
from rljax.objectives.gkd import generalized_jsd
from rljax.objectives.mu_grpo import mu_grpo as mu_grpo_objective
from rljax.objectives.power_distillation import power_weighting, weighted_sft
from rljax.objectives.segment_po import segment_po as segment_po_objective
from rljax.objectives.surrogate import ppo_clip


def mu_grpo(
    group_size: int,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    veto_delta: float | None = None,
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """Mu-GRPO (arXiv 2605.17570): GRPO advantages + the relaxed asymmetric clip and the
    negative-advantage veto against the frozen stage policy (`batch.old_logprobs`). The few
    large generation-optimisation stages are a schedule of the driver (several epochs and
    minibatches per rollout batch: `train.epochs`, `train.minibatches`; `regularizers`: the
    aggregation, KL loss and entropy bonus)."""
    return regularized_preset(
        chain(group_advantages(group_size)),
        lambda agg, ml: mu_grpo_objective(eps_low, eps_high, veto_delta, agg, ml),
        regularizers,
    )


def segment_po(
    group_size: int,
    delimiter_ids: tuple[int, ...] = (10,),
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    process_advantages: bool = False,
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """segment_po ("Segment-Aligned Policy Optimization"; not the Soft Adaptive Policy
    Optimization that verl and TRL call SAPO): segment-level importance ratios and advantages,
    segments ending at `delimiter_ids` (default: newline in byte and most BPE vocabularies; pass
    your tokenizer's ids). The segment advantage is the mean token advantage
    over the segment: GRPO's (constant per response) or, with `process_advantages`, IBPO's
    prefix-tree process advantages, which differ between segments. `regularizers`: the
    aggregation, KL loss and entropy bonus."""
    if process_advantages:
        advantages = implicit_process_advantages(group_size)
    else:
        advantages = group_advantages(group_size)
    return regularized_preset(
        chain(advantages),
        lambda agg, ml: segment_po_objective(tuple(delimiter_ids), eps_low, eps_high, agg, ml),
        regularizers,
    )


def expthink(
    group_size: int,
    capacity: int = 1 << 20,
    discount: float = 0.5,
    correct_threshold: float = 1.0,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """ExpThink (arXiv 2605.07501): three-tier rewards against the shortest correct length
    seen per prompt (state: a table of `capacity` prompts indexed by `extras["prompt_id"]`,
    which the driver fills with the task index modulo 2^31; ids >= capacity are not tracked)
    and the difficulty-adaptive advantage (correct-count instead of std normalisation), + PPO
    clip (`ppo`: `PPOSettings`)."""
    rewards = expthink_rewards(capacity, 1.0, discount, correct_threshold)
    transform = chain(rewards, expthink_advantages(group_size))
    return ppo_preset(transform, ppo)


def lead(
    group_size: int,
    l_min: float = 1000.0,
    l_max: float = 8000.0,
    mode: str = "max_sym",
    alpha: float = 1.0,
    beta: float = 0.95,
    w_min: float = 0.3,
    correct_threshold: float = 1.0,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """LEAD (arXiv 2605.09806): per-prompt target length L* = clip(mean correct length, l_min,
    l_max), a symmetric efficiency reward around it, correctness and efficiency GRPO
    advantages mixed by EMA-smoothed Potential-Scaled Instability weights (w_corr >= w_min,
    state of the transform) and whitened over the batch, + PPO clip (`ppo`:
    `PPOSettings`). The defaults are the paper's run (lengths in tokens)."""
    advantages = lead_advantages(
        group_size, l_min, l_max, mode, alpha, beta, w_min, correct_threshold
    )
    return ppo_preset(advantages, ppo)


def dr_mas(
    group_size: int, agent_key: str = "agent_id", ppo: PPOSettings = PPOSettings()
) -> Algorithm:
    """Dr. MAS (arXiv 2602.08847): rewards normalised per (prompt, agent) cell, the agent id
    read from `batch.extras[agent_key]`, + PPO clip (`ppo`: `PPOSettings`)."""
    return ppo_preset(chain(agent_advantages(group_size, agent_key)), ppo)


def kernel_baseline(
    group_size: int, bandwidth: float = 1.0, ppo: PPOSettings = PPOSettings()
) -> Algorithm:
    """Kernel-smoothing value baseline (arXiv 2604.28005): a leave-one-out Nadaraya-Watson
    baseline over prompt embeddings (the policy's mean prompt hidden state, computed by the
    prepare step), + PPO clip. `group_size` is unused: the baseline pools across prompts."""
    del group_size
    return ppo_preset(chain(kernel_baseline_advantages(bandwidth)), ppo)


def ibpo(group_size: int, ppo: PPOSettings = PPOSettings()) -> Algorithm:
    """IBPO (arXiv 2605.16302): implicit process-level advantages from the prefix tree of each
    group's responses, + PPO clip (`ppo`: `PPOSettings`)."""
    return ppo_preset(chain(implicit_process_advantages(group_size)), ppo)


def gprl(
    group_size: int,
    num_dimensions: int,
    weights: tuple[float, ...] | None = None,
    drift_window: int = 8,
    drift_threshold: float = 0.6,
    reward_components: bool = False,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """GPRL (arXiv 2605.18721): per-dimension group-relative advantages of [B, K] rewards,
    combined with context-dependent weights (`extras["dimension_weights"]` or `weights`), and
    the drift monitor that down-weights a dimension taking over the reward gain and tightens
    the clip range (`extras["clip_scale"]`, read by the PPO surrogate). `reward_components`:
    the K dimensions are the task's reward components, which the driver collects
    (`components_as_rewards`)."""
    advantages = preference_advantages(
        group_size,
        weights=None if weights is None else jnp.asarray(weights, jnp.float32),
        drift_window=drift_window,
        drift_threshold=drift_threshold,
        num_dimensions=num_dimensions,
    )
    return ppo_preset(_from_components(reward_components, advantages), ppo)


def gdpo(
    group_size: int,
    weights: tuple[float, ...] | None = None,
    normalize_std: bool = True,
    reward_components: bool = False,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """GDPO (arXiv 2601.05242; verl's "gdpo" estimator): each dimension of [B, K] rewards
    normalised in its group, summed with `weights`, whitened over the batch's tokens
    (`rljax.advantages.gdpo`), + PPO clip. [B] rewards give GRPO followed by the whitening.
    `reward_components`: the K dimensions are the task's reward components, which the driver
    collects (`components_as_rewards`)."""
    advantages = decoupled_group_advantages(group_size, weights, normalize_std)
    return ppo_preset(_from_components(reward_components, advantages), ppo)


def _from_components(reward_components: bool, advantages: Transform) -> Transform:
    """`advantages` of the task's reward components where asked, else of `batch.rewards`."""
    if reward_components:
        return chain(components_as_rewards(), advantages)
    return chain(advantages)


def maxrl(group_size: int, ppo: PPOSettings = PPOSettings()) -> Algorithm:
    """MaxRL (Maximum-Likelihood RL, arXiv 2602.02710; prime-rl's `max_rl`): group
    advantages divided by the group's mean reward instead of its std, which optimises the
    log-likelihood of success (`rljax.advantages.max_likelihood`), + PPO clip."""
    return ppo_preset(chain(mean_normalized_advantages(group_size)), ppo)


def on_policy_distillation(
    group_size: int,
    teacher_coef: float = 1.0,
    task_coef: float = 0.0,
    center: bool = False,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """On-policy distillation (GKD, arXiv 2306.13649; verl/TRL/prime-rl's `opd`): the student
    samples, the teacher policy of `teacher.run_dir` scores each sampled token, and the
    per-token advantage is `teacher_coef` x (log pi_teacher - log pi_student), plus `task_coef`
    x GRPO's advantage of the task rewards (`rljax.advantages.distillation`; `center`: minus
    the teacher term's batch mean), + PPO clip."""
    teacher = teacher_advantages(teacher_coef, task_coef, center)
    transform = chain(group_advantages(group_size), teacher)
    return ppo_preset(transform, ppo)


def gkd(
    group_size: int,
    beta: float = 0.5,
    jsd_coef: float = 1.0,
    task_rewards: bool = False,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """On-policy GKD (arXiv 2306.13649, lambda = 1; TRL's GKDTrainer, verl/slime/NeMo's top-k
    logit distillation): the student samples, and `jsd_coef` x the generalized JSD between its
    next-token distributions and the teacher's over the teacher's `teacher.top_k` tokens
    (`rljax.objectives.gkd`; beta 0 forward KL, 1 reverse KL) is the loss. With
    `task_rewards`, GRPO's PPO-clip surrogate of the task rewards is added. `ppo`'s
    aggregation, KL and entropy settings apply either way; its clip ranges only with
    `task_rewards`."""

    def main(aggregation: str, max_len: int | None):
        jsd = generalized_jsd(beta, jsd_coef, aggregation, max_len)
        if not task_rewards:
            return jsd
        surrogate = ppo_clip(ppo.clip_eps, ppo.eps_high, aggregation=aggregation, max_len=max_len)
        return sum_objectives(jsd, surrogate)

    transform = chain(group_advantages(group_size)) if task_rewards else chain()
    return regularized_preset(transform, main, ppo.regularizers)


def dgpo(
    group_size: int,
    vocab_size: int,
    temperature: float = 1.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    entropy_coef: float = 0.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Algorithm:
    """DGPO (arXiv 2605.03327): the GRPO sequence advantage redistributed over tokens by
    entropy-gated Hellinger deviation from the reference (credit mass preserved), PPO clip and
    no KL term (so `PPOSettings`' fields but the KL ones are named here). Needs the reference
    policy and the prepare step's Hellinger statistic."""
    transform = chain(
        group_advantages(group_size), deviation_gated_advantages(vocab_size, temperature)
    )
    ppo = PPOSettings(
        clip_eps, clip_eps_high, entropy_coef=entropy_coef, aggregation=aggregation, max_len=max_len
    )
    return ppo_preset(transform, ppo)


def otb(
    group_size: int,
    use_is_weight: bool = False,
    handle_zero_tail: bool = False,
    align: str = "position",
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """Optimal Token Baseline (arXiv 2602.07078): a per-position group baseline weighted by
    the cumulative logit-gradient proxy (from the prepare step's sum of squared
    probabilities), no std normalisation, + PPO clip (`ppo`: `PPOSettings`).
    `align="policy_token"` is TIR-OTB (verl's tool-integrated variant) for episodic tasks:
    samples aligned by the policy's own tokens, environment tokens skipped."""
    advantages = optimal_token_baseline_advantages(
        group_size, use_is_weight, handle_zero_tail, align=align
    )
    return ppo_preset(chain(advantages), ppo)


def edo(
    group_size: int,
    coef: float = 0.1,
    only_correct: bool = False,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """ED-GRPO, exploration-driven reward biasing ("Exploration-Driven Optimization"; an
    interpretation, see `rljax.advantages.exploration_bias`): rewards get a bonus for
    responses the policy finds unlikely, then GRPO advantages and PPO clip."""
    transform = chain(
        exploration_bias(coef, only_correct=only_correct), group_advantages(group_size)
    )
    return ppo_preset(transform, ppo)


def power_distillation(
    group_size: int,
    alpha: float = 4.0,
    teacher: str = "old",
    proposal: str = "old",
    length_normalize: bool = False,
) -> Algorithm:
    """Power-distribution self-distillation (arXiv 2605.04542; Karan & Du 2025, "Reasoning with
    Sampling: Your Language Model is Secretly a Reasoning Model"): SFT towards p^alpha on the
    batch's own samples, reweighted by self-normalised importance weights within each group.
    The default teacher is the pre-update policy itself; `teacher="ref"` distils the frozen
    reference (kept in the train state)."""
    weighting = power_weighting(group_size, alpha, teacher, proposal, length_normalize)
    return Algorithm(
        chain(weighting),
        weighted_sft("seq-mean-token-sum"),
        "seq-mean-token-sum",
    )
