"""Loss terms: policy-gradient surrogates, KL, entropy, the critic's value loss, distillation."""

from rljax.objectives.cispo import cispo
from rljax.objectives.dppo import binary_kl, dppo, dppo_trust_mask
from rljax.objectives.entropy import entropy_bonus
from rljax.objectives.gmpo import gmpo
from rljax.objectives.gpg import gpg, valid_group_scale, valid_group_scaling
from rljax.objectives.gspo import gspo, gspo_token, sequence_log_ratio
from rljax.objectives.ipo import ipo
from rljax.objectives.kl import KL_ESTIMATORS, kl_loss, kl_penalty, kl_reward_penalty
from rljax.objectives.mu_grpo import mu_grpo, negative_advantage_veto
from rljax.objectives.policy_gradient import (
    PGInputs,
    clipped_is_reinforce,
    clipped_surrogate,
    dual_clip,
    policy_gradient_objective,
    reinforce,
)
from rljax.objectives.power_distillation import power_weighting, power_weights, weighted_sft
from rljax.objectives.sapo import sapo, sapo_gate
from rljax.objectives.segment_po import segment_ids, segment_po
from rljax.objectives.surrogate import ppo_clip
from rljax.objectives.value import ValueLoss, clipped_value_loss

__all__ = [
    "PGInputs",
    "clipped_is_reinforce",
    "clipped_surrogate",
    "dual_clip",
    "policy_gradient_objective",
    "reinforce",
    "KL_ESTIMATORS",
    "ValueLoss",
    "binary_kl",
    "cispo",
    "clipped_value_loss",
    "dppo",
    "dppo_trust_mask",
    "entropy_bonus",
    "gmpo",
    "gpg",
    "gspo",
    "gspo_token",
    "ipo",
    "kl_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "mu_grpo",
    "negative_advantage_veto",
    "power_weighting",
    "power_weights",
    "ppo_clip",
    "sapo",
    "sapo_gate",
    "segment_po",
    "segment_ids",
    "sequence_log_ratio",
    "valid_group_scale",
    "valid_group_scaling",
    "weighted_sft",
]
