"""RLOO: REINFORCE with a leave-one-out baseline over the samples of one prompt."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core.batch import Batch
from rljax.core.transform import Transform


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: RLOO needs at least 2 samples per prompt (the "
            "leave-one-out baseline of a lone sample is the mean of no rewards); sample G >= 2 "
            "completions per prompt"
        )


def rloo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """Leave-one-out sequence advantages.

    A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean_g), the j running
    over the G samples of i's group ("Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", Ahmadian et al. 2024,
    arXiv 2402.14740). The baseline of each sample excludes its own reward, so it
    is unbiased without a learned critic. A group whose rewards are all equal gets
    exactly 0 (no rounding residue).

    Args:
      rewards: [B] sequence rewards, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).

    Returns:
      [B] advantages; they sum to 0 within each group.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank(rewards, 1)
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    r = rewards.reshape(b // group_size, group_size)
    constant = jnp.all(r == r[:, :1], axis=1, keepdims=True)
    centered = jnp.where(constant, 0.0, r - r.mean(axis=1, keepdims=True))
    return (centered * (group_size / (group_size - 1))).reshape(b)


def leave_one_out_advantages(group_size: int) -> Transform:
    """Transform writing `batch.advantages = rloo_advantages(rewards)[:, None] * completion_mask`.

    RLOO ("Back to Basics: Revisiting REINFORCE Style Optimization for Learning
    from Human Feedback in LLMs", Ahmadian et al. 2024). Every sample counts in its
    group's baseline, also one whose completion is fully masked (its own tokens
    then get advantage 0).

    Args:
      group_size: G, samples per prompt (>= 2).

    Returns:
      A stateless `Transform`. Metrics: "rloo/advantages/{mean,std,min,max}" over
      valid (completion_mask) tokens, and "rloo/zero_std_frac", the fraction of
      groups whose rewards are all equal (no learning signal).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(rewards: jax.Array, batch: Batch) -> jax.Array:
        del batch
        return rloo_advantages(rewards, group_size)

    return sequence_advantages("leave_one_out_advantages", fn, group_size, prefix="rloo")
