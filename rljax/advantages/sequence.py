"""From a per-sequence advantage function to a transform: the body every such estimator shares."""

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.batch import Batch, check_groups, check_sequence_rewards, equal_reward_fraction
from rljax.core.transform import Context, Metrics, Transform, stateless

# (rewards [B], batch) -> advantages [B], or (advantages [B], extra metrics).
SequenceAdvantageFn = Callable[[jax.Array, Batch], jax.Array | tuple[jax.Array, Metrics]]


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


def sequence_advantages(
    name: str,
    fn: SequenceAdvantageFn,
    group_size: int | None = None,
    prefix: str = "",
    zero_std: bool = True,
    reads: Iterable[str] = (),
    optional_reads: Iterable[str] = (),
    sequence_rewards: bool = True,
) -> Transform:
    """Transform writing `batch.advantages = fn(rewards, batch)[:, None] * completion_mask`.

    The shared body of the per-sequence estimators (GRPO, RLOO, OPO, pass@k, ReMax, ...):
    check that rewards are [B] and that `batch.group_id` is contiguous groups of G, compute
    the [B] advantages, broadcast them over the valid completion tokens, and report their
    statistics. `fn` holds only the estimator's maths (and checks of the extras it reads).

    Args:
      name: the transform's name in error messages (e.g. "group_advantages").
      fn: `(rewards [B], batch) -> advantages [B]`, or `(advantages, metrics)` to add
        estimator-specific metrics (reported after the advantage statistics).
      group_size: G, checked against `batch.group_id` when given; None for estimators that
        need no groups.
      prefix: metric prefix: "<prefix>/advantages/{mean,std,min,max}" and
        "<prefix>/zero_std_frac"; "" gives "advantages/{mean,...}" and
        "advantages/zero_std_frac".
      zero_std: report the fraction of groups whose rewards are all equal (needs group_size).
      reads: keys `fn` reads besides rewards, group ids and the completion mask.
      optional_reads: keys `fn` uses when present.
      sequence_rewards: check that rewards are [B] (False for estimators that do not use
        them, e.g. advantages chosen on the host).

    Returns:
      A stateless `Transform` reading rewards (and group ids with a group size), the
      completion mask and `reads`, writing `advantages`. Metrics: the advantage statistics
      over valid (completion_mask) tokens, fn's metrics, then the zero-std fraction.

    Raises:
      ValueError: at apply if rewards are not [B] or the groups are not contiguous groups of
        G (see `check_groups`).
    """
    stats_prefix = f"{prefix}/advantages" if prefix else "advantages"
    zero_key = f"{stats_prefix if not prefix else prefix}/zero_std_frac"
    if zero_std and group_size is None:
        raise ValueError(f"{name}: zero_std=True needs a group_size")

    def apply(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        if sequence_rewards:
            check_sequence_rewards(batch.rewards, name)
        if group_size is not None:
            check_groups(batch.group_id, group_size)
        out = fn(batch.rewards, batch)
        adv, extra_metrics = out if isinstance(out, tuple) else (out, {})
        mask = batch.completion_mask
        token_adv = adv[:, None] * mask.astype(adv.dtype)
        metrics = masked_stats(token_adv, mask, stats_prefix)
        metrics.update(extra_metrics)
        if zero_std:
            metrics[zero_key] = equal_reward_fraction(batch.rewards, group_size)
        return batch.replace(advantages=token_adv), metrics

    apply.key_name = name
    needed = {keys.COMPLETION_MASK, *reads}
    if sequence_rewards or zero_std:
        needed.add(keys.REWARDS)
    if group_size is not None:
        needed.add(keys.GROUP_ID)
    return stateless(apply, needed, {keys.ADVANTAGES}, optional_reads)
