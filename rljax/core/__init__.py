"""Core contract: the Batch pytree, transforms, objectives and loss aggregation."""

from rljax.core.aggregation import (
    AGGREGATION_MODES,
    aggregate,
    aggregation_denominator,
    check_aggregation_mode,
    masked_mean,
    safe_div,
)
from rljax.core.batch import (
    Batch,
    check_groups,
    check_sequence_rewards,
    equal_reward_fraction,
    make_batch,
)
from rljax.core.keys import (
    KEYS,
    KeyInfo,
    algorithm_reads,
    check_algorithm,
    declare_objective,
    extra,
    register_key,
)
from rljax.core.objective import Objective, sum_objectives
from rljax.core.state import TrainState, init_train_state
from rljax.core.transform import (
    Context,
    Metrics,
    State,
    Transform,
    chain,
    declare,
    merge_metrics,
    stateless,
)

__all__ = [
    "AGGREGATION_MODES",
    "Batch",
    "KEYS",
    "KeyInfo",
    "Context",
    "Metrics",
    "Objective",
    "State",
    "Transform",
    "TrainState",
    "aggregate",
    "algorithm_reads",
    "check_algorithm",
    "declare",
    "declare_objective",
    "extra",
    "register_key",
    "aggregation_denominator",
    "chain",
    "check_aggregation_mode",
    "check_groups",
    "check_sequence_rewards",
    "equal_reward_fraction",
    "init_train_state",
    "make_batch",
    "masked_mean",
    "merge_metrics",
    "safe_div",
    "stateless",
    "sum_objectives",
]
