"""The rollout importance weight that policy-gradient objectives apply to their per-token loss.

Mismatch corrections (`rljax.quant.mismatch`: truncated IS, AIS) write
`batch.extras["is_weight"]` [B, T]; every policy-gradient objective multiplies its per-token
loss by the stop-gradient weight before aggregation, so the gradient estimates
E_mu[w * grad(term)] for samples drawn by the sampler's policy mu instead of the trainer's.
"""

import jax

from rljax.core.batch import Batch


def apply_is_weight(per_token: jax.Array, batch: Batch) -> jax.Array:
    """`per_token * stop_gradient(batch.extras["is_weight"])`, or `per_token` without one.

    Raises:
      ValueError: the weight's shape is not the per-token loss's [B, T].
    """
    is_weight = batch.extras.get("is_weight")
    if is_weight is None:
        return per_token
    if is_weight.shape != per_token.shape:
        raise ValueError(
            f'batch.extras["is_weight"] has shape {is_weight.shape}, expected [B, T] = '
            f"{per_token.shape}"
        )
    return per_token * jax.lax.stop_gradient(is_weight)
