"""Decoder-only transformer (Llama, Qwen2/3, Mistral, Mixtral, Gemma 3), with a preallocated KV
cache.

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

The blocks are stacked: `Transformer.layers` is one `Block` whose parameters carry a leading
layer axis [n_layers, ...] (logical axis "layers"), run by `jax.lax.scan`, so compile time does
not grow with depth (`TransformerConfig.scan_layers=False` unrolls the same scan). Per-layer
differences that are data (sliding windows) ride along the scan. Checkpoint formats that
name layers one by one convert with `stack_layers` / `unstack_layers`.

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

from rljax.models.attention import attend
from rljax.models.config import TransformerConfig
from rljax.models.low_rank import dense
from rljax.models.moe import MoEMLP


@chex.dataclass
class KVCache:
    """Preallocated keys/values for incremental decoding.

    Attributes:
      keys: [n_layers, B, n_kv_heads, S, head_dim] in the compute dtype: head-major, so
        decoding reads each head's slots as one contiguous block (no transpose per step).
      values: [n_layers, B, n_kv_heads, S, head_dim].
      valid: [B, S] bool, which cache slots hold a real (non-padding) token.
      positions: [B, S] int32, the RoPE position of each slot's token (for sliding windows).
      index: int32, the next slot to write: a scalar shared by every row, or [B] per row
        (ragged rows, as the rollout engine's decode slots hold: `rljax.rollout.engine`).
    """

    keys: jax.Array
    values: jax.Array
    valid: jax.Array
    positions: jax.Array
    index: jax.Array


def init_cache(config: TransformerConfig, batch_size: int, max_len: int) -> KVCache:
    """An empty cache with room for `max_len` tokens per row."""
    shape = (config.n_layers, batch_size, config.n_kv_heads, max_len, config.resolved_head_dim)
    return KVCache(
        keys=jnp.zeros(shape, config.compute_dtype),
        values=jnp.zeros(shape, config.compute_dtype),
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
    """y = x / sqrt(mean(x^2) + eps) * w, normalised in float32 (as HF Llama/Qwen2 do); with
    `unit_offset` (Gemma) y = (x / sqrt(mean(x^2) + eps) * (1 + w)) in float32, then cast, as
    HF Gemma does, and w starts at zero."""

    def __init__(self, dim: int, eps: float, dtype, *, rngs: nnx.Rngs, unit_offset: bool = False):
        self.weight = _param(rngs, (dim,), ("norm",), dtype, std=0 if unit_offset else None)
        self.eps = eps
        self.unit_offset = unit_offset

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.unit_offset:
            return (x32 * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


def _norm(config: TransformerConfig, dim: int, rngs: nnx.Rngs) -> RMSNorm:
    """An RMSNorm of `dim` with the config's epsilon, storage dtype and (Gemma) unit offset."""
    return RMSNorm(
        dim, config.rms_eps, config.storage_dtype, rngs=rngs, unit_offset=config.norm_unit_offset
    )


def rope_frequencies(config: TransformerConfig, local: bool = False) -> jax.Array:
    """Inverse frequencies [head_dim // 2], with HF's "linear" and "llama3" scaling rules; with
    `local`, those of the sliding-window layers' own base `rope_local_theta`, unscaled."""
    dim = config.resolved_head_dim
    theta = config.rope_local_theta if local else config.rope_theta
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    scaling = config.rope_scaling_dict
    if scaling is None or local:
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


def _query_chunked_attention(q, k, v, allowed, impl: str, dt, chunk: int, scalar=None):
    """`attend` over blocks of `chunk` queries at a time, each block rematerialised
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
    core = jax.checkpoint(lambda qi, ai: attend(qi, k, v, ai, impl, dt, scalar))
    out = jax.lax.map(lambda xs: core(*xs), (blocks(q), blocks(allowed)))
    return jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, *out.shape[3:])[:, :t]


class Attention(nnx.Module):
    """Grouped-query self-attention with optional q/k/v and output biases, per-head q/k
    RMSNorm (Qwen3, Gemma 3), and Gemma's query_pre_attn_scalar."""

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
            self.q_norm = _norm(config, hd, rngs)
            self.k_norm = _norm(config, hd, rngs)

    def _project(self, x, name):
        """x [B, T, D] -> [B, T, heads, head_dim]: projection, bias, and (q, k) the head norm."""
        dt = self.config.compute_dtype
        y = dense("btd,dhk->bthk", x, getattr(self, f"{name}_proj").get_value(), dt)
        if self.config.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dt)
        if self.config.qk_norm and name != "v":
            y = getattr(self, f"{name}_norm")(y)
        return y

    def qkv(self, x, positions, inv_freq):
        """Queries, keys and values of x [B, T, D], RoPE applied: [B, T, heads, head_dim]."""
        q = apply_rope(self._project(x, "q"), positions, inv_freq)
        k = apply_rope(self._project(x, "k"), positions, inv_freq)
        return q, k, self._project(x, "v")

    def attend(self, q, keys, values, allowed, cached: bool = False):
        """The attention output [B, T, D] of queries q [B, T, H, head_dim] over keys and
        values [B, S, K, head_dim] ([B, K, S, head_dim], the cache's layout, when `cached`),
        each query seeing the key slots `allowed` [B, T, S]; `attention_chunk` splits the
        queries of a full pass (not `cached` decoding)."""
        cfg, dt = self.config, self.config.compute_dtype
        b, t, h, hd = q.shape
        q = q.reshape(b, t, cfg.n_kv_heads, h // cfg.n_kv_heads, hd)
        chunk = cfg.attention_chunk
        scalar = cfg.query_pre_attn_scalar
        if not cached and 0 < chunk < t:
            out = _query_chunked_attention(
                q, keys, values, allowed, cfg.attention_impl, dt, chunk, scalar
            )
        else:
            out = attend(q, keys, values, allowed, cfg.attention_impl, dt, scalar, cached)
        out = dense("bthk,hkd->btd", out.reshape(b, t, h, hd), self.o_proj.get_value(), dt)
        if cfg.o_bias:
            out = out + self.o_bias[...].astype(dt)
        return out


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); GeGLU with tanh-approximated GELU in place of silu
    when `config.mlp_activation == "gelu_tanh"` (Gemma)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, f, pd = config.d_model, config.d_ff, config.storage_dtype
        self.dtype = config.compute_dtype
        self.activation = config.mlp_activation
        self.gate_proj = _param(rngs, (d, f), ("embed", "mlp"), pd, 0.02)
        self.up_proj = _param(rngs, (d, f), ("embed", "mlp"), pd, 0.02)
        self.down_proj = _param(rngs, (f, d), ("mlp", "embed"), pd, 0.02)

    def __call__(self, x):
        dt = self.dtype
        gate = dense("...d,df->...f", x, self.gate_proj.get_value(), dt)
        up = dense("...d,df->...f", x, self.up_proj.get_value(), dt)
        if self.activation == "gelu_tanh":
            gate = jax.nn.gelu(gate, approximate=True)
        else:
            gate = jax.nn.silu(gate)
        return dense("...f,fd->...d", gate * up, self.down_proj.get_value(), dt)


