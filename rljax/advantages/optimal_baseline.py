"""OPO's optimal reward baseline: a length-weighted group mean."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.sequence import sequence_advantages
from rljax.core.batch import Batch
from rljax.core.transform import Metrics, Transform


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: the optimal baseline is a mean over the samples of a "
            "prompt and needs at least 2 of them (with 1, r - b is always 0); sample G >= 2 "
            "completions per prompt"
        )


def opo_advantages(rewards: jax.Array, lengths: jax.Array, group_size: int) -> jax.Array:
    """Sequence advantages against the length-weighted group mean reward.

    b_g = sum_i L_i r_i / sum_i L_i over the G samples of group g, A_i = r_i - b_g,
    with L_i the number of valid completion tokens of sample i ("On-Policy RL with
    Optimal Reward Baseline", Hao et al. 2025). It is the variance-minimising
    baseline when the squared norm of a sequence's log-prob gradient grows in
    proportion to its length. No std normalisation. A group whose rewards are all
    equal, or whose lengths are all 0, gets exactly 0.

    Args:
      rewards: [B] sequence rewards, laid out as B/G contiguous groups.
      lengths: [B] response lengths L_i >= 0 (valid completion tokens).
      group_size: G, samples per prompt (>= 2).

    Returns:
      [B] advantages; sum_i L_i A_i = 0 within each group.

    Raises:
      ValueError: if G < 2, G does not divide B, or (on concrete inputs) a length
        is negative.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, lengths])
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    if not isinstance(lengths, jax.core.Tracer) and np.any(np.asarray(lengths) < 0):
        raise ValueError(
            f"lengths must be >= 0 (valid completion tokens per sample), got {np.asarray(lengths)}"
        )
    r = rewards.reshape(b // group_size, group_size)
    w = lengths.astype(r.dtype).reshape(b // group_size, group_size)
    total = w.sum(axis=1, keepdims=True)
    baseline = (w * r).sum(axis=1, keepdims=True) / jnp.where(total > 0, total, 1.0)
    degenerate = jnp.all(r == r[:, :1], axis=1, keepdims=True) | (total <= 0)
    return jnp.where(degenerate, 0.0, r - baseline).reshape(b)


def length_weighted_baseline_advantages(group_size: int) -> Transform:
    """Transform writing `batch.advantages = opo_advantages(r, L)[:, None] * completion_mask`.

    OPO ("On-Policy RL with Optimal Reward Baseline", Hao et al. 2025) with
    L_i = sum_t completion_mask[i, t].

    Args:
      group_size: G, samples per prompt (>= 2).

    Returns:
      A stateless `Transform`. Metrics: "opo/advantages/{mean,std,min,max}" over
      valid (completion_mask) tokens, "opo/baseline_mean" (mean over groups of
      b_g, 0 for groups with no valid token) and "opo/zero_std_frac" (fraction
      of groups whose rewards are all equal).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(rewards: jax.Array, batch: Batch) -> tuple[jax.Array, Metrics]:
        lengths = batch.completion_mask.sum(axis=1)
        adv = opo_advantages(rewards, lengths, group_size)
        groups = rewards.reshape(-1, group_size)
        w = lengths.astype(jnp.float32).reshape(-1, group_size)
        total = w.sum(axis=1)
        baseline = jnp.where(total > 0, (w * groups).sum(axis=1) / jnp.maximum(total, 1.0), 0.0)
        return adv, {"opo/baseline_mean": baseline.mean()}

    name = "length_weighted_baseline_advantages"
    return sequence_advantages(name, fn, group_size, prefix="opo")
