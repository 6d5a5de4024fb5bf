"""Continuous-batching rollout engine: decode slots, shared prompt prefixes, ragged KV.

The static sampler (`rljax.rollout.sampler.generate`) decodes one fixed batch until its longest
row ends, prefills every prompt once per sample and attends over the whole preallocated cache.
The engine instead keeps a fixed number of decode slots busy:

- Requests are (prompt, sample) pairs in a FIFO queue. A prompt is prefilled once, into a small
  buffer of prefixes; each of its samples copies that KV into a free slot when admitted (shared
  prefixes: G samples cost one prefill).
- A slot holds one sequence from slot 0 (prompt, then completion; no padding), with its own
  length, so the KV is ragged: `KVCache.index` is per row. Decoding runs `decode_steps` tokens
  per device call and returns early once `admit_after` slots are free while requests wait; the
  host then admits the next requests into the free slots. A rollout ends when the queue is
  empty and every slot has stopped, not when the slowest row of a fixed batch does.
- Decode attention reads the first `span` cache slots only, the smallest multiple of
  `span_bucket` that holds every live row for the coming steps (one compilation per span).
- Once the queue is empty and at most half the slots are live, the live sequences move into
  the first slots and the batch halves (again and again), so the long tail of a heavy-tailed
  rollout is not decoded at the cost of the full slot count.
- A sample's randomness comes from keys folded from (rollout key, prompt index, sample index,
  token index), so the slot or order a sequence runs in does not change what it samples.
- In-flight weight updates (asynchronous RL): given a `WeightSwap`, the run asks it between
  decode calls for newer weights and decodes the rest with them; the KV cache already written
  stays (a partial rollout spans versions), and every token records the version of the
  weights that computed the logits it was sampled from (`Rollout.policy_versions`).

Every device step (prefill, admit, decode) is a pure jitted function with static shapes; the
host only schedules. The result is the static sampler's `Rollout`, so collectors do not change.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import KVCache, init_cache
from rljax.rollout.cuts import cuts_row_mask
from rljax.rollout.sampler import Rollout
from rljax.rollout.sampling import SamplingParams, sample_token

# Cut a completion after its first n tokens (n = len(tokens) keeps it whole): host-side stop
# rules such as stop strings, checked between decode calls.
StopRule = Callable[[np.ndarray], int]
# Polled between decode calls: (version, params) to decode the rest of the rollout with, or
# None to keep the current weights.
WeightSwap = Callable[[], "tuple[int, nnx.State] | None"]


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How the engine schedules; execution only: what a request samples does not depend on it.

    Attributes:
      slots: sequences decoded at once (at most the rollout's rows).
      decode_steps: tokens decoded per device call between scheduling rounds.
      admit_after: a decode call returns early once this many slots are free while requests
        wait (0: slots // 8, at least 1).
      span_bucket: decode attention reads the first multiple of this many cache slots that
        holds every live row (0: always the whole cache; one compilation).
      prefill_rows: prompts prefilled per device call.
    """

    slots: int = 64
    decode_steps: int = 16
    admit_after: int = 0
    span_bucket: int = 128
    prefill_rows: int = 8

    def __post_init__(self):
        for name in ("slots", "decode_steps", "prefill_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)} must be >= 1")
        for name in ("admit_after", "span_bucket"):
            if getattr(self, name) < 0:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)} must be >= 0")


@chex.dataclass
class _Slots:
    """Decode slots [S]: the ragged KV cache and what each slot is sampling."""

    cache: KVCache  # keys/values [L, S, K, M, hd]; index [S] = the slot's sequence length
    logits: jax.Array  # [S, V] float32, the next token's logits
    row: jax.Array  # [S] int32, the output row the slot writes
    t: jax.Array  # [S] int32, tokens generated so far
    limit: jax.Array  # [S] int32, the request's generation budget
    live: jax.Array  # [S] bool
    key: jax.Array  # [S, 2] uint32, the request's sampling key
    cuts: jax.Array  # [S] bool, the request decodes with CUTS
    version: jax.Array  # [S] int32, the weights' version that computed `logits`