class Block(nnx.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x)); the MLP is a
    mixture of experts when `config.num_experts > 0`. With `config.sandwich_norms` (Gemma)
    the attention and MLP outputs are normed too: x + post_attn_norm(attn(attn_norm(x)))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d = config.d_model
        self.attn_norm = _norm(config, d, rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = _norm(config, d, rngs)
        self.mlp = MoEMLP(config, rngs=rngs) if config.num_experts else MLP(config, rngs=rngs)
        self.sandwich_norms = config.sandwich_norms
        if config.sandwich_norms:
            self.post_attn_norm = _norm(config, d, rngs)
            self.post_mlp_norm = _norm(config, d, rngs)


@chex.dataclass
class _LayerCache:
    """The stacked cache arrays [n_layers, B, K, S, head_dim] inside the layer scan, with the
    scanned layer's index and the slot where this call's tokens go."""

    keys: jax.Array
    values: jax.Array
    layer: jax.Array
    index: jax.Array

    def write(
        self, k: jax.Array, v: jax.Array, span: int
    ) -> tuple[_LayerCache, jax.Array, jax.Array]:
        """Writes this call's k, v [B, T, K, head_dim] into the layer's slots in place and
        returns the new cache with the layer's first `span` keys and values [B, K, span,
        head_dim]. A per-row index ([B]) scatters each row at its own slot; slots past the end
        are dropped."""
        k = k.astype(self.keys.dtype).swapaxes(1, 2)  # [B, K, T, head_dim]
        v = v.astype(self.values.dtype).swapaxes(1, 2)
        if self.index.ndim:
            rows = jnp.arange(k.shape[0])[:, None, None]
            heads = jnp.arange(k.shape[1])[None, :, None]
            slots = (self.index[:, None] + jnp.arange(k.shape[2]))[:, None, :]
            keys = self.keys.at[self.layer, rows, heads, slots].set(k, mode="drop")
            values = self.values.at[self.layer, rows, heads, slots].set(v, mode="drop")
        else:
            start = (self.layer, 0, 0, self.index, 0)
            keys = jax.lax.dynamic_update_slice(self.keys, k[None], start)
            values = jax.lax.dynamic_update_slice(self.values, v[None], start)
        new = self.replace(keys=keys, values=values)
        return new, keys[self.layer, :, :, :span], values[self.layer, :, :, :span]


def _block(
    layer: Block, x, positions, inv_freq, allowed, cache, routes, num_experts: int, span=None
):
    """One decoder block: (x, the updated `_LayerCache` or None, the MoE routes it used or
    None); with a cache, attention reads its first `span` slots."""
    q, k, v = layer.attn.qkv(layer.attn_norm(x), positions, inv_freq)
    if cache is not None:
        cache, k, v = cache.write(k, v, span)
    out = layer.attn.attend(q, k, v, allowed, cached=cache is not None)
    if layer.sandwich_norms:
        out = layer.post_attn_norm(out)
    x = x + out
    used = None
    if num_experts:
        out, used = layer.mlp(layer.mlp_norm(x), routes)
    else:
        out = layer.mlp(layer.mlp_norm(x))
    if layer.sandwich_norms:
        out = layer.post_mlp_norm(out)
    return x + out, cache, used


def stack_layers(pure: dict) -> dict:
    """A pure params dict with per-layer blocks {"layers": {0: {...}, 1: {...}}} (the layout
    of checkpoint formats that name layers one by one) -> the model's stacked layout
    {"layers": {...}} whose leaves carry a leading layer axis."""
    layers = pure["layers"]
    per_layer = [layers[i] for i in sorted(layers)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)
    return {**pure, "layers": stacked}


def unstack_layers(pure: dict) -> dict:
    """The inverse of `stack_layers`: {"layers": {i: {...}}} from the stacked layout."""
    layers = pure["layers"]
    n = jax.tree.leaves(layers)[0].shape[0]
    return {**pure, "layers": {i: jax.tree.map(lambda x, i=i: x[i], layers) for i in range(n)}}


def _stacked_block(blocks: list[Block]) -> Block:
    """One Block whose parameters stack those of `blocks` along a new leading "layers" axis."""
    graphdef, first = nnx.split(blocks[0])
    states = [first] + [nnx.split(b)[1] for b in blocks[1:]]

    def stack(*variables: nnx.Variable) -> nnx.Variable:
        axes = variables[0].get_metadata()["out_sharding"]
        value = jnp.stack([v[...] for v in variables])
        return variables[0].replace(value, out_sharding=("layers", *axes))

    is_variable = lambda x: isinstance(x, nnx.Variable)
    return nnx.merge(graphdef, jax.tree.map(stack, *states, is_leaf=is_variable))


def _window_sizes(config: TransformerConfig) -> jax.Array | None:
    """Per layer, the sliding window its queries see as int32 [n_layers] (full attention:
    the int32 maximum), or None when no layer has a window."""
    if not any(config.layer_windows):
        return None
    full = jnp.iinfo(jnp.int32).max
    return jnp.asarray([full if w is None else w for w in config.layer_windows], jnp.int32)


def _local_rope(config: TransformerConfig) -> jax.Array | None:
    """Per layer, whether it rotates with the local RoPE base, as bool [n_layers], or None
    when every layer uses the global one."""
    if not any(config.layer_local_rope):
        return None
    return jnp.asarray(config.layer_local_rope)


class Transformer(nnx.Module):
    """Llama/Qwen2 decoder over stacked blocks. Call `hidden_states` then `logits`, or
    `__call__` for both."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        pd = config.storage_dtype
        self.embed = _param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), pd, 0.02)
        self.layers = _stacked_block([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = _norm(config, config.d_model, rngs)
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
        cache_span: int | None = None,
    ):
        """Final-norm hidden states.

        Args:
          tokens: [B, T] int token ids.
          positions: [B, T] int RoPE positions.
          mask: [B, T] bool, real tokens (padding is False).
          cache: None for a full forward pass; else the tokens are written at slots
            `cache.index .. cache.index + T` (per row when the index is [B]) and attend to
            every valid earlier slot.
          routes: MoE only: None to route by each layer's router, or [B, T, n_layers, k] int
            experts to replay (`rljax.models.moe`).
          return_routes: also return the routes used.
          segment_ids: None, or [B, T] int ids of packed sequences (full forward pass only): a
            token attends only to tokens of its own segment (`rljax.train.packing`).
          cache_span: with a cache, attend over its first `cache_span` slots only (static; the
            caller guarantees every valid slot and every written one lies below it), so decoding
            reads what the rows hold rather than the whole preallocated cache.

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
        span = None
        if cache is None:
            q_slots = k_slots = jnp.arange(t)
            k_valid, k_positions = mask, positions
            seen_valid, seen_positions = k_valid, k_positions
        else:
            span = min(cache_span or cache.valid.shape[1], cache.valid.shape[1])
            k_slots = jnp.arange(span)
            if cache.index.ndim:  # ragged rows: each writes at its own slot
                q_slots = cache.index[:, None] + jnp.arange(t)  # [B, T]
                rows = jnp.arange(tokens.shape[0])[:, None]
                k_valid = cache.valid.at[rows, q_slots].set(mask, mode="drop")
                k_positions = cache.positions.at[rows, q_slots].set(
                    positions.astype(jnp.int32), mode="drop"
                )
            else:
                q_slots = cache.index + jnp.arange(t)
                k_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.index))
                k_positions = jax.lax.dynamic_update_slice(
                    cache.positions, positions.astype(jnp.int32), (0, cache.index)
                )
            seen_valid, seen_positions = k_valid[:, :span], k_positions[:, :span]
        allowed = seen_valid[:, None, :]
        if cfg.causal:
            allowed = (k_slots <= q_slots[..., None]) & allowed
        else:  # bidirectional (masked-diffusion LMs): every valid slot
            allowed = jnp.broadcast_to(allowed, (allowed.shape[0], t, allowed.shape[2]))
        if segment_ids is not None:
            if cache is not None:
                raise ValueError("segment_ids (packed sequences) need a full forward pass")
            allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])
        windows = _window_sizes(cfg)
        distance = None if windows is None else positions[:, :, None] - seen_positions[:, None, :]
        local_rope = _local_rope(cfg)
        inv_freq = rope_frequencies(cfg)
        inv_freq_local = None if local_rope is None else rope_frequencies(cfg, local=True)
        x = self.embed[...].astype(cfg.compute_dtype)[tokens]
        if cfg.scale_embeddings:  # sqrt(d) rounded to the compute dtype, as HF Gemma does
            x = x * jnp.asarray(math.sqrt(cfg.d_model), cfg.compute_dtype)
        block_def, block_params = nnx.split(self.layers)

        def body(carry, per_layer):
            x, layer_cache = carry
            params, window, local, layer_routes = per_layer
            layer_allowed = allowed if window is None else allowed & (distance < window)
            layer_freq = inv_freq if local is None else jnp.where(local, inv_freq_local, inv_freq)
            x, layer_cache, used = _block(
                nnx.merge(block_def, params),
                x,
                positions,
                layer_freq,
                layer_allowed,
                layer_cache,
                layer_routes,
                cfg.num_experts,
                span,
            )
            if layer_cache is not None:
                layer_cache = layer_cache.replace(layer=layer_cache.layer + 1)
            return (x, layer_cache), used

        if cfg.remat == "block" and cache is None:
            body = jax.checkpoint(body, prevent_cse=False)
        layer_cache = None
        if cache is not None:
            layer_cache = _LayerCache(
                keys=cache.keys,
                values=cache.values,
                layer=jnp.zeros((), jnp.int32),
                index=cache.index,
            )
        layer_routes = None if routes is None else jnp.moveaxis(routes, 2, 0)
        (x, layer_cache), used = jax.lax.scan(
            body,
            (x, layer_cache),
            (block_params, windows, local_rope, layer_routes),
            unroll=1 if cfg.scan_layers else cfg.n_layers,
        )
        hidden = self.final_norm(x)
        if cache is not None:
            cache = KVCache(
                keys=layer_cache.keys,
                values=layer_cache.values,
                valid=k_valid,
                positions=k_positions,
                index=cache.index + t,
            )
        if not return_routes:
            return hidden, cache
        return hidden, cache, None if used is None else jnp.moveaxis(used, 0, 2)

    def output_head(self) -> jax.Array:
        """The [d_model, vocab] output matrix in the compute dtype (the embedding when tied)."""
        dt = self.config.compute_dtype
        if self.config.tie_embeddings:
            return self.embed[...].astype(dt).T
        return self.lm_head[...].astype(dt)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., vocab] from hidden states [..., d_model], soft-capped when
        `config.final_logit_softcap` is set."""
        logits = jnp.einsum(
            "...d,dv->...v", hidden, self.output_head(), preferred_element_type=jnp.float32
        )
        cap = self.config.final_logit_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)

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
