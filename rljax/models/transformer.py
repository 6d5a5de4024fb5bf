"""Decoder-only transformer for the Llama and Qwen2 families, with a preallocated KV cache.

The model is defined with flax.nnx and used functionally: `create_model` returns
`(graphdef, params)` once, the params (an `nnx.State`) live in the train state, and jitted code
calls `forward(graphdef, params, ...)`, which merges them back into a module.

Every parameter carries logical axis names (`rljax.parallel.rules` maps them to mesh axes):
  vocab, embed, q_heads, kv_heads, head_dim, mlp, norm.

Padding convention: `mask` marks real tokens; `positions` are RoPE positions (for left-padded
prompts, `positions_from_mask(mask)`). A token attends to the earlier real tokens in the same
row and to itself.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.config import TransformerConfig

_MASKED = -1e30  # finite, so a row with no visible key gives a uniform (not NaN) attention.


@chex.dataclass
class KVCache:
    """Preallocated keys/values for incremental decoding.

    Attributes:
      keys: per layer, [B, S, n_kv_heads, head_dim] in the compute dtype.
      values: per layer, [B, S, n_kv_heads, head_dim].
      valid: [B, S] bool, which cache slots hold a real (non-padding) token.
      index: int32 scalar, the next slot to write.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    index: jax.Array


def init_cache(config: TransformerConfig, batch_size: int, max_len: int) -> KVCache:
    """An empty cache with room for `max_len` tokens per row."""
    shape = (batch_size, max_len, config.n_kv_heads, config.resolved_head_dim)
    zeros = lambda: jnp.zeros(shape, config.compute_dtype)
    return KVCache(
        keys=tuple(zeros() for _ in range(config.n_layers)),
        values=tuple(zeros() for _ in range(config.n_layers)),
        valid=jnp.zeros((batch_size, max_len), bool),
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


class Attention(nnx.Module):
    """Grouped-query self-attention with optional q/k/v and output biases."""

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

    def _project(self, x, name):
        dt = self.config.compute_dtype
        y = jnp.einsum("btd,dhk->bthk", x, getattr(self, f"{name}_proj")[...].astype(dt))
        if self.config.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dt)
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
        groups = h // cfg.n_kv_heads
        q = q.reshape(b, t, cfg.n_kv_heads, groups, hd)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k_all, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(hd)
        scores = jnp.where(allowed[:, None, None], scores, _MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v_all).reshape(b, t, h, hd)
        out = jnp.einsum("bthk,hkd->btd", out, self.o_proj[...].astype(dt))
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
        gate = x @ self.gate_proj[...].astype(dt)
        up = x @ self.up_proj[...].astype(dt)
        return (jax.nn.silu(gate) * up) @ self.down_proj[...].astype(dt)


class Block(nnx.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        pd = config.storage_dtype
        self.attn_norm = RMSNorm(config.d_model, config.rms_eps, pd, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_eps, pd, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)


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
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states.

        Args:
          tokens: [B, T] int token ids.
          positions: [B, T] int RoPE positions.
          mask: [B, T] bool, real tokens (padding is False).
          cache: None for a full forward pass; else the tokens are written at slots
            `cache.index .. cache.index + T` and attend to every valid earlier slot.

        Returns:
          hidden: [B, T, d_model] in the compute dtype, and the updated cache (or None).
        """
        cfg = self.config
        chex.assert_rank([tokens, positions, mask], 2)
        chex.assert_equal_shape([tokens, positions, mask])
        t = tokens.shape[1]
        if cache is None:
            q_slots = k_slots = jnp.arange(t)
            k_valid = mask
        else:
            q_slots = cache.index + jnp.arange(t)
            k_slots = jnp.arange(cache.valid.shape[1])
            k_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.index))
        allowed = (k_slots[None, :] <= q_slots[:, None])[None] & k_valid[:, None, :]
        inv_freq = rope_frequencies(cfg)
        x = self.embed[...].astype(cfg.compute_dtype)[tokens]
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            index = None if cache is None else cache.index
            out, kv = layer.attn(layer.attn_norm(x), positions, inv_freq, allowed, kv, index)
            x = x + out
            x = x + layer.mlp(layer.mlp_norm(x))
            if kv is not None:
                new_keys.append(kv[0])
                new_values.append(kv[1])
        hidden = self.final_norm(x)
        if cache is None:
            return hidden, None
        return hidden, KVCache(
            keys=tuple(new_keys), values=tuple(new_values), valid=k_valid, index=cache.index + t
        )

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

    def __call__(self, tokens, positions, mask, cache=None):
        """Logits [B, T, V] (float32) and the updated cache; see `hidden_states`."""
        hidden, cache = self.hidden_states(tokens, positions, mask, cache)
        return self.logits(hidden), cache


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
) -> tuple[jax.Array, KVCache | None]:
    """Pure functional forward pass: float32 logits [B, T, V] and the updated cache."""
    return nnx.merge(graphdef, params)(tokens, positions, mask, cache)
