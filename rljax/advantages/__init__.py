"""Advantage estimators, as array functions and as batch transforms."""

from rljax.advantages.group import group_advantages, grpo_advantages, masked_stats
from rljax.advantages.optimal_baseline import length_weighted_baseline_advantages, opo_advantages
from rljax.advantages.pass_at_k import (
    pass_at_k_advantages,
    pass_at_k_group_advantages,
    pass_at_k_values,
)
from rljax.advantages.reinforce_pp import batch_whitened_advantages, reinforce_pp_advantages
from rljax.advantages.remax import greedy_baseline_advantages, remax_advantages
from rljax.advantages.rloo import leave_one_out_advantages, rloo_advantages

__all__ = [
    "batch_whitened_advantages",
    "greedy_baseline_advantages",
    "group_advantages",
    "grpo_advantages",
    "leave_one_out_advantages",
    "length_weighted_baseline_advantages",
    "masked_stats",
    "opo_advantages",
    "pass_at_k_advantages",
    "pass_at_k_group_advantages",
    "pass_at_k_values",
    "reinforce_pp_advantages",
    "remax_advantages",
    "rloo_advantages",
]