@chex.dataclass
class _Outputs:
    """The rollout's completions [N, T] in output-row order (and MoE routes [N, P + T, L, k]):
    `mask` marks the tokens the policy sampled, `env` those an environment appended between
    turns (multi-turn episodes: `rljax.rollout.turns`)."""

    tokens: jax.Array
    mask: jax.Array
    env: jax.Array
    sampling_logprobs: jax.Array
    policy_logprobs: jax.Array
    version: jax.Array  # [N, T] int32, the version whose logits each token was sampled from
    routes: jax.Array | None = None


@chex.dataclass
class _Prefixes:
    """Prefilled prompts waiting to be copied into slots: KV [L, R, K, P, hd], the logits of
    the first completion token [R, V], prompt lengths [R], the weights' version that
    prefilled them [R] (and MoE routes [R, P, L, k])."""

    keys: jax.Array
    values: jax.Array
    logits: jax.Array
    length: jax.Array
    version: jax.Array
    routes: jax.Array | None = None


def _pad_routes(config: TransformerConfig, shape: tuple[int, ...]) -> jax.Array:
    """Routes for padding positions: experts 0 .. k-1 (as the static sampler writes)."""
    k = config.experts_per_token
    return jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (*shape, config.n_layers, k))


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("prefixes",))
def _prefill(graphdef, params, prefixes: _Prefixes, tokens, lengths, dest, version) -> _Prefixes:
    """Prefills prompts `tokens` [A, P] (left-aligned, `lengths` [A]) into prefix rows `dest`
    [A] (out-of-range rows are dropped: padding of the prefill batch) with weights of
    `version`."""
    model = nnx.merge(graphdef, params)
    a, p = tokens.shape
    mask = jnp.arange(p) < lengths[:, None]
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (a, p))
    cache = init_cache(model.config, a, p)
    hidden, cache, routes = model.hidden_states(tokens, positions, mask, cache, return_routes=True)
    last = hidden[jnp.arange(a), jnp.maximum(lengths - 1, 0)]
    new = dict(
        keys=prefixes.keys.at[:, dest].set(cache.keys, mode="drop"),
        values=prefixes.values.at[:, dest].set(cache.values, mode="drop"),
        logits=prefixes.logits.at[dest].set(model.logits(last), mode="drop"),
        length=prefixes.length.at[dest].set(lengths, mode="drop"),
        version=prefixes.version.at[dest].set(version, mode="drop"),
    )
    if routes is not None:
        new["routes"] = prefixes.routes.at[dest].set(routes, mode="drop")
    return prefixes.replace(**new)


