"""REINFORCE++ and REINFORCE++-baseline: batch-whitened token-level advantages."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.group import masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform, stateless


def _check_group_size(group_size: int | None) -> None:
    if group_size is not None and group_size < 2:
        raise ValueError(
            f"group_size={group_size}: REINFORCE++-baseline subtracts the group mean reward and "
            "needs at least 2 samples per prompt (with 1, r - mean is always 0); pass "
            "group_size=None for plain REINFORCE++"
        )


def reinforce_pp_advantages(
    rewards: jax.Array,
    completion_mask: jax.Array,
    group_size: int | None = None,
    eps: float = 1e-6,
) -> jax.Array:
    """Token-level advantages whitened over every valid token of the batch.

    REINFORCE++ ("REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", Hu 2025, arXiv 2501.03262), as OpenRLHF computes it with
    gamma = 1: each valid token of sample b gets the return x_bt = r_b, then

      A_bt = (x_bt - mu) / (sigma + eps),
      mu = sum_bt m_bt x_bt / sum_bt m_bt,  sigma^2 = sum_bt m_bt (x_bt - mu)^2 / sum_bt m_bt,

    with m = completion_mask. The statistics are token-level (a sample weighs as
    many times as it has valid tokens) and the variance is the population one
    (ddof=0), over the whole batch passed in. OpenRLHF multiplies by
    rsqrt(max(var, 1e-8)) instead of dividing by (sigma + eps); the two agree
    unless sigma is tiny.

    With `group_size=G` this is REINFORCE++-baseline: the rewards are first
    centred on their group mean, x_bt = r_b - mean_g(r), then whitened as above.
    A group whose rewards are all equal is centred to exactly 0, but after the
    global whitening it gets -mu / (sigma + eps), which is non-zero when other
    groups make mu != 0 (mu is token-weighted, so it is not 0 in general).

    The per-token KL penalty of the paper's return is not part of this function:
    place `rljax.objectives.kl.kl_reward_penalty` before the advantage transform.
    That penalty is summed over the whole completion, so every token sees the same
    return, not the paper's KL reward-to-go.

    If all valid tokens hold the same value (all-equal rewards, or all-equal
    within every group for the baseline variant) or no token is valid, the result
    is exactly 0.

    Args:
      rewards: [B] sequence rewards (laid out as B/G contiguous groups when
        `group_size` is given).
      completion_mask: [B, T] bool, True on valid completion tokens.
      group_size: None for REINFORCE++; G (>= 2) for REINFORCE++-baseline.
      eps: added to the token std.

    Returns:
      [B, T] advantages, 0 on masked tokens.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_rank(completion_mask, 2)
    chex.assert_equal_shape_prefix([rewards, completion_mask], 1)
    b = rewards.shape[0]
    _check_group_size(group_size)
    x = rewards.astype(jnp.float32)
    if group_size is not None:
        if b % group_size:
            raise ValueError(f"group_size={group_size} does not divide batch {b}")
        r = x.reshape(b // group_size, group_size)
        constant = jnp.all(r == r[:, :1], axis=1, keepdims=True)
        x = jnp.where(constant, 0.0, r - r.mean(axis=1, keepdims=True)).reshape(b)
    mask = completion_mask.astype(bool)
    tokens = jnp.broadcast_to(x[:, None], mask.shape)
    n = jnp.maximum(mask.sum(), 1)
    mean = jnp.where(mask, tokens, 0.0).sum() / n
    std = jnp.sqrt(jnp.where(mask, (tokens - mean) ** 2, 0.0).sum() / n)
    # True also when no token is valid (max = -inf, min = +inf).
    constant = jnp.where(mask, tokens, -jnp.inf).max() <= jnp.where(mask, tokens, jnp.inf).min()
    whitened = jnp.where(constant, 0.0, (tokens - mean) / (std + eps))
    return jnp.where(mask, whitened, 0.0)


def batch_whitened_advantages(group_size: int | None = None, eps: float = 1e-6) -> Transform:
    """Transform writing `batch.advantages = reinforce_pp_advantages(rewards, completion_mask)`.

    REINFORCE++ (`group_size=None`) or REINFORCE++-baseline (`group_size=G`),
    "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models" (Hu 2025). The statistics are over the valid tokens of the whole batch
    the transform sees (the full rollout batch in `prepare`).

    Args:
      group_size: None for REINFORCE++; G (>= 2) for REINFORCE++-baseline.
      eps: added to the token std.

    Returns:
      A stateless `Transform`. Metrics, under prefix "reinforce_pp" (or
      "reinforce_pp_baseline" with a group size): "{prefix}/advantages/{mean,std,
      min,max}" over valid tokens after whitening, and "{prefix}/raw_mean",
      "{prefix}/raw_std", the token-level statistics of the returns before
      whitening.

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)
    prefix = "reinforce_pp" if group_size is None else "reinforce_pp_baseline"

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "batch_whitened_advantages")
        if group_size is not None:
            check_groups(batch.group_id, group_size)
        mask = batch.completion_mask
        token_adv = reinforce_pp_advantages(batch.rewards, mask, group_size, eps)
        raw = batch.rewards
        if group_size is not None:
            raw = raw - raw.reshape(-1, group_size).mean(axis=1).repeat(group_size)
        raw_stats = masked_stats(jnp.broadcast_to(raw[:, None], mask.shape), mask, "raw")
        metrics = masked_stats(token_adv, mask, f"{prefix}/advantages")
        metrics[f"{prefix}/raw_mean"] = raw_stats["raw/mean"]
        metrics[f"{prefix}/raw_std"] = raw_stats["raw/std"]
        return batch.replace(advantages=token_adv), metrics

    reads = {keys.REWARDS, keys.COMPLETION_MASK} | ({keys.GROUP_ID} if group_size else set())
    return stateless(fn, reads, {keys.ADVANTAGES})
