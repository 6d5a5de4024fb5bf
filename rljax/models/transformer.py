"""Decoder-only transformer (Llama, Qwen2, Mistral, Mixtral), with a preallocated KV cache.

The model is defined with flax.nnx and used functionally: `create_model` returns
`(graphdef, params)` once, the params (an `nnx.State`) live in the train state, and jitted code
calls `forward(graphdef, params, ...)`, which merges them back into a module.

Every parameter carries logical axis names (`rljax.parallel.rules` maps them to mesh axes):
  vocab, embed, q_heads, kv_heads, head_dim, mlp, norm (and expert in MoE models).

With `config.num_experts > 0` every block's MLP is a top-k mixture of experts
(`rljax.models.moe`). `hidden_states` / `forward` then take optional `routes`
[B, T, n_layers, k] to replay recorded expert choices, and with `return_routes=True` return the
routes used as a third output (None for dense models); without that flag every caller sees the
same (output, cache) pair for dense and MoE models alike.

Padding convention: `mask` marks real tokens; `positions` are RoPE positions (for left-padded
prompts, `positions_from_mask(mask)`). A token attends to the earlier real tokens in the same
row and to itself; in a sliding-window layer (`TransformerConfig.layer_windows`) only to those
whose RoPE position lies in (p - window, p] for its own position p.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.low_rank import dense
from rljax.models.moe import MoEMLP

_MASKED = -1e30  # finite, so a row with no visible key gives a uniform (not NaN) attention.


@chex.dataclass
class KVCache:
    """Preallocated keys/values for incremental decoding.

    Attributes:
      keys: per layer, [B, S, n_kv_heads, head_dim] in the compute dtype.
      values: per layer, [B, S, n_kv_heads, head_dim].
      valid: [B, S] bool, which cache slots hold a real (non-padding) token.
      positions: [B, S] int32, the RoPE position of each slot's token (for sliding windows).
      index: int32 scalar, the next slot to write.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    positions: jax.Array
    index: jax.Array


