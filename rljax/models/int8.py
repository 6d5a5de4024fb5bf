"""int8 storage of frozen kernels (QLoRA's quantized base, with int8 in place of NF4).

Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs": the frozen base is
stored quantized and dequantized where it is used, while the adapters stay in float32. Here a
kernel W [*lead, *in_axes, *out_axes] is stored as q = round(W / s) in int8 with one float32
absmax scale s = max|W| / 127 per output channel (the max over the input axes), 4x smaller
than float32 (2x than bfloat16) plus the scales; the round-trip error of an element is at most
s / 2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

_LEVELS = 127.0  # symmetric int8: codes -127..127


@struct.dataclass
class Int8Kernel:
    """A kernel stored as int8 codes and per-output-channel scales.

    Attributes:
      q: int8 codes, the kernel's shape.
      scale: float32, the kernel's shape with its input axes kept as size 1.
      dtype: the kernel's storage dtype before quantization (what `dequantize` returns).
    """

    q: jax.Array
    scale: jax.Array
    dtype: str = struct.field(pytree_node=False)

    def dequantize(self) -> jax.Array:
        """q * scale in the original dtype."""
        return (self.q.astype(jnp.float32) * self.scale).astype(self.dtype)


def quantize(kernel: jax.Array, in_axes: tuple[int, ...]) -> Int8Kernel:
    """`kernel` as int8 with one absmax scale per index of its axes other than `in_axes`."""
    x = kernel.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=in_axes, keepdims=True)
    scale = jnp.where(amax > 0, amax / _LEVELS, 1.0)
    q = jnp.clip(jnp.round(x / scale), -_LEVELS, _LEVELS).astype(jnp.int8)
    return Int8Kernel(q=q, scale=scale, dtype=str(kernel.dtype))


def is_int8(x) -> bool:
    """`is_leaf` for tree maps that treat an `Int8Kernel` as one parameter."""
    return isinstance(x, Int8Kernel)


def dequantized(params):
    """`params` with every `Int8Kernel` replaced by its dequantized array."""
    return jax.tree.map(lambda x: x.dequantize() if is_int8(x) else x, params, is_leaf=is_int8)
