"""`Transform`: the unit of composition over `Batch`, like optax.GradientTransformation."""

import dataclasses
from typing import Any, Callable, NamedTuple

import chex
import jax

from rljax.core.batch import Batch

State = Any  # An arbitrary pytree: the transform's own running state.
Metrics = dict[str, jax.Array]


@chex.dataclass
class Context:
    """What a transform may read besides the batch and its own state.

    Attributes:
      step: int32 scalar, the training step.
      rng: a PRNG key for stochastic transforms.
      extras: dict of anything else the driver passes (e.g. total steps).
    """

    step: jax.Array
    rng: jax.Array
    extras: dict = dataclasses.field(default_factory=dict)


class Transform(NamedTuple):
    """A pure batch transform with explicit state.

    Attributes:
      init: `() -> state`, the initial state pytree.
      apply: `(batch, state, ctx) -> (batch, state, metrics)`.
    """

    init: Callable[[], State]
    apply: Callable[[Batch, State, Context], tuple[Batch, State, Metrics]]


def merge_metrics(*metrics: Metrics) -> Metrics:
    """Merges metric dicts, refusing to overwrite a key.

    Args:
      *metrics: metric dicts.

    Returns:
      One dict with all keys.

    Raises:
      ValueError: if two dicts share a key (it would silently hide one value).
    """
    merged: Metrics = {}
    for i, m in enumerate(metrics):
        clash = sorted(merged.keys() & m.keys())
        if clash:
            raise ValueError(
                f"metric keys {clash} of member {i} are already reported by an earlier member; "
                "give each member's metrics distinct names"
            )
        merged.update(m)
    return merged


def chain(*transforms: Transform) -> Transform:
    """Applies transforms in order, threading the batch through them.

    The state is the tuple of the members' states. Member i sees the context
    with `rng = jax.random.fold_in(ctx.rng, i)`, so two stochastic members never
    share randomness. Metrics are merged by `merge_metrics`: a key reported by
    two members raises a ValueError at trace time.

    Args:
      *transforms: the transforms to apply, first to last.

    Returns:
      A `Transform`.
    """

    def init() -> tuple[State, ...]:
        return tuple(t.init() for t in transforms)

    def apply(batch: Batch, state: tuple[State, ...], ctx: Context):
        if len(state) != len(transforms):
            raise ValueError(
                f"chain of {len(transforms)} transforms got a state of {len(state)} members; "
                "build the state with this chain's init()"
            )
        new_state, all_metrics = [], []
        for i, (t, s) in enumerate(zip(transforms, state)):
            batch, s, m = t.apply(batch, s, ctx.replace(rng=jax.random.fold_in(ctx.rng, i)))
            new_state.append(s)
            all_metrics.append(m)
        return batch, tuple(new_state), merge_metrics(*all_metrics)

    return Transform(init, apply)


def stateless(fn: Callable[[Batch, Context], tuple[Batch, Metrics]]) -> Transform:
    """Builds a `Transform` with empty state from `(batch, ctx) -> (batch, metrics)`.

    Args:
      fn: a pure function of the batch and context.

    Returns:
      A `Transform` whose state is `()`.
    """

    def apply(batch: Batch, state: tuple, ctx: Context):
        batch, metrics = fn(batch, ctx)
        return batch, state, metrics

    return Transform(lambda: (), apply)
