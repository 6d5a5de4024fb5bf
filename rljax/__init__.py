"""rljax: reinforcement-learning post-training of language models, as composable JAX transforms.

An algorithm is a chain of pure transforms over a `Batch` plus an objective
(`rljax.algorithms.grpo`), trained by jitted rollout / prepare / update steps over one
`TrainState` pytree (`rljax.train`).
"""

from rljax import algorithms
from rljax.core import (
    Batch,
    Context,
    Objective,
    TrainState,
    Transform,
    aggregate,
    chain,
    init_train_state,
    make_batch,
    stateless,
    sum_objectives,
)

__version__ = "0.1.0"

__all__ = [
    "algorithms",
    "Batch",
    "Context",
    "Objective",
    "Transform",
    "TrainState",
    "aggregate",
    "chain",
    "init_train_state",
    "make_batch",
    "stateless",
    "sum_objectives",
]
