"""Presets for multi-turn episodes with turn-level credit (`rljax.advantages.turns`).

Trajectory-level credit needs no preset of its own: `grpo` and `rloo` on an episodic task
compare each episode's total reward with its group's and credit the policy's tokens only.
"""

from rljax.advantages.turns import turn_gae_transform, turn_group_advantage_transform
from rljax.algorithms.base import (
    Algorithm,
    PPOSettings,
    Regularizers,
    ppo_preset,
    with_regularizers,
)
from rljax.core.transform import chain
from rljax.objectives.surrogate import ppo_clip
from rljax.objectives.value import clipped_value_loss


def turn_grpo(
    group_size: int,
    gamma: float = 1.0,
    normalize_std: bool = True,
    ppo: PPOSettings = PPOSettings(),
) -> Algorithm:
    """GRPO with per-turn group baselines: turn k's tokens get its discounted return-to-go
    minus the mean over the group's episodes that reached turn k (divided by their std with
    `normalize_std`) + PPO clip. Needs an episodic task (turn rewards in the batch)."""
    return ppo_preset(turn_group_advantage_transform(group_size, gamma, normalize_std), ppo)


def turn_ppo(
    group_size: int | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    value_coef: float = 0.5,
    value_clip: float | None = 0.2,
    entropy_coef: float = 0.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Algorithm:
    """PPO with GAE over turns: a turn is one step, valued by the critic at its first token
    (`turn_gae_transform`); the clipped surrogate and the clipped value loss on the turns'
    returns. `group_size` is accepted for a uniform preset signature and unused."""
    del group_size
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    main = ppo_clip(clip_eps, eps_high, None, aggregation, max_len)
    objective = with_regularizers(main, Regularizers(aggregation, max_len, 0.0, "k3", entropy_coef))
    return Algorithm(
        chain(turn_gae_transform(gamma, lam)),
        objective,
        aggregation,
        value_loss=clipped_value_loss(value_coef, value_clip, aggregation, max_len),
    )
