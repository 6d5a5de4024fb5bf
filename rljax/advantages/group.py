"""Group-relative advantages: GRPO and Dr. GRPO."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import masked_stats, sequence_advantages
from rljax.core.batch import Batch
from rljax.core.transform import Transform

__all__ = ["batch_std_advantages", "grpo_advantages", "group_advantages", "masked_stats"]

STD_SCOPES = ("group", "batch")


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: group-relative advantages need at least 2 samples per "
            "prompt (the group std is undefined and r - mean is always 0)"
        )


def grpo_advantages(
    rewards: jax.Array,
    group_size: int,
    normalize_std: bool = True,
    unbiased_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """Group-relative sequence advantages.

    A_i = (r_i - mean_g) / (std_g + eps) over the G samples of i's group
    (GRPO, Shao et al. 2024, arXiv 2402.03300); with `normalize_std=False`,
    A_i = r_i - mean_g (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783). The std
    is unbiased (ddof=1) by default, as in verl's GRPO (torch.std). A group whose
    rewards are all equal gets exactly 0 (no rounding residue divided by eps).
    [B, K] rewards are normalised one dimension at a time, each in its group on its own
    scale (GDPO's decoupled normalisation, GPRL's per-dimension advantages).

    Args:
      rewards: [B] or [B, K] sequence rewards, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).
      normalize_std: divide by the group std.
      unbiased_std: use the ddof=1 std; False uses the population std.
      eps: added to the std.

    Returns:
      Advantages of the rewards' shape.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank(rewards, {1, 2})
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    r = rewards.reshape(b // group_size, group_size, *rewards.shape[1:])
    constant = jnp.all(r == r[:, :1], axis=1, keepdims=True)
    centered = jnp.where(constant, 0.0, r - r.mean(axis=1, keepdims=True))
    if normalize_std:
        ddof = 1 if unbiased_std else 0
        std = jnp.sqrt(jnp.sum(centered**2, axis=1, keepdims=True) / (group_size - ddof))
        centered = centered / (std + eps)
    return centered.reshape(rewards.shape)


def batch_std_advantages(rewards: jax.Array, group_size: int, eps: float = 1e-4) -> jax.Array:
    """Group-centred rewards scaled by the std of the whole batch's rewards.

    A_i = (r_i - mean_g) / (std(r_1..r_B) + eps), the std unbiased (ddof=1) over all B
    rewards: TRL's `scale_rewards="batch"` (its eps is 1e-4), the "group mean, batch std"
    normalisation that "Tricks or Traps? A Deep Dive into RL for LLM Reasoning" (Liu et al.
    2025) found more robust than the group std, which inflates the advantages of groups that
    nearly all agree. A group whose rewards are all equal gets exactly 0.

    Args:
      rewards: [B] sequence rewards, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).
      eps: added to the batch std.

    Returns:
      [B] advantages.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    centred = grpo_advantages(rewards, group_size, normalize_std=False)
    r = rewards.astype(jnp.float32)
    std = jnp.sqrt(jnp.sum((r - r.mean()) ** 2) / max(r.shape[0] - 1, 1))
    return centred / (std + eps)


def group_advantages(
    group_size: int,
    normalize_std: bool = True,
    unbiased_std: bool = True,
    eps: float = 1e-6,
    std_scope: str = "group",
) -> Transform:
    """Transform writing `batch.advantages = grpo_advantages(rewards)[:, None] * completion_mask`.

    Args:
      group_size: G, samples per prompt (>= 2).
      normalize_std: divide by the group std (False gives Dr. GRPO).
      unbiased_std: use the ddof=1 std.
      eps: added to the std.
      std_scope: "group" (GRPO) or "batch": `batch_std_advantages`, the std of all the
        batch's rewards (TRL's `scale_rewards="batch"`; `unbiased_std` does not apply and
        `eps` is that function's).

    Returns:
      A stateless `Transform`. Metrics: "advantages/{mean,std,min,max}" over
      valid (completion_mask) tokens, and "advantages/zero_std_frac", the
      fraction of groups whose rewards are all equal (no learning signal).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)
    if std_scope not in STD_SCOPES:
        raise ValueError(f"std_scope={std_scope!r} must be one of {list(STD_SCOPES)}")

    def fn(rewards: jax.Array, batch: Batch) -> jax.Array:
        del batch
        if normalize_std and std_scope == "batch":
            return batch_std_advantages(rewards, group_size, eps)
        return grpo_advantages(rewards, group_size, normalize_std, unbiased_std, eps)

    return sequence_advantages("group_advantages", fn, group_size)