@functools.partial(jax.jit, donate_argnames=("slots", "outputs"))
def _admit(
    slots: _Slots, outputs: _Outputs, prefixes: _Prefixes, slot_ids, src, rows, limits, keys, cuts
) -> tuple[_Slots, _Outputs]:
    """Starts requests in slots `slot_ids` [M] from prefix rows `src` [M], writing output rows
    `rows` [M]; out-of-range slot ids (padding) are dropped."""
    cache = slots.cache
    p = prefixes.keys.shape[3]
    n = prefixes.length[src]
    capacity = cache.valid.shape[1]
    cache = cache.replace(
        keys=cache.keys.at[:, slot_ids, :, :p].set(prefixes.keys[:, src], mode="drop"),
        values=cache.values.at[:, slot_ids, :, :p].set(prefixes.values[:, src], mode="drop"),
        valid=cache.valid.at[slot_ids].set(jnp.arange(capacity) < n[:, None], mode="drop"),
        index=cache.index.at[slot_ids].set(n, mode="drop"),
    )
    put = lambda array, value: array.at[slot_ids].set(value, mode="drop")
    slots = slots.replace(
        cache=cache,
        logits=put(slots.logits, prefixes.logits[src]),
        row=put(slots.row, rows),
        t=put(slots.t, 0),
        limit=put(slots.limit, limits),
        live=put(slots.live, True),
        key=put(slots.key, keys),
        cuts=put(slots.cuts, cuts),
        version=put(slots.version, prefixes.version[src]),
    )
    if outputs.routes is not None:  # the prompt's routes, left-padded as the Rollout holds them
        j = jnp.arange(p) - (p - n[:, None])  # [M, P]: prompt token j lands at column p - n + j
        routes = prefixes.routes[src[:, None], jnp.maximum(j, 0)]
        pad = jnp.arange(routes.shape[-1], dtype=routes.dtype)  # experts 0 .. k-1
        routes = jnp.where((j >= 0)[..., None, None], routes, pad)
        dest = jnp.where(slot_ids < slots.row.shape[0], rows, outputs.tokens.shape[0])
        outputs = outputs.replace(routes=outputs.routes.at[dest, :p].set(routes, mode="drop"))
    return slots, outputs


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "steps", "span", "sampling", "eos_ids", "pad_id"),
    donate_argnames=("slots", "outputs"),
)
def _decode(
    graphdef,
    params,
    slots: _Slots,
    outputs: _Outputs,
    wake,
    version,
    *,
    steps: int,
    span: int,
    sampling: SamplingParams,
    eos_ids: tuple[int, ...],
    pad_id: int,
):
    """Decodes up to `steps` tokens in every live slot with the weights of `version`; stops
    early when no slot is live or `wake` slots are free. Attention reads the first `span`
    cache slots. Each token records the version that computed the logits it was sampled from
    (the one before `version` for the first token after a weight swap)."""
    model = nnx.merge(graphdef, params)
    n_rows, width = outputs.tokens.shape
    prompt_width = None if outputs.routes is None else outputs.routes.shape[1] - width

    def cond(carry):
        i, s, _ = carry
        return (i < steps) & jnp.any(s.live) & (jnp.sum(~s.live) < wake)

    def body(carry):
        i, s, o = carry
        live = s.live
        keys = jax.vmap(jax.random.fold_in)(s.key, s.t)
        token, sampling_lp, policy_lp = sample_token(keys, s.logits, sampling, s.cuts)
        token = jnp.where(live, token, pad_id)
        row = jnp.where(live, s.row, n_rows)  # stopped slots write nowhere
        put = lambda array, value: array.at[row, s.t].set(value, mode="drop")
        o = o.replace(
            tokens=put(o.tokens, token),
            mask=put(o.mask, True),
            sampling_logprobs=put(o.sampling_logprobs, sampling_lp),
            policy_logprobs=put(o.policy_logprobs, policy_lp),
            version=put(o.version, s.version),
        )
        index = s.cache.index
        hidden, cache, routes = model.hidden_states(
            token[:, None],
            index[:, None],
            live[:, None],
            s.cache,
            return_routes=True,
            cache_span=span,
        )
        if routes is not None:
            o = o.replace(
                routes=o.routes.at[row, prompt_width + s.t].set(routes[:, 0], mode="drop")
            )
        stop = jnp.isin(token, jnp.asarray(eos_ids)) | (s.t + 1 >= s.limit)
        s = s.replace(
            cache=cache.replace(index=jnp.where(live, index + 1, index)),
            logits=model.logits(hidden[:, 0]),
            version=jnp.where(live, version, s.version),
            t=jnp.where(live, s.t + 1, s.t),
            live=live & ~stop,
        )
        return i + 1, s, o

    _, slots, outputs = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), slots, outputs))
    return slots, outputs


