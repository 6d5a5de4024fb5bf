"""The critic's clipped value loss (PPO), a loss over the new values instead of log-probs."""

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.transform import Metrics

# (new_values [B, T], batch) -> (scalar loss, metrics).
ValueLoss = Callable[[jax.Array, Batch], tuple[jax.Array, Metrics]]


def clipped_value_loss(
    coef: float = 0.5,
    clip: float | None = 0.2,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> ValueLoss:
    """coef * 1/2 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), aggregated.

    The targets R are `batch.extras["returns"]` and V_old `batch.extras["old_values"]`, both
    written by `rljax.advantages.gae.gae_advantages`. Clipping the new value to within c of the
    old one is PPO's value clipping (as in the OpenAI baselines PPO2 implementation); `clip=None`
    gives the plain squared error. The clipped value is V itself inside the band (clipping V
    into [V_old - c, V_old + c], not V_old + clip(V - V_old), which rounds away from V in
    float32), so a token counts as clipped only when clipping changes its error. Aggregated
    with `batch.loss_weights` in the algorithm's mode.

    Args:
      coef: value loss coefficient (> 0).
      clip: value clip range c (> 0), or None.
      aggregation: loss aggregation mode (the algorithm's, so micro-batches weigh exactly).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      A `ValueLoss`. Metrics: "value/loss", "value/clip_frac" (fraction of valid tokens where
      the clipped error is the larger, i.e. V left the band away from R), "value/error"
      (token mean of |V - R|).
    """
    if coef <= 0:
        raise ValueError(f"value loss coef={coef} must be > 0")
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip={clip} must be > 0, or None for no clipping")
    check_aggregation_mode(aggregation, max_len)

    def loss(new_values: jax.Array, batch: Batch):
        for key in ("returns", "old_values"):
            if key not in batch.extras:
                raise ValueError(
                    f"clipped_value_loss needs batch.extras[{key!r}]; put "
                    "rljax.advantages.gae.gae_advantages in the algorithm's transform chain"
                )
        returns, old_values = batch.extras["returns"], batch.extras["old_values"]
        chex.assert_equal_shape([new_values, returns, old_values, batch.completion_mask])
        err = (new_values - returns) ** 2
        valid = batch.completion_mask.astype(jnp.float32)
        metrics = {"value/error": aggregate(jnp.abs(new_values - returns), valid, "token-mean")}
        if clip is not None:
            clipped = jnp.clip(new_values, old_values - clip, old_values + clip)
            err_clipped = (clipped - returns) ** 2
            metrics["value/clip_frac"] = aggregate(
                (err_clipped > err).astype(jnp.float32), valid, "token-mean"
            )
            err = jnp.maximum(err, err_clipped)
        value_loss = coef * 0.5 * aggregate(err, batch.loss_weights, aggregation, max_len)
        metrics["value/loss"] = value_loss
        return value_loss, metrics

    return loss
