"""Attention behind one call, `attend`: the float32-score einsum reference, or
`jax.nn.dot_product_attention` with XLA's or cuDNN's (flash) kernel.

Every implementation takes the same boolean mask `allowed` [B, T, S] (causal order, padding,
sliding windows and packed segments already combined by the model), so each computes
softmax(q k^T / sqrt(d), masked) v over the same visible keys; they differ by float rounding.

`TransformerConfig.attention_impl` chooses:
  "einsum": `einsum_attention`, the reference and the CPU default.
  "xla":    `jax.nn.dot_product_attention(implementation="xla")`, any platform.
  "cudnn":  cuDNN's fused kernel (CUDA GPU, bfloat16/float16, head_dim a multiple of 8 up to
            128, 256 from Hopper); elsewhere a one-line ValueError. The mask reaches cuDNN as an
            additive bias, which its training kernels take only for even T and S, so a call
            with an odd length (a one-token decoding step) runs "xla" instead.
  "auto":   "cudnn" on a GPU where the model fits it, else "xla" on GPU/TPU; "einsum" on CPU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

ATTENTION_IMPLS = ("einsum", "xla", "cudnn", "auto")
_MASKED = -1e30  # finite, so a row with no visible key gives a uniform (not NaN) attention.
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def einsum_attention(q, k, v, allowed, dt, scalar: int | None = None, heads_major: bool = False):
    """softmax(q k^T / sqrt(scalar), masked) v for q [B, T, K, G, D] (G query heads per kv
    head), k and v [B, S, K, D] ([B, K, S, D] with `heads_major`, the KV cache's layout),
    allowed [B, T, S]; the scores in float32; scalar None means D. Returns [B, T, K, G, D]."""
    kv = "bksd" if heads_major else "bskd"
    scores = jnp.einsum(f"btkgd,{kv}->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(scalar or q.shape[-1])
    scores = jnp.where(allowed[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    return jnp.einsum(f"bkgts,{kv}->btkgd", probs, v)


def cudnn_unfit(dtype, head_dim: int | None = None) -> str | None:
    """Why cuDNN's fused attention cannot run a model of this compute dtype and head_dim on
    jax's default backend (head_dim None: not checked), or None when it can."""
    backend = jax.default_backend()
    if backend != "gpu":
        return f"needs a CUDA GPU but jax's backend is {backend}"
    if jnp.dtype(dtype) not in _CUDNN_DTYPES:
        return f"needs dtype bfloat16 or float16, not {jnp.dtype(dtype).name}"
    capability = getattr(jax.devices()[0], "compute_capability", "0.0")
    limit = 256 if tuple(map(int, capability.split("."))) >= (9, 0) else 128
    if head_dim is not None and (head_dim % 8 or head_dim > limit):
        return f"needs head_dim a multiple of 8 up to {limit}, not {head_dim}"
    return None


def resolve_impl(impl: str, q: jax.Array, k: jax.Array) -> str:
    """The implementation ("einsum", "xla" or "cudnn") that `attend` runs for `impl` on these
    inputs (q [B, T, K, G, D], k [B, S, K, D]) and jax's default backend; see the module doc."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"TransformerConfig.attention_impl={impl!r}; use one of {ATTENTION_IMPLS}")
    if impl in ("einsum", "xla"):
        return impl
    why = cudnn_unfit(q.dtype, q.shape[-1])
    if impl == "cudnn" and why:
        raise ValueError(f"TransformerConfig.attention_impl='cudnn' {why}; use 'auto' or 'xla'")
    if why:  # auto
        return "einsum" if jax.default_backend() == "cpu" else "xla"
    return "xla" if q.shape[1] % 2 or k.shape[1] % 2 else "cudnn"


def attend(q, k, v, allowed, impl: str, dt, scalar: int | None = None, heads_major=False):
    """Masked softmax attention by the implementation `impl` (ATTENTION_IMPLS) resolves to.

    Args:
      q: [B, T, K, G, D] queries, G query heads per kv head, in the compute dtype `dt`.
      k, v: [B, S, K, D] keys and values in `dt`; [B, K, S, D] with `heads_major` (the KV
        cache's layout, which lets decoding read each head's keys without a transpose).
      allowed: [B, T, S] bool, which keys each query may see.
      impl: "einsum", "xla", "cudnn" or "auto" (`TransformerConfig.attention_impl`).
      dt: the compute dtype; the probabilities are cast to it before they weight v.
      scalar: the scores are q k^T / sqrt(scalar) (Gemma's `query_pre_attn_scalar`); None
        means D.

    Returns:
      [B, T, K, G, D] in `dt`.
    """
    impl = resolve_impl(impl, q, k.swapaxes(1, 2) if heads_major else k)
    if heads_major and impl != "einsum":  # only the einsum reads [B, K, S, D] directly
        k, v, heads_major = k.swapaxes(1, 2), v.swapaxes(1, 2), False
    if impl == "einsum":
        return einsum_attention(q, k, v, allowed, dt, scalar, heads_major)
    b, t, kv_heads, group, d = q.shape  # query head n = kv head n // G, as in jax's GQA
    out = jax.nn.dot_product_attention(
        q.reshape(b, t, kv_heads * group, d),
        k,
        v,
        mask=allowed[:, None],
        scale=None if scalar is None else 1 / math.sqrt(scalar),
        implementation=impl,
    )
    return out.reshape(q.shape)
