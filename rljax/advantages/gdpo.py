"""GDPO: each reward dimension normalised in its group before the dimensions are summed."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.group import grpo_advantages, masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups
from rljax.core.transform import Context, Metrics, Transform, stateless

# verl's masked_whiten: (x - mean) * rsqrt(var + 1e-8).
_WHITEN_EPS = 1e-8


def gdpo_advantages(
    rewards: jax.Array,
    completion_mask: jax.Array,
    group_size: int,
    weights: jax.Array | None = None,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """GDPO token advantages (Group reward-Decoupled Normalization Policy Optimization, arXiv
    2601.05242).

    Summing K rewards before GRPO's normalisation lets the one with the largest spread drown
    the others. GDPO normalises each dimension k in its group first (`grpo_advantages`,
    unbiased std + eps), sums them with weights w_k, and whitens the sum over every valid
    token of the batch:
      A_i = sum_k w_k (r_ik - mean_g r_k) / (std_g r_k + eps),
      A_bt = (A_b - mu) / sqrt(var + 1e-8)  on valid tokens, 0 elsewhere,
    mu and var the token-weighted mean and unbiased variance (verl's `masked_whiten`). [B]
    rewards are one dimension: GRPO followed by the batch whitening.

    Args:
      rewards: [B] or [B, K] sequence rewards, laid out as B/G contiguous groups.
      completion_mask: [B, T] bool valid tokens.
      group_size: G, samples per prompt (>= 2).
      weights: [K] dimension weights (verl's `gdpo_reward_weights`); None: all 1.
      normalize_std: divide each dimension by its group std (False: only centre it).
      eps: added to each group std.

    Returns:
      [B, T] float32 advantages, 0 on invalid tokens (all 0 when fewer than 2 tokens are
      valid: no variance to whiten by).

    Raises:
      ValueError: as `grpo_advantages`, or for weights that are not one per dimension.
    """
    chex.assert_rank(completion_mask, 2)
    r = rewards.astype(jnp.float32)
    r = r[:, None] if r.ndim == 1 else r
    k = r.shape[1]
    w = jnp.ones((k,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    if w.shape != (k,):
        raise ValueError(f"weights have shape {w.shape}, expected one per dimension: ({k},)")
    summed = (grpo_advantages(r, group_size, normalize_std, True, eps) * w).sum(axis=1)
    mask = completion_mask.astype(bool)
    tokens = jnp.broadcast_to(summed[:, None], mask.shape)
    n = mask.sum().astype(jnp.float32)
    mean = jnp.where(mask, tokens, 0.0).sum() / jnp.maximum(n, 1.0)
    var = jnp.where(mask, (tokens - mean) ** 2, 0.0).sum() / jnp.maximum(n - 1.0, 1.0)
    whitened = (tokens - mean) * jax.lax.rsqrt(var + _WHITEN_EPS)
    return jnp.where(mask & (n >= 2), whitened, 0.0)


def decoupled_group_advantages(
    group_size: int,
    weights: tuple[float, ...] | None = None,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Transform:
    """Transform writing `batch.advantages = gdpo_advantages(batch.rewards, ...)`: GDPO on
    the [B, K] rewards of a task that scores K things (correctness, format, length, ...).

    Returns:
      A stateless `Transform`. Metrics: "gdpo/advantages/{mean,std,min,max}" over valid
      tokens.

    Raises:
      ValueError: at construction for G < 2 or non-finite weights; at apply as
        `gdpo_advantages`, or if `batch.group_id` is not contiguous groups of G.
    """
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: GDPO normalises in groups of >= 2 samples")
    if weights is not None and not np.all(np.isfinite(weights)):
        raise ValueError(f"weights={weights} must be finite")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_groups(batch.group_id, group_size)
        mask = batch.completion_mask
        adv = gdpo_advantages(batch.rewards, mask, group_size, weights, normalize_std, eps)
        return batch.replace(advantages=adv), masked_stats(adv, mask, "gdpo/advantages")

    reads = {keys.REWARDS, keys.COMPLETION_MASK, keys.GROUP_ID}
    return stateless(fn, reads, {keys.ADVANTAGES})