def init_cache(config: TransformerConfig, batch_size: int, max_len: int) -> KVCache:
    """An empty cache with room for `max_len` tokens per row."""
    shape = (batch_size, max_len, config.n_kv_heads, config.resolved_head_dim)
    zeros = lambda: jnp.zeros(shape, config.compute_dtype)
    return KVCache(
        keys=tuple(zeros() for _ in range(config.n_layers)),
        values=tuple(zeros() for _ in range(config.n_layers)),
        valid=jnp.zeros((batch_size, max_len), bool),
        positions=jnp.zeros((batch_size, max_len), jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """RoPE positions [B, T] for left- or right-padded rows: 0, 1, ... over the real tokens."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], dtype, std: float | None):
    """A parameter with logical axis names; std=None means ones (norm scales), 0 means zeros."""
    if std is None:
        value = jnp.ones(shape, dtype)
    elif std == 0:
        value = jnp.zeros(shape, dtype)
    else:
        value = std * jax.random.normal(rngs.params(), shape, dtype)
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, normalised in float32 (as HF Llama/Qwen2 do)."""

    def __init__(self, dim: int, eps: float, dtype, *, rngs: nnx.Rngs):
        self.weight = _param(rngs, (dim,), ("norm",), dtype, std=None)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


def rope_frequencies(config: TransformerConfig) -> jax.Array:
    """Inverse frequencies [head_dim // 2], with HF's "linear" and "llama3" scaling rules."""
    dim = config.resolved_head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    scaling = config.rope_scaling_dict
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return jnp.where(medium, smoothed, scaled)
    return inv_freq  # "default"


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding in the rotate-half layout used by HF checkpoints. x: [B, T, H, D]."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _attention_core(q, k, v, allowed, dt):
    """softmax(q k^T / sqrt(d), masked) v for q [B, T, K, G, D] (G query heads per kv head),
    k and v [B, S, K, D], allowed [B, T, S]; the scores in float32. Returns [B, T, K, G, D]."""
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    scores = jnp.where(allowed[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v)


def _query_chunked_attention(q, k, v, allowed, dt, chunk: int):
    """`_attention_core` over blocks of `chunk` queries at a time, each block rematerialised
    in the backward pass: the [B, heads, chunk, S] scores of one block are live instead of
    [B, heads, T, S], so training memory grows linearly in the sequence length. Each query
    still sees every key, so no online softmax is needed; the result equals the unchunked one
    up to float rounding."""
    b, t = q.shape[:2]
    n = -(-t // chunk)
    pad = n * chunk - t
    q = jnp.pad(q, ((0, 0), (0, pad)) + ((0, 0),) * 3)
    allowed = jnp.pad(allowed, ((0, 0), (0, pad), (0, 0)))
    blocks = lambda x: jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)
    core = jax.checkpoint(lambda qi, ai: _attention_core(qi, k, v, ai, dt))
    out = jax.lax.map(lambda xs: core(*xs), (blocks(q), blocks(allowed)))
    return jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, *out.shape[3:])[:, :t]


class Attention(nnx.Module):
    """Grouped-query self-attention with optional q/k/v and output biases and per-head q/k
    RMSNorm (Qwen3)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, h, k, hd = config.d_model, config.n_heads, config.n_kv_heads, config.resolved_head_dim
        pd = config.storage_dtype
        self.config = config
        self.q_proj = _param(rngs, (d, h, hd), ("embed", "q_heads", "head_dim"), pd, 0.02)
        self.k_proj = _param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), pd, 0.02)
        self.v_proj = _param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), pd, 0.02)
        self.o_proj = _param(rngs, (h, hd, d), ("q_heads", "head_dim", "embed"), pd, 0.02)
        if config.qkv_bias:
            self.q_bias = _param(rngs, (h, hd), ("q_heads", "head_dim"), pd, 0)
            self.k_bias = _param(rngs, (k, hd), ("kv_heads", "head_dim"), pd, 0)
            self.v_bias = _param(rngs, (k, hd), ("kv_heads", "head_dim"), pd, 0)
        if config.o_bias:
            self.o_bias = _param(rngs, (d,), ("embed",), pd, 0)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_eps, pd, rngs=rngs)
            self.k_norm = RMSNorm(hd, config.rms_eps, pd, rngs=rngs)

    def _project(self, x, name):
        """x [B, T, D] -> [B, T, heads, head_dim]: projection, bias, and (q, k) the head norm."""
        dt = self.config.compute_dtype
        y = dense("btd,dhk->bthk", x, getattr(self, f"{name}_proj").get_value(), dt)
        if self.config.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dt)
        if self.config.qk_norm and name != "v":
            y = getattr(self, f"{name}_norm")(y)
        return y

    def __call__(self, x, positions, inv_freq, allowed, kv=None, index=None):
        """Attention of x [B,T,D] over itself, or over a layer cache.

        Args:
          allowed: [B, T, S] bool, which key slots each query may see.
          kv: None, or this layer's (keys, values) cache, each [B, S, K, head_dim]; this call's
            keys and values are written at slots `index .. index + T` first.

        Returns:
          out [B, T, D] and the updated (keys, values) (None without a cache).
        """
        cfg, dt = self.config, self.config.compute_dtype
        q = apply_rope(self._project(x, "q"), positions, inv_freq)
        k_all = apply_rope(self._project(x, "k"), positions, inv_freq)
        v_all = self._project(x, "v")
        if kv is not None:
            start = (0, index, 0, 0)
            k_all = jax.lax.dynamic_update_slice(kv[0], k_all.astype(kv[0].dtype), start)
            v_all = jax.lax.dynamic_update_slice(kv[1], v_all.astype(kv[1].dtype), start)
            kv = (k_all, v_all)
        b, t, h, hd = q.shape
        q = q.reshape(b, t, cfg.n_kv_heads, h // cfg.n_kv_heads, hd)
        chunk = cfg.attention_chunk
        if kv is None and 0 < chunk < t:
            out = _query_chunked_attention(q, k_all, v_all, allowed, dt, chunk)
        else:
            out = _attention_core(q, k_all, v_all, allowed, dt)
        out = dense("bthk,hkd->btd", out.reshape(b, t, h, hd), self.o_proj.get_value(), dt)
        if cfg.o_bias:
            out = out + self.o_bias[...].astype(dt)
        return out, kv


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, f, pd = config.d_model, config.d_ff, config.storage_dtype
        self.dtype = config.compute_dtype
        self.gate_proj = _param(rngs, (d, f), ("embed", "mlp"), pd, 0.02)
        self.up_proj = _param(rngs, (d, f), ("embed", "mlp"), pd, 0.02)
        self.down_proj = _param(rngs, (f, d), ("mlp", "embed"), pd, 0.02)

    def __call__(self, x):
        dt = self.dtype
        gate = dense("...d,df->...f", x, self.gate_proj.get_value(), dt)
        up = dense("...d,df->...f", x, self.up_proj.get_value(), dt)
        return dense("...f,fd->...d", jax.nn.silu(gate) * up, self.down_proj.get_value(), dt)


class Block(nnx.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x)); the MLP is a
    mixture of experts when `config.num_experts > 0`."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        pd = config.storage_dtype
        self.attn_norm = RMSNorm(config.d_model, config.rms_eps, pd, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_eps, pd, rngs=rngs)
        self.mlp = MoEMLP(config, rngs=rngs) if config.num_experts else MLP(config, rngs=rngs)


def _block(layer: Block, x, positions, inv_freq, allowed, kv, index, routes, num_experts: int):
    """One decoder block: (x, the block's new kv, the MoE routes it used or None)."""
    out, kv = layer.attn(layer.attn_norm(x), positions, inv_freq, allowed, kv, index)
    x = x + out
    used = None
    if num_experts:
        out, used = layer.mlp(layer.mlp_norm(x), routes)
    else:
        out = layer.mlp(layer.mlp_norm(x))
    return x + out, kv, used


def _windowed(
    allowed: jax.Array,
    q_positions: jax.Array,
    k_positions: jax.Array,
    windows: tuple[int | None, ...],
) -> list[jax.Array]:
    """Per layer, `allowed` [B, T, S] narrowed to its sliding window, if it has one: a query
    at position p keeps the keys at positions in (p - window, p] (q_positions [B, T],
    k_positions [B, S]). Layers sharing a window share one mask."""
    if not any(windows):
        return [allowed] * len(windows)
    distance = q_positions[:, :, None] - k_positions[:, None, :]
    masks = {w: allowed if w is None else allowed & (distance < w) for w in dict.fromkeys(windows)}
    return [masks[w] for w in windows]


class Transformer(nnx.Module):
    """Llama/Qwen2 decoder. Call `hidden_states` then `logits`, or `__call__` for both."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        pd = config.storage_dtype
        self.embed = _param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), pd, 0.02)
        self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, config.rms_eps, pd, rngs=rngs)
        if not config.tie_embeddings:
            self.lm_head = _param(
                rngs, (config.d_model, config.vocab_size), ("embed", "vocab"), pd, 0.02
            )

    def hidden_states(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        routes: jax.Array | None = None,
        return_routes: bool = False,
        segment_ids: jax.Array | None = None,
    ):
        """Final-norm hidden states.

        Args:
          tokens: [B, T] int token ids.
          positions: [B, T] int RoPE positions.
          mask: [B, T] bool, real tokens (padding is False).
          cache: None for a full forward pass; else the tokens are written at slots
            `cache.index .. cache.index + T` and attend to every valid earlier slot.
          routes: MoE only: None to route by each layer's router, or [B, T, n_layers, k] int
            experts to replay (`rljax.models.moe`).
          return_routes: also return the routes used.
          segment_ids: None, or [B, T] int ids of packed sequences (full forward pass only): a
            token attends only to tokens of its own segment (`rljax.train.packing`).

        Returns:
          hidden: [B, T, d_model] in the compute dtype, and the updated cache (or None); with
          `return_routes`, a third output: the routes used [B, T, n_layers, k] int32 (None for
          a dense model).
        """
        cfg = self.config
        chex.assert_rank([tokens, positions, mask], 2)
        chex.assert_equal_shape([tokens, positions, mask])
        if routes is not None:
            if not cfg.num_experts:
                raise ValueError("routes were given but the model is dense (num_experts=0)")
            chex.assert_shape(routes, (*tokens.shape, cfg.n_layers, cfg.experts_per_token))
        t = tokens.shape[1]
        if cache is None:
            q_slots = k_slots = jnp.arange(t)
            k_valid, k_positions = mask, positions
        else:
            q_slots = cache.index + jnp.arange(t)
            k_slots = jnp.arange(cache.valid.shape[1])
            k_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.index))
            k_positions = jax.lax.dynamic_update_slice(
                cache.positions, positions.astype(jnp.int32), (0, cache.index)
            )
        allowed = k_valid[:, None, :]
        if cfg.causal:
            allowed = (k_slots[None, :] <= q_slots[:, None])[None] & allowed
        else:  # bidirectional (masked-diffusion LMs): every valid slot
            allowed = jnp.broadcast_to(allowed, (allowed.shape[0], t, allowed.shape[2]))
        if segment_ids is not None:
            if cache is not None:
                raise ValueError("segment_ids (packed sequences) need a full forward pass")
            allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])
        layer_allowed = _windowed(allowed, positions, k_positions, cfg.layer_windows)
        inv_freq = rope_frequencies(cfg)
        x = self.embed[...].astype(cfg.compute_dtype)[tokens]
        new_keys, new_values, used = [], [], []

        def block(layer, x, positions, inv_freq, allowed, kv, index, routes):
            return _block(
                layer, x, positions, inv_freq, allowed, kv, index, routes, cfg.num_experts
            )

        if cfg.remat == "block" and cache is None:
            block = nnx.remat(block)
        for i, layer in enumerate(self.layers):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            index = None if cache is None else cache.index
            layer_routes = None if routes is None else routes[:, :, i]
            x, kv, layer_used = block(
                layer, x, positions, inv_freq, layer_allowed[i], kv, index, layer_routes
            )
            if cfg.num_experts:
                used.append(layer_used)
            if kv is not None:
                new_keys.append(kv[0])
                new_values.append(kv[1])
        hidden = self.final_norm(x)
        if cache is not None:
            cache = KVCache(
                keys=tuple(new_keys),
                values=tuple(new_values),
                valid=k_valid,
                positions=k_positions,
                index=cache.index + t,
            )
        if not return_routes:
            return hidden, cache
        return hidden, cache, jnp.stack(used, axis=2) if used else None

    def output_head(self) -> jax.Array:
        """The [d_model, vocab] output matrix in the compute dtype (the embedding when tied)."""
        dt = self.config.compute_dtype
        if self.config.tie_embeddings:
            return self.embed[...].astype(dt).T
        return self.lm_head[...].astype(dt)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., vocab] from hidden states [..., d_model]."""
        return jnp.einsum(
            "...d,dv->...v", hidden, self.output_head(), preferred_element_type=jnp.float32
        )

    def __call__(self, tokens, positions, mask, cache=None, routes=None, return_routes=False):
        """Logits [B, T, V] (float32) and the updated cache (and the routes used, with
        `return_routes`); see `hidden_states`."""
        hidden, *rest = self.hidden_states(tokens, positions, mask, cache, routes, return_routes)
        return self.logits(hidden), *rest


def create_model(config: TransformerConfig, seed: int = 0) -> tuple[nnx.GraphDef, nnx.State]:
    """Randomly initialised (graphdef, params) of a Transformer; params is an `nnx.State`."""
    return nnx.split(Transformer(config, rngs=nnx.Rngs(params=seed)))


def abstract_model(config: TransformerConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) with `jax.ShapeDtypeStruct` leaves: shapes without allocating memory."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(params=0))))


def forward(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
    cache: KVCache | None = None,
    routes: jax.Array | None = None,
    return_routes: bool = False,
):
    """Pure functional forward pass: float32 logits [B, T, V] and the updated cache.

    MoE models take optional `routes` [B, T, n_layers, k] to replay; with `return_routes` a
    third output holds the routes used (None for dense models). See `Transformer.hidden_states`.
    """
    model = nnx.merge(graphdef, params)
    return model(tokens, positions, mask, cache, routes, return_routes)
