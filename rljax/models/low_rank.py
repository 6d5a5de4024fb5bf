"""Unmerged LoRA kernels: a projection computed as x W + scale (x A) B without forming W + A B.

`rljax.models.lora.unmerged` puts a `LoraKernel` where a targeted kernel's array was in the
params; the model's dense projections contract through `dense`, which adds the low-rank term
for such a kernel and is a plain einsum otherwise. Kept apart from `lora` so that the model
can import it (lora imports the checkpoint code, which imports the model).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class LoraKernel:
    """A frozen kernel with its adapter, applied unmerged.

    Attributes:
      w: the base kernel [*in_axes, *out_axes] (its storage dtype).
      a: [in, r] with in = prod(in_axes); b: [r, out] with out = prod(out_axes) (float32).
      scale: float32 scalar, alpha / rank.
      n_in: how many leading axes of `w` are contracted with x's trailing axes.
    """

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: jax.Array
    n_in: int = struct.field(pytree_node=False)


def dense(equation: str, x: jax.Array, kernel: jax.Array | LoraKernel, dtype) -> jax.Array:
    """`einsum(equation, x, kernel)` in `dtype` for an equation contracting x's trailing axes
    with the kernel's leading ones; for a `LoraKernel`, plus scale (x A) B in the output's
    layout [*x_lead, *out_axes]."""
    if not isinstance(kernel, LoraKernel):
        return jnp.einsum(equation, x, kernel.astype(dtype))
    out = jnp.einsum(equation, x, kernel.w.astype(dtype))
    lead = x.shape[: x.ndim - kernel.n_in]
    low = x.reshape(*lead, -1) @ kernel.a.astype(dtype)  # [*lead, r]
    low = (low @ kernel.b.astype(dtype)).reshape(out.shape)
    return out + (kernel.scale * low).astype(out.dtype)
