"""FP8 fake quantisation with absmax float32 scales, per tensor or per channel.

The common FP8 recipe (e.g. "FP8 Formats for Deep Learning", Micikevicius et al.,
arXiv 2209.05433; per-tensor and per-channel scaling as in Transformer Engine and vLLM):
a group of entries (the whole tensor, or one channel) shares a float32 scale

    s = amax / fmt_max,  amax = max |x| over the group,

each entry is stored as x / s cast to FP8 with round-to-nearest-even and saturation to
+-fmt_max, and the dequantised value is that FP8 value times s. `quantize_fp8` returns the
dequantised values (fake quantisation).

Formats (`FP8_FORMATS`):
- "e4m3": `jnp.float8_e4m3fn`, max 448 (no inf; the format used for weights/activations);
- "e5m2": `jnp.float8_e5m2`, max 57344 (the format often used for gradients).

JAX's float32 -> float8_e4m3fn cast rounds to nearest even but does not saturate (|v| > 464
becomes NaN), so values are clipped to +-max before the cast (for e5m2 the clip likewise
avoids overflow to inf).

Arithmetic: s, x / s and q * s are plain float32 operations (one rounding each), exactly
what a numpy float32 reference computes (amax / fmt_max is kept a true division; XLA
would otherwise multiply by the rounded reciprocal, one ulp off at times). XLA on CPU
flushes float32 subnormals to zero, so results equal IEEE arithmetic only when s is a normal
float32, i.e. amax >= fmt_max * 2^-126 (about 5e-36 for e4m3);
a group whose scale underflows is returned as zeros.
"""

import functools

import jax
import jax.numpy as jnp

_FP8 = {
    "e4m3": jnp.float8_e4m3fn,
    "e5m2": jnp.float8_e5m2,
}
FP8_FORMATS = tuple(_FP8)
GRANULARITIES = ("tensor", "channel")


def div_const(a: jax.Array, c: float) -> jax.Array:
    """float32 a / c as a true IEEE division.

    XLA rewrites a division by a constant into a multiplication by its rounded reciprocal,
    which can differ by one ulp; hiding the divisor behind an optimization barrier keeps it.
    """
    _, d = jax.lax.optimization_barrier((a, jnp.full(a.shape, c, jnp.float32)))
    return a / d


def fp8_max(fmt: str) -> float:
    """The largest finite value of an FP8 format: 448 for "e4m3", 57344 for "e5m2".

    Raises:
      ValueError: unknown fmt.
    """
    if fmt not in _FP8:
        raise ValueError(f"fmt={fmt!r} is not an FP8 format; use one of {FP8_FORMATS}")
    return float(jnp.finfo(_FP8[fmt]).max)


@functools.partial(jax.jit, static_argnames=("granularity", "axis", "fmt"))
def quantize_fp8(
    x: jax.Array, granularity: str = "tensor", axis: int = -1, fmt: str = "e4m3"
) -> jax.Array:
    """Fake-quantises x to FP8 with absmax float32 scaling; returns the dequantised values.

    Groups sharing one scale:
    - granularity="tensor": the whole tensor (`axis` is ignored);
    - granularity="channel": one scale per index along `axis`, the amax being taken over all
      the other axes (for a kernel W [in, out] used as x @ W, per output channel is axis=-1).

    Per group: s = float32(amax / fmt_max); q = cast(clip(x / s, -max, max)) with
    round-to-nearest-even; output q * s, all in float32, then cast to x.dtype.

    Edge cases: an all-zero group gives zeros; a NaN or +-inf makes its whole group NaN
    (its scale is not finite); see the module docstring for tiny (subnormal-scale) groups.

    Jit-compiled with granularity, axis and fmt static.

    Args:
      x: float array (rank >= 1 for "channel").
      granularity: "tensor" or "channel".
      axis: the channel axis for granularity="channel" (negative counts from the end).
      fmt: "e4m3" (max 448) or "e5m2" (max 57344).

    Returns:
      An array with x's shape and dtype.

    Raises:
      ValueError: unknown granularity or fmt, axis out of range, rank-0 x with "channel".
      TypeError: non-floating x.
    """
    fmax = fp8_max(fmt)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x has dtype {x.dtype}; FP8 quantisation needs a floating array")
    if granularity == "tensor":
        reduce_axes = None
    elif granularity == "channel":
        if x.ndim < 1:
            raise ValueError("granularity='channel' needs x of rank >= 1")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis={axis} is out of range for x of rank {x.ndim}")
        reduce_axes = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    else:
        raise ValueError(f"granularity={granularity!r}; use one of {GRANULARITIES}")
    x32 = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x32), axis=reduce_axes, keepdims=True)
    scale = div_const(amax, fmax)
    zero = scale == 0  # an all-zero group (or one whose scale underflows)
    safe = jnp.where(zero, jnp.float32(1), scale)
    q = jnp.clip(x32 / safe, -fmax, fmax).astype(_FP8[fmt]).astype(jnp.float32)
    out = jnp.where(zero, jnp.float32(0), q * safe)
    return out.astype(x.dtype)
