"""Multi-turn episodes on the rollout engine: a sequence continues across turns in its slot.

A policy turn ends as any engine sequence does (an EOS id, the stop rule or the token budget).
The engine then hands the turn's tokens to a `TurnHandler` (the environment side, e.g.
`rljax.envs.episodes`) and keeps decoding the other slots while the handler steps its
environment. When the handler has the observation's tokens, the engine appends them to the
same slot: one prefill-like device call over the slots that have an observation writes them
into those slots' KV after the turn (no re-prefill of the conversation), and the slot samples
the next turn from there. The handler ends an episode by answering None (done, failed, out of
turns or out of budget).

The output row holds the whole episode after the prompt: turn 0, observation, turn 1, ...
`completion_mask` marks the policy's tokens (the trainer's losses and statistics read only
those), `env_mask` the observations' (context the trainer attends to). The token budget
(`max_new_tokens`) covers both. Sampling keys fold in the token's column, so a sequence samples
the same tokens whatever slot, order or timing its turns run in.
"""

from __future__ import annotations

import functools
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.rollout.engine import Engine, WeightSwap, _Outputs, _Run, _Slots
from rljax.rollout.sampler import Rollout

_MIN_OBSERVATION_BUCKET = 8


class TurnHandler(Protocol):
    """The environment side of multi-turn rollouts, addressed by output row.

    `overlap` chooses how the engine waits for observations. False (deterministic rounds):
    after each decode call the engine waits for every step it handed out, so the schedule and
    hence every float of the rollout depend only on the episodes, never on thread timing
    (bit-identical reruns and exact resume). True: the engine appends each observation as soon
    as it is ready and decodes the other rows meanwhile (faster with slow environments such
    as code execution; the same tokens, with log-probs equal up to float rounding, since the
    device calls group rows differently).
    """

    overlap: bool

    def end_turn(self, row: int, tokens: np.ndarray, room: int) -> None:
        """Row `row`'s policy turn ended with `tokens` (through its EOS when it ended by one);
        `room` columns of the row's budget are left. Starts the environment's step; it may
        run in the background while the engine decodes other rows."""
        ...

    def observations(self, wait: bool) -> dict[int, np.ndarray | None]:
        """Rows whose step finished since the last call -> the observation's tokens to append
        (at least 1 and fewer than the row's room, so the policy has a column to answer in),
        or None: the episode is over. With `wait`, blocks until at least one is ready."""
        ...


@functools.partial(
    jax.jit, static_argnames=("graphdef", "span"), donate_argnames=("slots", "outputs")
)
def _extend(
    graphdef,
    params,
    slots: _Slots,
    outputs: _Outputs,
    slot_ids,
    tokens,
    lengths,
    version,
    *,
    span: int,
) -> tuple[_Slots, _Outputs]:
    """Appends the first `lengths` [M] of `tokens` [M, O] to the sequences of slots `slot_ids`
    [M] (KV and output row, as environment tokens) and resumes them; out-of-range slot ids
    (padding) are dropped. Only those slots' KV is read and written; attention reads its first
    `span` cache slots."""
    model = nnx.merge(graphdef, params)
    n_slots = slots.live.shape[0]
    m, width = tokens.shape
    n_rows, columns = outputs.tokens.shape
    real = slot_ids < n_slots
    ids = jnp.minimum(slot_ids, n_slots - 1)  # padding reads the last slot, writes nowhere
    cache = slots.cache
    sub = cache.replace(
        keys=cache.keys[:, ids],
        values=cache.values[:, ids],
        valid=cache.valid[ids],
        positions=cache.positions[ids],
        index=cache.index[ids],
    )
    j = jnp.arange(width)
    fed = (j < lengths[:, None]) & real[:, None]
    hidden, sub, routes = model.hidden_states(
        tokens, sub.index[:, None] + j, fed, sub, return_routes=True, cache_span=span
    )
    last = hidden[jnp.arange(m), jnp.maximum(lengths - 1, 0)]
    put = lambda array, value: array.at[slot_ids].set(value, mode="drop")  # noqa: E731
    cache = cache.replace(
        keys=cache.keys.at[:, slot_ids].set(sub.keys, mode="drop"),
        values=cache.values.at[:, slot_ids].set(sub.values, mode="drop"),
        valid=put(cache.valid, sub.valid),
        positions=put(cache.positions, sub.positions),
        index=put(cache.index, cache.index[ids] + lengths),
    )
    t = slots.t[ids]
    row = jnp.where(real, slots.row[ids], n_rows)[:, None]
    col = jnp.where(fed, t[:, None] + j, columns)  # padding writes nowhere
    outputs = outputs.replace(
        tokens=outputs.tokens.at[row, col].set(tokens, mode="drop"),
        env=outputs.env.at[row, col].set(True, mode="drop"),
    )
    if routes is not None:
        prompt_width = outputs.routes.shape[1] - columns
        pos = jnp.where(fed, prompt_width + col, prompt_width + columns)
        outputs = outputs.replace(routes=outputs.routes.at[row, pos].set(routes, mode="drop"))
    slots = slots.replace(
        cache=cache,
        logits=put(slots.logits, model.logits(last)),
        version=put(slots.version, version),
        t=put(slots.t, t + lengths),
        live=put(slots.live, True),
    )
    return slots, outputs


