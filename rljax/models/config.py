"""Configuration of the decoder-only transformer (Llama, Qwen2/3, Mistral, Mixtral, Gemma 3)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from rljax.models.attention import ATTENTION_IMPLS

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ROPE_TYPES = ("default", "linear", "llama3")
# What each layer's attention sees (`TransformerConfig.layer_types`), named as in HF configs.
LAYER_TYPES = ("full_attention", "sliding_attention")


# How the training forward pass trades memory for recompute (`TransformerConfig.remat`).
REMAT_POLICIES = ("none", "block")
# The MLP's gate activation (`TransformerConfig.mlp_activation`): SwiGLU, or Gemma's GeGLU with
# the tanh approximation of GELU (HF's "gelu_pytorch_tanh").
MLP_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and numerics of a Llama/Qwen2/Mistral-style decoder.

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
        qk_norm: RMSNorm over each query and key head (a [head_dim] scale each, shared by the
            heads) after the projection and before RoPE (Qwen3 `q_norm`/`k_norm`).
        tie_embeddings: the LM head reuses the token embedding matrix.
        dtype: compute dtype of activations and matmuls ("float32" or "bfloat16").
        param_dtype: storage dtype of parameters.
        num_experts: 0 for the dense SwiGLU MLP; > 0 replaces every block's MLP with a
            mixture of that many SwiGLU experts (`rljax.models.moe`, Qwen3-MoE / Mixtral style).
        experts_per_token: top-k experts each token is routed to (MoE only).
        expert_d_ff: hidden width of each expert; None means d_ff.
        norm_topk_prob: True renormalises the k routing weights to sum to 1 (Qwen3-MoE; equal
            to Mixtral's softmax over the top-k logits); False keeps the raw softmax
            probabilities of the chosen experts (Qwen2-MoE `norm_topk_prob=False`).
        remat: rematerialisation of the full forward pass (training, not sampling): "none"
            keeps every block's activations for the backward pass; "block" keeps only each
            block's input and recomputes the block in the backward pass (`jax.checkpoint`), so
            the attention scores [B, heads, S, S] of one block at a time are live, for about
            one more forward pass of compute.
        causal: True for a left-to-right decoder; False lets every token attend to every
            valid token (a masked-diffusion LM, `rljax.diffusion`).
        attention_chunk: 0, or the number of queries whose attention scores a full forward
            pass (training, prefill without a cache) computes at a time, each block
            recomputed in the backward pass: attention memory grows linearly, not
            quadratically, in the sequence length.
        attention_impl: how attention is computed (`rljax.models.attention`): "einsum" (float32
            scores by einsum, the reference), "xla" or "cudnn" (`jax.nn.dot_product_attention`
            with that kernel), or "auto" (cudnn on a GPU where it fits, else xla; einsum on CPU).
            The same maths up to float rounding.
        sliding_window: None, or w: a query at position p of a "sliding_attention" layer sees
            only the keys at positions in (p - w, p] (w keys, itself included; HF's
            convention), in every path (full forward, query chunks, packing, cached decoding).
        scan_layers: True runs the stacked blocks with `jax.lax.scan`, so compile time stays
            flat in depth; False unrolls the same scan (one copy of the block per layer in the
            compiled program: slower to compile, sometimes faster to run). Execution only:
            the parameters and the math are the same.
        layer_types: None, or one entry per layer from LAYER_TYPES; None means every layer is
            "sliding_attention" when `sliding_window` is set (Mistral) and "full_attention"
            otherwise. Qwen2's `max_window_layers` and interleaved local/global stacks
            (Gemma 3) give a per-layer pattern.
        norm_unit_offset: every RMSNorm scales by (1 + w) instead of w, multiplied in float32
            before the cast back (Gemma); its weights start at zero.
        sandwich_norms: RMSNorms also on the attention and MLP outputs before each residual
            add (Gemma 2/3 `post_attention_layernorm` / `post_feedforward_layernorm`).
        scale_embeddings: the token embeddings are multiplied by sqrt(d_model), rounded to the
            compute dtype (Gemma).
        mlp_activation: one of MLP_ACTIVATIONS; "gelu_tanh" makes the MLP GeGLU (Gemma).
        query_pre_attn_scalar: None, or s: attention scores are scaled by s**-0.5 instead of
            head_dim**-0.5 (Gemma).
        rope_local_theta: None, or the RoPE base of the "sliding_attention" layers, which then
            rotate without `rope_scaling` (that applies to the full-attention layers only);
            Gemma 3's `rope_local_base_freq`. None: every layer uses rope_theta/rope_scaling.
        final_logit_softcap: None, or c: logits become c * tanh(logits / c)
            (`final_logit_softcapping`).
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
    qk_norm: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    num_experts: int = 0
    experts_per_token: int = 2
    expert_d_ff: int | None = None
    norm_topk_prob: bool = True
    remat: str = "none"
    attention_chunk: int = 0
    attention_impl: str = "einsum"
    causal: bool = True
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    norm_unit_offset: bool = False
    sandwich_norms: bool = False
    scale_embeddings: bool = False
    mlp_activation: str = "silu"
    query_pre_attn_scalar: int | None = None
    rope_local_theta: float | None = None
    final_logit_softcap: float | None = None
    scan_layers: bool = True

    def __post_init__(self):
        if self.attention_chunk < 0:
            raise ValueError(
                f"TransformerConfig.attention_chunk={self.attention_chunk} must be >= 0 (0: off)"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"TransformerConfig.attention_impl={self.attention_impl!r} is unknown; choose one "
                f"of {ATTENTION_IMPLS}"
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"TransformerConfig.remat={self.remat!r} is unknown; choose one of {REMAT_POLICIES}"
            )
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
        if self.num_experts < 0:
            raise ValueError(
                f"TransformerConfig.num_experts={self.num_experts} must be >= 0 (0 = dense MLP)"
            )
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"TransformerConfig.experts_per_token={self.experts_per_token} must lie in "
                f"[1, num_experts={self.num_experts}]"
            )
        if self.expert_d_ff is not None and self.expert_d_ff <= 0:
            raise ValueError(f"TransformerConfig.expert_d_ff={self.expert_d_ff} must be positive")
        self._check_windows()
        self._check_gemma()
        if isinstance(self.rope_scaling, dict):  # stored as sorted pairs so the config hashes
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.rope_scaling is not None:
            scaling = self.rope_scaling_dict
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in _ROPE_TYPES:
                raise ValueError(
                    f"rope_scaling type {kind!r} is not supported; supported: {_ROPE_TYPES}"
                )

    def _check_windows(self) -> None:
        """Validates `sliding_window` / `layer_types` (stored as a tuple so the config hashes)."""
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(
                f"TransformerConfig.sliding_window={self.sliding_window} must be >= 1 (None: off)"
            )
        if self.sliding_window is not None and not self.causal:
            raise ValueError(
                "TransformerConfig.sliding_window is set but causal=False; sliding windows "
                "are implemented for causal decoders only"
            )
        if self.layer_types is None:
            return
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.n_layers:
            raise ValueError(
                f"TransformerConfig.layer_types has {len(self.layer_types)} entries; "
                f"give one per layer (n_layers={self.n_layers})"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"TransformerConfig.layer_types has {unknown}; use {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError(
                "TransformerConfig.layer_types has sliding_attention layers but "
                "sliding_window is None; set the window size"
            )

    def _check_gemma(self) -> None:
        """Validates the Gemma fields (activation, positive scalars)."""
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ValueError(
                f"TransformerConfig.mlp_activation={self.mlp_activation!r} is unknown; "
                f"choose one of {MLP_ACTIVATIONS}"
            )
        for name in (
            "query_pre_attn_scalar",
            "rope_local_theta",
            "final_logit_softcap",
        ):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"TransformerConfig.{name}={value} must be positive (None: off)")

    @property
    def layer_local_rope(self) -> tuple[bool, ...]:
        """Per layer, whether it rotates with the local RoPE (`rope_local_theta`, unscaled)."""
        if self.rope_local_theta is None:
            return (False,) * self.n_layers
        return tuple(w is not None for w in self.layer_windows)

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer, the sliding window its attention uses, or None for full attention."""
        if self.layer_types is None:
            return (self.sliding_window,) * self.n_layers
        return tuple(
            self.sliding_window if kind == "sliding_attention" else None
            for kind in self.layer_types
        )

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_expert_d_ff(self) -> int:
        return self.expert_d_ff if self.expert_d_ff is not None else self.d_ff

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