@functools.partial(jax.jit, static_argnames=("pad_id",), donate_argnames=("slots", "outputs"))
def _cut(slots: _Slots, outputs: _Outputs, slot_ids, rows, keep, pad_id: int):
    """Stops slots `slot_ids` and keeps only the first `keep` tokens of output rows `rows`;
    the slots' KV forgets the cut tokens (a multi-turn episode may continue after the cut)."""
    index = slots.cache.index[slot_ids] - (slots.t[slot_ids] - keep)
    capacity = slots.cache.valid.shape[1]
    valid = slots.cache.valid[slot_ids] & (jnp.arange(capacity) < index[:, None])
    slots = slots.replace(
        cache=slots.cache.replace(
            valid=slots.cache.valid.at[slot_ids].set(valid),
            index=slots.cache.index.at[slot_ids].set(index),
        ),
        t=slots.t.at[slot_ids].set(keep),
    )
    drop = jnp.arange(outputs.tokens.shape[1]) >= keep[:, None]
    clear = lambda array, value: array.at[rows].set(jnp.where(drop, value, array[rows]))
    outputs = outputs.replace(
        tokens=clear(outputs.tokens, pad_id),
        mask=clear(outputs.mask, False),
        sampling_logprobs=clear(outputs.sampling_logprobs, 0.0),
        policy_logprobs=clear(outputs.policy_logprobs, 0.0),
    )
    if outputs.routes is not None:  # cut positions are padding again: experts 0 .. k-1
        routes = outputs.routes[rows]
        prompt_width = routes.shape[1] - drop.shape[1]
        cut = jnp.pad(drop, ((0, 0), (prompt_width, 0)))[..., None, None]
        pad = jnp.arange(routes.shape[-1], dtype=routes.dtype)
        outputs = outputs.replace(routes=outputs.routes.at[rows].set(jnp.where(cut, pad, routes)))
    return slots.replace(live=slots.live.at[slot_ids].set(False)), outputs


@jax.jit
def _take_slots(slots: _Slots, keep: jax.Array) -> _Slots:
    """The slots `keep` [S'] (in that order) of `slots`."""
    take = lambda a, axis=0: jnp.take(a, keep, axis=axis)
    cache = slots.cache
    cache = cache.replace(
        keys=take(cache.keys, 1),
        values=take(cache.values, 1),
        valid=take(cache.valid),
        positions=take(cache.positions),
        index=take(cache.index),
    )
    rest = {
        f: take(getattr(slots, f))
        for f in (
            "logits",
            "row",
            "t",
            "limit",
            "live",
            "key",
            "cuts",
            "version",
        )
    }
    return slots.replace(cache=cache, **rest)


@functools.partial(jax.jit, static_argnames=("n_prompts", "n_samples"))
def _request_keys(rng: jax.Array, n_prompts: int, n_samples: int) -> jax.Array:
    """[N, 2] raw sampling keys: fold(fold(rng, prompt index), sample index), row = i * G + g."""
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    per_prompt = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(n_prompts))
    per_sample = jax.vmap(
        lambda key: jax.vmap(lambda g: jax.random.fold_in(key, g))(jnp.arange(n_samples))
    )(per_prompt)
    return per_sample.reshape(-1, per_sample.shape[-1])


