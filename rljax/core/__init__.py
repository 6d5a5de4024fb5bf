"""Core contract: the Batch pytree, transforms, objectives and loss aggregation."""

from rljax.core.aggregation import AGGREGATION_MODES, aggregate, check_aggregation_mode
from rljax.core.batch import Batch, check_groups, make_batch
from rljax.core.objective import Objective, sum_objectives
from rljax.core.transform import Context, Metrics, State, Transform, chain, merge_metrics, stateless

__all__ = [
    "AGGREGATION_MODES",
    "Batch",
    "Context",
    "Metrics",
    "Objective",
    "State",
    "Transform",
    "aggregate",
    "chain",
    "check_aggregation_mode",
    "check_groups",
    "make_batch",
    "merge_metrics",
    "stateless",
    "sum_objectives",
]
