"""Configuration of the decoder-only transformer (Llama / Qwen2 families)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and numerics of a Llama/Qwen2-style decoder.

    Attributes:
        vocab_size: number of token ids.
        d_model: residual width.
        n_layers: number of decoder blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention when < n_heads).
        d_ff: hidden width of the SwiGLU MLP.
        head_dim: per-head width; defaults to d_model // n_heads.
        rope_theta: RoPE base frequency.
        rope_scaling: None, or a dict with "rope_type" in ("linear", "llama3") and its factors,
            exactly as in a Hugging Face config.json (stored as sorted (key, value) pairs).
        rms_eps: RMSNorm epsilon.
        qkv_bias: biases on the q/k/v projections (Qwen2: True).
        o_bias: bias on the attention output projection (Llama `attention_bias=True`).
        tie_embeddings: the LM head reuses the token embedding matrix.
        dtype: compute dtype of activations and matmuls ("float32" or "bfloat16").
        param_dtype: storage dtype of parameters.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | dict[str, Any] | None = None
    rms_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TransformerConfig.{name}={getattr(self, name)} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}: "
                "grouped-query attention shares each kv head among n_heads // n_kv_heads "
                "query heads"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "set head_dim explicitly"
            )
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim={self.resolved_head_dim} must be even for RoPE")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"TransformerConfig.{name}={getattr(self, name)!r}; use one of {list(_DTYPES)}"
                )
        if isinstance(self.rope_scaling, dict):  # stored as sorted pairs so the config hashes
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.rope_scaling is not None:
            scaling = self.rope_scaling_dict
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in _ROPE_TYPES:
                raise ValueError(
                    f"rope_scaling type {kind!r} is not supported; supported: {_ROPE_TYPES}"
                )

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return _DTYPES[self.dtype]

    @property
    def storage_dtype(self) -> jnp.dtype:
        return _DTYPES[self.param_dtype]

    def replace(self, **changes) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)