class Engine:
    """Samples completions of left-padded prompt batches with continuous batching.

    `engine.generate(params, prompt_tokens, prompt_mask, rng, n_samples=G)` returns the same
    `Rollout` as `rljax.rollout.generate` with the same arguments; greedy decoding gives the
    same tokens, and sampled rows follow the per-request keys described in the module doc.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        config: TransformerConfig,
        *,
        max_new_tokens: int,
        eos_ids: Sequence[int],
        pad_id: int,
        sampling: SamplingParams = SamplingParams(),
        engine: EngineConfig = EngineConfig(),
        stop: StopRule | None = None,
    ):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        self.graphdef, self.model_config = graphdef, config
        self.max_new_tokens = max_new_tokens
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.pad_id, self.sampling, self.config, self.stop = pad_id, sampling, engine, stop

    def generate(
        self,
        params: nnx.State,
        prompt_tokens,
        prompt_mask,
        rng: jax.Array,
        *,
        n_samples: int = 1,
        max_new_tokens: Sequence[int] | None = None,
        version: int = 0,
        swap: WeightSwap | None = None,
    ) -> Rollout:
        """`n_samples` completions per prompt.

        Args:
          params: the policy's weights.
          prompt_tokens, prompt_mask: [B, P] left-padded prompts (host or device arrays); every
            prompt needs at least one real token.
          rng: the rollout's PRNG key.
          n_samples: completions per prompt; rows of one prompt are adjacent.
          max_new_tokens: optional per-prompt budgets [B] (each <= the engine's).
          version: the version number of `params`.
          swap: polled between decode calls for newer weights (in-flight updates); with it
            the `Rollout` records each token's version in `policy_versions`.

        Returns:
          A `Rollout` with B * n_samples rows and T = the engine's `max_new_tokens` columns.
        """
        prompts = self.check_prompts(prompt_tokens, prompt_mask, n_samples, max_new_tokens)
        return _Run(self, params, *prompts, rng, n_samples, version, swap).drain()

    def check_prompts(
        self, prompt_tokens, prompt_mask, n_samples: int, max_new_tokens: Sequence[int] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Validated host arrays: prompt tokens and mask [B, P], prompt lengths [B] and
        generation budgets [B]."""
        tokens = np.asarray(prompt_tokens, np.int32)
        mask = np.asarray(prompt_mask, bool)
        if tokens.ndim != 2 or tokens.shape != mask.shape:
            raise ValueError(f"prompt tokens {tokens.shape} and mask {mask.shape}: need [B, P]")
        b, p = tokens.shape
        if n_samples < 1:
            raise ValueError(f"n_samples={n_samples} must be >= 1")
        lengths = mask.sum(axis=1).astype(np.int32)
        if (lengths == 0).any():
            raise ValueError(f"prompts {np.flatnonzero(lengths == 0).tolist()} have no tokens")
        budgets = np.full(b, self.max_new_tokens, np.int32)
        if max_new_tokens is not None:
            budgets = np.asarray(max_new_tokens, np.int32)
            if (
                budgets.shape != (b,)
                or (budgets < 1).any()
                or (budgets > self.max_new_tokens).any()
            ):
                raise ValueError(
                    f"max_new_tokens must be {b} budgets in [1, {self.max_new_tokens}]"
                )
        return tokens, mask, lengths, budgets


class _Run:
    """One `Engine.generate` call: the host-side queue, slot and prefix bookkeeping."""

    def __init__(
        self,
        engine: Engine,
        params,
        tokens,
        mask,
        lengths,
        budgets,
        rng,
        n_samples,
        version: int = 0,
        swap: WeightSwap | None = None,
    ):
        cfg, model_cfg = engine.config, engine.model_config
        self.engine, self.params, self.g = engine, params, n_samples
        self.version, self.swap = version, swap
        b, p = tokens.shape
        t = engine.max_new_tokens
        self.prompt_tokens, self.prompt_mask = tokens, mask
        self.n_slots = n_slots = min(cfg.slots, b * n_samples)
        self.capacity = p + t
        # Left-aligned prompts: slot position = RoPE position.
        order = np.argsort(~mask, axis=1, kind="stable")
        self.aligned = np.take_along_axis(np.where(mask, tokens, 0), order, axis=1)
        self.lengths, self.budgets = lengths, budgets
        n = b * n_samples
        moe = model_cfg.num_experts > 0
        dt = model_cfg.compute_dtype
        self.keys = _request_keys(rng, b, n_samples)
        kv = (
            model_cfg.n_layers,
            n_slots,
            model_cfg.n_kv_heads,
            self.capacity,
            model_cfg.resolved_head_dim,
        )
        self.slots = _Slots(
            cache=KVCache(
                keys=jnp.zeros(kv, dt),
                values=jnp.zeros(kv, dt),
                valid=jnp.zeros((n_slots, self.capacity), bool),
                positions=jnp.broadcast_to(
                    jnp.arange(self.capacity, dtype=jnp.int32), (n_slots, self.capacity)
                ),
                index=jnp.zeros((n_slots,), jnp.int32),
            ),
            logits=jnp.zeros((n_slots, model_cfg.vocab_size), jnp.float32),
            row=jnp.full((n_slots,), n, jnp.int32),
            t=jnp.zeros((n_slots,), jnp.int32),
            limit=jnp.zeros((n_slots,), jnp.int32),
            live=jnp.zeros((n_slots,), bool),
            key=jnp.zeros((n_slots, *self.keys.shape[1:]), jnp.uint32),
            cuts=jnp.zeros((n_slots,), bool),
            version=jnp.full((n_slots,), version, jnp.int32),
        )
        self.outputs = _Outputs(
            tokens=jnp.full((n, t), engine.pad_id, jnp.int32),
            mask=jnp.zeros((n, t), bool),
            env=jnp.zeros((n, t), bool),
            sampling_logprobs=jnp.zeros((n, t), jnp.float32),
            policy_logprobs=jnp.zeros((n, t), jnp.float32),
            version=jnp.full((n, t), version, jnp.int32),
            routes=_pad_routes(model_cfg, (n, p + t)) if moe else None,
        )
        # FIFO admission leaves at most one prompt partly admitted, so a round needs at most
        # ceil(slots / G) new prefix rows besides it.
        self.prefix_rows = math.ceil(n_slots / n_samples) + 1
        pkv = (
            model_cfg.n_layers,
            self.prefix_rows,
            model_cfg.n_kv_heads,
            p,
            model_cfg.resolved_head_dim,
        )
        self.prefixes = _Prefixes(
            keys=jnp.zeros(pkv, dt),
            values=jnp.zeros(pkv, dt),
            logits=jnp.zeros((self.prefix_rows, model_cfg.vocab_size), jnp.float32),
            length=jnp.zeros((self.prefix_rows,), jnp.int32),
            version=jnp.full((self.prefix_rows,), version, jnp.int32),
            routes=_pad_routes(model_cfg, (self.prefix_rows, p)) if moe else None,
        )
        sampling = engine.sampling
        if sampling.cuts_top_k:
            self.cuts = np.asarray(cuts_row_mask(b, n_samples, sampling.cuts_fraction))
        else:
            self.cuts = np.zeros(n, bool)
        self.queue = collections.deque((i, g) for i in range(b) for g in range(n_samples))
        self.pending = np.full(b, n_samples)  # samples of each prompt not yet admitted
        self.prefix_of: dict[int, int] = {}  # prompt -> prefix row, while samples wait
        self.live = np.zeros(n_slots, bool)
        self.index = np.zeros(n_slots, np.int64)
        self.slot_row = np.full(n_slots, n, np.int64)

    def drain(self) -> Rollout:
        """Admits and decodes until the queue is empty and every slot has stopped."""
        cfg = self.engine.config
        while True:
            self._swap_weights()
            if self.queue and self._free_slots().size:
                self._admit()
            self._between_calls()
            if not self.live.any():
                if self.queue or self._busy().any():
                    continue
                break
            steps = cfg.decode_steps
            need = int(self.index[self.live].max()) + steps
            span = self.capacity
            if cfg.span_bucket:
                span = min(self.capacity, -(-need // cfg.span_bucket) * cfg.span_bucket)
            was_live = self.live.copy()
            self.slots, self.outputs = _decode(
                self.engine.graphdef,
                self.params,
                self.slots,
                self.outputs,
                jnp.int32(self._wake()),
                jnp.int32(self.version),
                steps=steps,
                span=span,
                sampling=self.engine.sampling,
                eos_ids=self.engine.eos_ids,
                pad_id=self.engine.pad_id,
            )
            live, index = jax.device_get((self.slots.live, self.slots.cache.index))
            self.live, self.index = np.array(live), np.array(index)
            if self.engine.stop is not None:
                self._apply_stop_rule(was_live)
            self._after_decode(was_live)
            self._shrink()
        return self._rollout()

    def _swap_weights(self) -> None:
        """Takes newer weights from the `WeightSwap`, if it has any."""
        newer = self.swap() if self.swap is not None else None
        if newer is not None:
            self.version, self.params = newer

    # Hooks of a multi-turn run (`rljax.rollout.turns`); a plain run has none of its work.
    PER_SLOT = ("live", "index", "slot_row")  # host arrays indexed by slot

    def _free_slots(self) -> np.ndarray:
        """Slots a new request may take."""
        return np.flatnonzero(~self.live)

    def _busy(self) -> np.ndarray:
        """[slots] bool: slots holding a sequence that is not finished."""
        return self.live

    def _wake(self) -> int:
        """A decode call returns early once this many slots are not live."""
        if self.queue:
            return self.engine.config.admit_after or max(1, self.n_slots // 8)
        return self.n_slots + 1

    def _between_calls(self) -> None:
        """Work between device calls, after admission."""

    def _after_decode(self, was_live: np.ndarray) -> None:
        """Work after a decode call (and the stop rule); `was_live`: slots live before it."""

    def _turn_start(self, row: int) -> int:
        """The column where `row`'s current turn starts (the stop rule reads that turn)."""
        del row
        return 0

    def _shrink(self) -> None:
        """With no request waiting and at most half the slots live, moves the live sequences
        into the first slots and drops the rest (halving, so each size compiles once): the tail
        of long sequences does not pay for idle slots."""
        busy = self._busy()
        size, live = busy.size, int(busy.sum())
        if self.queue or not 0 < live <= size // 2:
            return
        while live <= size // 2:
            size //= 2
        keep = np.concatenate([np.flatnonzero(busy), np.flatnonzero(~busy)])[:size]
        self.slots = _take_slots(self.slots, jnp.asarray(keep, jnp.int32))
        for name in self.PER_SLOT:
            setattr(self, name, getattr(self, name)[keep])

    def _admit(self) -> None:
        """Fills free slots with the next (prompt, sample) requests, prefilling new prompts."""
        free = self._free_slots()
        take = [self.queue.popleft() for _ in range(min(free.size, len(self.queue)))]
        new = [i for i in dict.fromkeys(i for i, _ in take) if i not in self.prefix_of]
        used = set(self.prefix_of.values())
        open_rows = [r for r in range(self.prefix_rows) if r not in used]
        for i, r in zip(new, open_rows, strict=False):
            self.prefix_of[i] = r
        self._prefill(new)
        a = self.n_slots
        slot_ids = np.full(a, a, np.int32)
        src, rows = np.zeros(a, np.int32), np.zeros(a, np.int32)
        for m, (i, g) in enumerate(take):
            slot_ids[m], src[m], rows[m] = free[m], self.prefix_of[i], i * self.g + g
        budgets = self.budgets[rows // self.g]
        self.slots, self.outputs = _admit(
            self.slots,
            self.outputs,
            self.prefixes,
            jnp.asarray(slot_ids),
            jnp.asarray(src),
            jnp.asarray(rows),
            jnp.asarray(budgets),
            self.keys[rows],
            jnp.asarray(self.cuts[rows]),
        )
        for m, (i, _) in enumerate(take):
            self.live[free[m]] = True
            self.index[free[m]] = self.lengths[i]
            self.slot_row[free[m]] = rows[m]
            self.pending[i] -= 1
            if self.pending[i] == 0:
                del self.prefix_of[i]

    def _prefill(self, prompts: list[int]) -> None:
        """Prefills `prompts` into their prefix rows, `prefill_rows` at a time."""
        step = self.engine.config.prefill_rows
        for start in range(0, len(prompts), step):
            chunk = prompts[start : start + step]
            pad = step - len(chunk)
            tokens = np.concatenate(
                [self.aligned[chunk], np.zeros((pad, self.aligned.shape[1]), np.int32)]
            )
            lengths = np.concatenate([self.lengths[chunk], np.zeros(pad, np.int32)])
            dest = np.array([self.prefix_of[i] for i in chunk] + [self.prefix_rows] * pad, np.int32)
            self.prefixes = _prefill(
                self.engine.graphdef,
                self.params,
                self.prefixes,
                jnp.asarray(tokens),
                jnp.asarray(lengths),
                jnp.asarray(dest),
                jnp.int32(self.version),
            )

    def _apply_stop_rule(self, was_live: np.ndarray) -> None:
        """Cuts the sequences that decoded in the last call where the host-side stop rule says
        (e.g. at a stop string) and ends those still live."""
        tokens, mask = jax.device_get((self.outputs.tokens, self.outputs.mask))
        slots, rows, keep = [], [], []
        for slot in np.flatnonzero(was_live):
            row = self.slot_row[slot]
            start = self._turn_start(row)
            seq = tokens[row, start:][mask[row, start:]]
            n = self.engine.stop(seq)
            if n < seq.size:
                slots.append(slot)
                rows.append(row)
                keep.append(start + n)
                self.live[slot] = False
        if slots:
            self.slots, self.outputs = _cut(
                self.slots,
                self.outputs,
                jnp.asarray(slots),
                jnp.asarray(rows),
                jnp.asarray(keep),
                self.engine.pad_id,
            )

    def _rollout(self) -> Rollout:
        o, g = self.outputs, self.g
        return Rollout(
            prompt_tokens=jnp.repeat(jnp.asarray(self.prompt_tokens), g, axis=0),
            prompt_mask=jnp.repeat(jnp.asarray(self.prompt_mask), g, axis=0),
            completion_tokens=o.tokens,
            completion_mask=o.mask,
            sampling_logprobs=o.sampling_logprobs,
            policy_logprobs=o.policy_logprobs,
            group_id=jnp.arange(o.tokens.shape[0], dtype=jnp.int32) // g,
            cuts_rows=jnp.asarray(self.cuts),
            routes=o.routes,
            policy_versions=None if self.swap is None else o.version,
        )


def engine_generate(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens,
    prompt_mask,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    n_samples: int = 1,
    sampling: SamplingParams = SamplingParams(),
    engine: EngineConfig = EngineConfig(),
    extra_eos_ids: Sequence[int] = (),
    stop: StopRule | None = None,
    turns=None,
    version: int = 0,
    swap: WeightSwap | None = None,
) -> Rollout:
    """`rljax.rollout.generate`'s call, run by an `Engine`: the same arguments and `Rollout`,
    plus the engine's schedule, more EOS ids, a host-side stop rule, with a `turns` handler
    (`rljax.rollout.turns.TurnHandler`) multi-turn episodes, and with a `swap` in-flight
    weight updates (`params` being `version`)."""
    config = nnx.merge(graphdef, params).config
    runner = Engine(
        graphdef,
        config,
        max_new_tokens=max_new_tokens,
        eos_ids=(eos_id, *extra_eos_ids),
        pad_id=pad_id,
        sampling=sampling,
        engine=engine,
        stop=stop,
    )
    swapping = dict(n_samples=n_samples, version=version, swap=swap)
    if turns is None:
        return runner.generate(params, prompt_tokens, prompt_mask, rng, **swapping)
    from rljax.rollout.turns import generate_turns  # turns builds on this module

    return generate_turns(runner, params, prompt_tokens, prompt_mask, rng, turns, **swapping)
