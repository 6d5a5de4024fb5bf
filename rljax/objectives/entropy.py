"""Entropy bonus: a loss term that rewards a high-entropy policy."""

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective


def entropy_bonus(
    coef: float,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """Entropy bonus, loss = -coef * aggregate(new_entropy, batch.loss_weights).

    The entropy regulariser of A3C and PPO (Mnih et al. 2016, arXiv 1602.01783;
    Schulman et al. 2017, arXiv 1707.06347); coef > 0 raises entropy.

    Args:
      coef: bonus coefficient.
      aggregation: loss aggregation mode.
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective` of `new_entropy` [B, T]. Metrics: "entropy/loss" and
      "entropy/mean" (token mean over valid tokens).
    """
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_logprobs
        loss = -coef * aggregate(new_entropy, batch.loss_weights, aggregation, max_len)
        mean = aggregate(new_entropy, batch.completion_mask.astype(jnp.float32), "token-mean")
        return loss, {"entropy/loss": loss, "entropy/mean": mean}

    return declare_objective(objective, {keys.LOSS_WEIGHTS, keys.COMPLETION_MASK})