class _TurnRun(_Run):
    """An engine run whose sequences are multi-turn episodes driven by a `TurnHandler`."""

    PER_SLOT = (*_Run.PER_SLOT, "waiting")

    def __init__(
        self,
        engine: Engine,
        params,
        *prompts,
        rng,
        n_samples,
        handler: TurnHandler,
        version: int = 0,
        swap: WeightSwap | None = None,
    ):
        super().__init__(engine, params, *prompts, rng, n_samples, version, swap)
        self.handler = handler
        self.waiting = np.zeros(self.n_slots, bool)  # slots whose row waits on its environment
        n = len(self.prompt_tokens) * n_samples
        self.turn_start = np.zeros(n, np.int64)  # column where each row's current turn starts

    def _free_slots(self) -> np.ndarray:
        return np.flatnonzero(~self.live & ~self.waiting)

    def _busy(self) -> np.ndarray:
        return self.live | self.waiting

    def _wake(self) -> int:
        if self.queue or self.waiting.any():  # come back soon to admit or resume
            step = self.engine.config.admit_after or max(1, self.n_slots // 8)
            return int((~self.live).sum()) + step
        return self.n_slots + 1

    def _turn_start(self, row: int) -> int:
        return int(self.turn_start[row])

    def _after_decode(self, was_live: np.ndarray) -> None:
        """Hands every turn that just ended to the handler."""
        ended = np.flatnonzero(was_live & ~self.live)
        if not ended.size:
            return
        t, limit, tokens = jax.device_get((self.slots.t, self.slots.limit, self.outputs.tokens))
        for slot in ended:
            row = int(self.slot_row[slot])
            turn = np.asarray(tokens[row, self.turn_start[row] : t[slot]])
            self.waiting[slot] = True
            self.handler.end_turn(row, turn, int(limit[slot] - t[slot]))

    def _between_calls(self) -> None:
        """Appends the observations that are ready and resumes their slots; frees the slots
        of finished episodes. Blocks for one when no slot could decode, or for all of them
        in deterministic rounds (`TurnHandler.overlap` False)."""
        if not self.waiting.any():
            return
        if self.handler.overlap:
            ready = self.handler.observations(wait=not self.live.any())
        else:  # a deterministic round: every step handed out so far
            ready = {}
            while len(ready) < self.waiting.sum():
                ready.update(self.handler.observations(wait=True))
        if not ready:
            return
        t, limit = (np.asarray(a) for a in jax.device_get((self.slots.t, self.slots.limit)))
        resume: dict[int, np.ndarray] = {}
        for row, observation in ready.items():
            slots = np.flatnonzero(self.waiting & (self.slot_row == row))
            if slots.size != 1:
                raise ValueError(f"turn handler answered row {row}, which awaits no observation")
            slot = int(slots[0])
            self.waiting[slot] = False
            if observation is None:
                continue
            observation = np.asarray(observation, np.int32)
            room = int(limit[slot] - t[slot])
            if observation.ndim != 1 or not 0 < observation.size < room:
                raise ValueError(
                    f"turn handler gave row {row} an observation of shape {observation.shape}; "
                    f"it needs 1 to {room - 1} tokens (the row has {room} columns left)"
                )
            resume[slot] = observation
            self.turn_start[row] = t[slot] + observation.size
        if resume:
            self._append(resume)

    def _append(self, observations: dict[int, np.ndarray]) -> None:
        """One device call appending `observations` (slot -> tokens) to their slots; the
        count of slots and the observation width are bucketed to powers of two (one
        compilation per bucket)."""
        size = self.live.size  # the tail may have shrunk below n_slots
        count = min(size, 1 << (len(observations) - 1).bit_length())
        longest = max(o.size for o in observations.values())
        width = max(_MIN_OBSERVATION_BUCKET, 1 << (longest - 1).bit_length())
        slot_ids = np.full(count, size, np.int32)
        tokens = np.zeros((count, width), np.int32)
        lengths = np.zeros(count, np.int32)
        for i, (slot, observation) in enumerate(observations.items()):
            slot_ids[i], lengths[i] = slot, observation.size
            tokens[i, : observation.size] = observation
        span = self.capacity
        bucket = self.engine.config.span_bucket
        if bucket:
            need = int(self.index[list(observations)].max()) + width
            span = min(self.capacity, -(-need // bucket) * bucket)
        self.slots, self.outputs = _extend(
            self.engine.graphdef,
            self.params,
            self.slots,
            self.outputs,
            jnp.asarray(slot_ids),
            jnp.asarray(tokens),
            jnp.asarray(lengths),
            jnp.int32(self.version),
            span=span,
        )
        live, index = jax.device_get((self.slots.live, self.slots.cache.index))
        self.live, self.index = np.array(live), np.array(index)

    def _rollout(self) -> Rollout:
        return super()._rollout().replace(env_mask=self.outputs.env)


def generate_turns(
    engine: Engine,
    params: nnx.State,
    prompt_tokens,
    prompt_mask,
    rng: jax.Array,
    handler: TurnHandler,
    *,
    n_samples: int = 1,
    max_new_tokens=None,
    version: int = 0,
    swap: WeightSwap | None = None,
) -> Rollout:
    """Multi-turn episodes by `engine`: as `Engine.generate` (same arguments, rows, keys,
    budgets and in-flight weight updates), with each row continued across turns by `handler`;
    the `Rollout` carries `env_mask`. Row i * n_samples + g answers prompt i."""
    prompts = engine.check_prompts(prompt_tokens, prompt_mask, n_samples, max_new_tokens)
    run = _TurnRun(
        engine,
        params,
        *prompts,
        rng=rng,
        n_samples=n_samples,
        handler=handler,
        version=version,
        swap=swap,
    )
    return run.drain()
