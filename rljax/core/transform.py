"""`Transform`: the unit of composition over `Batch`, like optax.GradientTransformation."""

import dataclasses
from collections.abc import Iterable
from typing import Any, Callable, NamedTuple

import chex
import jax

from rljax.core.batch import Batch
from rljax.core.keys import describe, keyset

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
    """A pure batch transform with explicit state and declared batch keys.

    Keys are `Batch` field names or "extras.<name>" (`rljax.core.keys`). A transform built as
    `Transform(init, apply)` is undeclared (reads/writes None): the algorithm checks skip it.

    Attributes:
      init: `() -> state`, the initial state pytree.
      apply: `(batch, state, ctx) -> (batch, state, metrics)`.
      reads: keys it needs (None: undeclared).
      writes: keys it writes (None: undeclared).
      optional_reads: keys it uses when present.
    """

    init: Callable[[], State]
    apply: Callable[[Batch, State, Context], tuple[Batch, State, Metrics]]
    reads: frozenset[str] | None = None
    writes: frozenset[str] | None = None
    optional_reads: frozenset[str] = frozenset()


def declare(
    transform: Transform,
    reads: Iterable[str],
    writes: Iterable[str],
    optional_reads: Iterable[str] = (),
) -> Transform:
    """`transform` with declared reads, writes and optional reads (iterables of keys)."""
    return transform._replace(
        reads=keyset(reads), writes=keyset(writes), optional_reads=keyset(optional_reads)
    )


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


def declare_wrapper(
    transform: Transform,
    inner: Transform,
    reads: Iterable[str],
    writes: Iterable[str],
    optional_reads: Iterable[str] = (),
) -> Transform:
    """Declares `transform`, which runs `inner` and then reads `reads` and writes `writes`.

    The declaration is `chain(inner, <the rest>)`'s; undeclared when `inner` is.
    """
    if inner.reads is None or inner.writes is None:
        return transform
    reads, writes = keyset(reads), keyset(writes)
    optional = keyset(optional_reads)
    return declare(
        transform,
        inner.reads | (reads - inner.writes),
        inner.writes | writes,
        inner.optional_reads | (optional - inner.writes),
    )


def chain(*transforms: Transform) -> Transform:
    """Applies transforms in order, threading the batch through them.

    The state is the tuple of the members' states. Member i sees the context
    with `rng = jax.random.fold_in(ctx.rng, i)`, so two stochastic members never
    share randomness. Metrics are merged by `merge_metrics`: a key reported by
    two members raises a ValueError at trace time.

    The declarations are the union in order: the chain reads what a member reads and no
    earlier member writes, and writes what any member writes. A chain with an undeclared
    member is undeclared (the checks still see each declared member, see `rljax.core.keys`).

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

    apply.members = transforms
    if any(t.reads is None or t.writes is None for t in transforms):
        return Transform(init, apply)
    reads, writes, optional = set(), set(), set()
    for t in transforms:
        reads |= t.reads - writes
        optional |= t.optional_reads - writes
        writes |= t.writes
    return Transform(init, apply, frozenset(reads), frozenset(writes), frozenset(optional))


def stateless(
    fn: Callable[[Batch, Context], tuple[Batch, Metrics]],
    reads: Iterable[str] | None = None,
    writes: Iterable[str] | None = None,
    optional_reads: Iterable[str] = (),
) -> Transform:
    """Builds a `Transform` with empty state from `(batch, ctx) -> (batch, metrics)`.

    Args:
      fn: a pure function of the batch and context.
      reads: the keys `fn` needs (None: undeclared).
      writes: the keys `fn` writes (None: undeclared).
      optional_reads: the keys `fn` uses when present.

    Returns:
      A `Transform` whose state is `()`.
    """

    def apply(batch: Batch, state: tuple, ctx: Context):
        batch, metrics = fn(batch, ctx)
        return batch, state, metrics

    apply.key_name = describe(fn)
    return Transform(
        lambda: (), apply, keyset(reads), keyset(writes), keyset(optional_reads) or frozenset()
    )
