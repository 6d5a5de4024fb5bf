"""rljax: reinforcement-learning post-training of language models, as composable JAX transforms.

An algorithm is a chain of pure transforms over a `Batch` plus an objective
(`rljax.algorithms.grpo`), trained by jitted rollout / prepare / update steps over one
`TrainState` pytree (`rljax.train`).

The names below load on first use, so importing a light module (the `rljax` console script,
`rljax.launch.huge_pages`) does not import JAX: a launcher restarts itself with glibc tunables
before JAX is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_CORE = (
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
)

__all__ = ["algorithms", *_CORE]


def __getattr__(name: str) -> Any:
    if name == "algorithms":
        return importlib.import_module("rljax.algorithms")
    if name in _CORE:
        return getattr(importlib.import_module("rljax.core"), name)
    raise AttributeError(f"module 'rljax' has no attribute {name!r}")
