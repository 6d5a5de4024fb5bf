"""Advantage estimators, as array functions and as batch transforms."""

from rljax.advantages.group import group_advantages, grpo_advantages

__all__ = ["group_advantages", "grpo_advantages"]
