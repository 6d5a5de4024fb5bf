"""Rewards: the host-side reward-function interface, contained (and parallel) scoring, and the
reward functions: math answers, CRPS credit over a group's numeric answers, weighted rubrics,
execution-aware code rewards run in a sandboxed subprocess, ReCrit's transition-aware
rewards for critic interactions and RLCM's confidence-margin reward."""

from rljax.rewards.base import FAILURE_KINDS, RewardFn, score_completions
from rljax.rewards.code import CodeReward, code_reward, code_reward_fn, token_level_rewards
from rljax.rewards.confidence_margin import confidence_margin, confidence_margin_rewards
from rljax.rewards.crps import crps, crps_credit, group_crps_rewards
from rljax.rewards.math import extract_answer, math_equal, math_reward, numeric_match_reward
from rljax.rewards.pool import score_completions_parallel
from rljax.rewards.recrit import (
    QUADRANTS,
    TransitionWeights,
    quadrant_counts,
    recrit_rewards,
    transition_quadrants,
)
from rljax.rewards.rubric import (
    RUBRIC_FAILURE_KINDS,
    RubricItem,
    keyword_judge,
    rubric_reward,
    rubric_rewards,
)
from rljax.rewards.sandbox import ExecResult, network_namespace_available, run_python

__all__ = [
    "FAILURE_KINDS",
    "RewardFn",
    "score_completions",
    "score_completions_parallel",
    "extract_answer",
    "math_equal",
    "math_reward",
    "numeric_match_reward",
    "crps",
    "crps_credit",
    "group_crps_rewards",
    "RUBRIC_FAILURE_KINDS",
    "RubricItem",
    "keyword_judge",
    "rubric_reward",
    "rubric_rewards",
    "CodeReward",
    "code_reward",
    "code_reward_fn",
    "token_level_rewards",
    "confidence_margin",
    "confidence_margin_rewards",
    "QUADRANTS",
    "TransitionWeights",
    "quadrant_counts",
    "recrit_rewards",
    "transition_quadrants",
    "ExecResult",
    "network_namespace_available",
    "run_python",
]
