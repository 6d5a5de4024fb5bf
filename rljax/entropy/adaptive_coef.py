"""An entropy bonus whose coefficient adapts to keep the policy's entropy near a target.

A fixed entropy coefficient is either too weak to stop the entropy from collapsing or strong
enough to blow it up later. Skywork-OR1's adaptive entropy control ("Skywork Open Reasoner 1
Technical Report", He et al. 2025, arXiv 2505.22312) steers the coefficient instead: it grows
while the batch entropy is below a target and shrinks while it is above, and the bonus is
applied only on steps whose entropy is at or below the target, so it never pushes an entropy
that is already high. The update rule below is our reading of the report; its constants are
arguments:

  alpha_k = c_k * [H_k <= target],   c_{k+1} = clip(c_k + step * sign(target - H_k), 0, max),
  c_0 = 0,

with H_k the token-mean entropy of the pre-update policy on step k's batch.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective
from rljax.core.transform import Context, Metrics, Transform, declare
from rljax.entropy.entrocraft import batch_entropy

ENTROPY_COEF = "entropy_coef"


class AdaptiveCoefState(NamedTuple):
    """c_k, the coefficient the next step uses when its entropy is at or below the target."""

    coef: jax.Array


def adaptive_entropy_coef(target: float, step: float = 0.005, max_coef: float = 0.05) -> Transform:
    """The controller: writes this step's alpha_k to `batch.extras["entropy_coef"]` ([B], the
    same value in every row) for `adaptive_entropy_bonus`, and updates c.

    Args:
      target: the target token-mean entropy (nats), > 0.
      step: how much c moves per step, > 0.
      max_coef: the largest c, >= step.

    Returns:
      A `Transform` with an `AdaptiveCoefState` (checkpointed with the run). Metrics:
      "adaptive_entropy/batch_entropy" (H_k), "adaptive_entropy/coef" (alpha_k) and
      "adaptive_entropy/next_coef" (c_{k+1}).

    Raises:
      ValueError: for a non-positive target or step, or max_coef < step.
    """
    if not (target > 0 and step > 0 and max_coef >= step):
        raise ValueError(
            f"target={target} and step={step} must be > 0 and max_coef={max_coef} >= step"
        )

    def init() -> AdaptiveCoefState:
        return AdaptiveCoefState(jnp.zeros((), jnp.float32))

    def apply(batch: Batch, state: AdaptiveCoefState, ctx: Context):
        del ctx
        entropy = batch_entropy(batch)
        alpha = jnp.where(entropy <= target, state.coef, 0.0)
        coef = jnp.clip(state.coef + step * jnp.sign(target - entropy), 0.0, max_coef)
        rows = jnp.full(batch.completion_mask.shape[:1], alpha, jnp.float32)
        batch = batch.replace(extras={**batch.extras, ENTROPY_COEF: rows})
        metrics: Metrics = {
            "adaptive_entropy/batch_entropy": entropy,
            "adaptive_entropy/coef": alpha,
            "adaptive_entropy/next_coef": coef,
        }
        return batch, AdaptiveCoefState(coef), metrics

    return declare(
        Transform(init, apply), {keys.OLD_ENTROPY, keys.COMPLETION_MASK}, {keys.ENTROPY_COEF}
    )


def adaptive_entropy_bonus(
    aggregation: str = "token-mean", max_len: int | None = None
) -> Objective:
    """The entropy bonus at the controller's coefficient: loss = -alpha_k *
    aggregate(new_entropy, batch.loss_weights), alpha_k from `extras["entropy_coef"]`.

    Metrics: "adaptive_entropy/loss".
    """
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_logprobs
        alpha = jax.lax.stop_gradient(batch.extras[ENTROPY_COEF][0])
        loss = -alpha * aggregate(new_entropy, batch.loss_weights, aggregation, max_len)
        return loss, {"adaptive_entropy/loss": loss}

    reads = {keys.ENTROPY_COEF, keys.LOSS_WEIGHTS}
    return declare_objective(objective, reads, name="adaptive_entropy_bonus")
