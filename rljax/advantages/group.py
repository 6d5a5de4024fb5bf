"""Group-relative advantages: GRPO and Dr. GRPO."""

import chex
import jax
import jax.numpy as jnp

from rljax.core.batch import Batch, check_groups, check_sequence_rewards, equal_reward_fraction
from rljax.core.transform import Context, Metrics, Transform, stateless


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

    Args:
      rewards: [B] sequence rewards, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).
      normalize_std: divide by the group std.
      unbiased_std: use the ddof=1 std; False uses the population std.
      eps: added to the std.

    Returns:
      [B] advantages.

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
    if normalize_std:
        ddof = 1 if unbiased_std else 0
        std = jnp.sqrt(jnp.sum(centered**2, axis=1, keepdims=True) / (group_size - ddof))
        centered = centered / (std + eps)
    return centered.reshape(b)


def masked_stats(x: jax.Array, mask: jax.Array, prefix: str) -> Metrics:
    """Mean, std, min and max of x over mask; all 0 when the mask is empty."""
    any_valid = mask.any()
    n = jnp.maximum(mask.sum(), 1)
    mean = jnp.where(mask, x, 0.0).sum() / n
    var = jnp.where(mask, (x - mean) ** 2, 0.0).sum() / n
    return {
        f"{prefix}/mean": mean,
        f"{prefix}/std": jnp.sqrt(var),
        f"{prefix}/min": jnp.where(any_valid, jnp.where(mask, x, jnp.inf).min(), 0.0),
        f"{prefix}/max": jnp.where(any_valid, jnp.where(mask, x, -jnp.inf).max(), 0.0),
    }


def group_advantages(
    group_size: int,
    normalize_std: bool = True,
    unbiased_std: bool = True,
    eps: float = 1e-6,
) -> Transform:
    """Transform writing `batch.advantages = grpo_advantages(rewards)[:, None] * completion_mask`.

    Args:
      group_size: G, samples per prompt (>= 2).
      normalize_std: divide by the group std (False gives Dr. GRPO).
      unbiased_std: use the ddof=1 std.
      eps: added to the std.

    Returns:
      A stateless `Transform`. Metrics: "advantages/{mean,std,min,max}" over
      valid (completion_mask) tokens, and "advantages/zero_std_frac", the
      fraction of groups whose rewards are all equal (no learning signal).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "group_advantages")
        check_groups(batch.group_id, group_size)
        adv = grpo_advantages(batch.rewards, group_size, normalize_std, unbiased_std, eps)
        mask = batch.completion_mask
        token_adv = adv[:, None] * mask.astype(adv.dtype)
        metrics = masked_stats(token_adv, mask, "advantages")
        metrics["advantages/zero_std_frac"] = equal_reward_fraction(batch.rewards, group_size)
        return batch.replace(advantages=token_adv), metrics

    return stateless(fn)
