"""Rewards: the host-side reward-function interface and contained scoring."""

from rljax.rewards.base import FAILURE_KINDS, RewardFn, score_completions

__all__ = ["FAILURE_KINDS", "RewardFn", "score_completions"]
