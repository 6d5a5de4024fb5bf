"""Advantage estimators, as array functions and as batch transforms."""

from rljax.advantages.agent_groups import agent_advantages, agent_normalized_advantages
from rljax.advantages.dgpo import deviation_gated_advantages, dgpo_token_weights
from rljax.advantages.exploration_bias import (
    exploration_bias,
    exploration_biased_rewards,
    sequence_logprob,
)
from rljax.advantages.expthink import (
    difficulty_adaptive_advantages,
    expthink_advantages,
    expthink_rewards,
)
from rljax.advantages.gae import gae, gae_advantages, last_token_rewards
from rljax.advantages.gdpo import decoupled_group_advantages, gdpo_advantages
from rljax.advantages.gprl import gpm_dimension_rewards, gprl_advantages, preference_advantages
from rljax.advantages.group import group_advantages, grpo_advantages, masked_stats
from rljax.advantages.kernel_baseline import kernel_baseline, kernel_baseline_advantages
from rljax.advantages.lead import (
    efficiency_rewards,
    lead_advantages,
    pooled_group_stats,
    psi_target_weights,
    target_lengths,
)
from rljax.advantages.max_likelihood import max_likelihood_advantages, mean_normalized_advantages
from rljax.advantages.optimal_baseline import length_weighted_baseline_advantages, opo_advantages
from rljax.advantages.optimal_token_baseline import (
    logit_gradient_proxy,
    optimal_token_baseline,
    optimal_token_baseline_advantages,
)
from rljax.advantages.pass_at_k import (
    pass_at_k_advantages,
    pass_at_k_group_advantages,
    pass_at_k_values,
)
from rljax.advantages.prefix_tree import implicit_process_advantages, prefix_tree_advantages
from rljax.advantages.reinforce_pp import batch_whitened_advantages, reinforce_pp_advantages
from rljax.advantages.remax import greedy_baseline_advantages, remax_advantages
from rljax.advantages.reward_components import components_as_rewards
from rljax.advantages.rloo import leave_one_out_advantages, rloo_advantages
from rljax.advantages.sequence import sequence_advantages
from rljax.advantages.turns import (
    broadcast_turns,
    turn_gae,
    turn_gae_transform,
    turn_group_advantage_transform,
    turn_group_advantages,
    turn_ids,
    turn_returns,
    turn_start_values,
)

__all__ = [
    "efficiency_rewards",
    "lead_advantages",
    "pooled_group_stats",
    "psi_target_weights",
    "target_lengths",
    "agent_advantages",
    "agent_normalized_advantages",
    "batch_whitened_advantages",
    "components_as_rewards",
    "deviation_gated_advantages",
    "dgpo_token_weights",
    "difficulty_adaptive_advantages",
    "exploration_bias",
    "exploration_biased_rewards",
    "expthink_advantages",
    "expthink_rewards",
    "gae",
    "gae_advantages",
    "gpm_dimension_rewards",
    "gprl_advantages",
    "gdpo_advantages",
    "decoupled_group_advantages",
    "max_likelihood_advantages",
    "mean_normalized_advantages",
    "greedy_baseline_advantages",
    "group_advantages",
    "grpo_advantages",
    "implicit_process_advantages",
    "kernel_baseline",
    "kernel_baseline_advantages",
    "last_token_rewards",
    "leave_one_out_advantages",
    "length_weighted_baseline_advantages",
    "logit_gradient_proxy",
    "masked_stats",
    "sequence_advantages",
    "opo_advantages",
    "optimal_token_baseline",
    "optimal_token_baseline_advantages",
    "pass_at_k_advantages",
    "pass_at_k_group_advantages",
    "pass_at_k_values",
    "preference_advantages",
    "prefix_tree_advantages",
    "reinforce_pp_advantages",
    "remax_advantages",
    "rloo_advantages",
    "sequence_logprob",
    "broadcast_turns",
    "turn_gae",
    "turn_gae_transform",
    "turn_group_advantage_transform",
    "turn_group_advantages",
    "turn_ids",
    "turn_returns",
    "turn_start_values",
]
