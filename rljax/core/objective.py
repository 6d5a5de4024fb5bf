"""`Objective`: a loss over the new policy's log-probs and entropies, and how objectives add."""

from typing import Callable

import jax

from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.transform import Metrics, merge_metrics

# (new_logprobs [B, T], new_entropy [B, T], batch) -> (scalar loss, metrics).
Objective = Callable[[jax.Array, jax.Array, Batch], tuple[jax.Array, Metrics]]


def sum_objectives(*objectives: Objective) -> Objective:
    """Adds objectives: the loss is the sum, the metrics are merged.

    Args:
      *objectives: objectives to add (e.g. surrogate, KL loss, entropy bonus). The sum
        reads what its members read (`rljax.core.keys.declare_objective`).

    Returns:
      An `Objective`. Metric keys reported by two members raise a ValueError
      (see `merge_metrics`).
    """
    if not objectives:
        raise ValueError("sum_objectives needs at least one objective")

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        losses, metrics = zip(*(o(new_logprobs, new_entropy, batch) for o in objectives))
        return sum(losses[1:], losses[0]), merge_metrics(*metrics)

    # The declared reads are the members' (`rljax.core.keys.objective_steps`); undeclared
    # when any member is.
    objective.members = objectives
    member_reads = [getattr(o, "reads", None) for o in objectives]
    if all(r is not None for r in member_reads):
        optional = [getattr(o, "optional_reads", frozenset()) for o in objectives]
        declare_objective(objective, frozenset().union(*member_reads), frozenset().union(*optional))
    return objective
