"""Sequence packing for the trainer's forward passes: fewer, fuller rows.

A batch row holds a left-padded prompt and a right-padded completion; with completions of
varied length much of every row is padding, and the trainer's forward and backward passes
(the update's cost) run over it all. Packing moves the real tokens of several rows into one row
of the same length, one after the other, keeps each sequence's own RoPE positions, and lets a
token attend only within its sequence (segment ids), so every hidden state is the one the
unpacked pass computes; the states are then gathered back to the [B, S] layout, so log-probs,
objectives and aggregation are unchanged.

The plan is first-fit in row order, computed inside the jitted step (shapes stay static): a
sequence goes into the first packed row with room for it. When the batch does not fit into the
`rows` packed rows, the step takes the unpacked pass instead (`lax.cond`), so packing never
changes results, only cost.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class PackPlan(NamedTuple):
    """Where each row's real tokens go: [B] packed row and offset, and whether all fit."""

    row: jax.Array
    offset: jax.Array
    fits: jax.Array


def pack_plan(mask: jax.Array, rows: int) -> PackPlan:
    """First-fit plan for the sequences of `mask` [B, S] (real tokens of a row contiguous from
    its first to its last True) into `rows` rows of length S: in row order, each sequence goes
    into the first packed row with room for it."""
    s = mask.shape[1]
    any_valid = mask.any(axis=1)
    start = jnp.where(any_valid, jnp.argmax(mask, axis=1), 0)
    end = jnp.where(any_valid, s - jnp.argmax(mask[:, ::-1], axis=1), 0)

    def place(used, n):
        room = used + n <= s
        row = jnp.where(room.any(), jnp.argmax(room), rows)  # `rows`: it does not fit
        offset = used[jnp.minimum(row, rows - 1)]
        used = jnp.where(room.any(), used.at[row].add(n), used)
        return used, (row, offset)

    _, (row, offset) = jax.lax.scan(place, jnp.zeros(rows, jnp.int32), end - start)
    return PackPlan(row, offset - start, (row < rows).all())


def packed_hidden_states(model, tokens, positions, mask, rows: int) -> jax.Array:
    """`model.hidden_states(tokens, positions, mask)` [B, S, D], computed on `rows` packed rows
    when the sequences fit (else unpacked; identical either way up to float rounding)."""
    b, s = tokens.shape
    plan = pack_plan(mask, rows)

    def packed(_):
        # Destination slot of every position from a row's first to its last real token (a
        # masked token inside moves too, still masked); padding outside goes to one spare slot
        # past the end.
        span = (mask.cumsum(1) > 0) & (jnp.flip(jnp.flip(mask, 1).cumsum(1), 1) > 0)
        dest = plan.row[:, None] * s + plan.offset[:, None] + jnp.arange(s)[None, :]
        dest = jnp.where(span, dest, rows * s)
        put = lambda x, fill: jnp.full((rows * s + 1,), fill, x.dtype).at[dest].set(x)[:-1]
        segment = jnp.broadcast_to(jnp.arange(1, b + 1)[:, None], (b, s))
        hidden, _ = model.hidden_states(
            put(tokens, 0).reshape(rows, s),
            put(positions, 0).reshape(rows, s),
            put(mask, False).reshape(rows, s),
            segment_ids=put(jnp.where(span, segment, 0), 0).reshape(rows, s),
        )
        flat = hidden.reshape(rows * s, -1)
        return flat[jnp.minimum(dest, rows * s - 1)].reshape(b, s, -1)

    def unpacked(_):
        return model.hidden_states(tokens, positions, mask)[0]

    return jax.lax.cond(plan.fits, packed, unpacked, None)
