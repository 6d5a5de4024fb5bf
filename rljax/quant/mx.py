"""OCP Microscaling (MX) block formats as fake quantisation: MXFP4 and MXFP8.

"OCP Microscaling Formats (MX) Specification", version 1.0 (Open Compute Project, 2023),
section 6: a block of k consecutive elements (k = 32 in the spec) shares one E8M0 scale
X = 2^e, and each element is stored in a narrow element format P_i, the value being P_i * X.
The spec's conversion (section 6.3) takes

    e = floor(log2(amax)) - emax_elem,  amax = max_i |x_i| over the block,

clamped to E8M0's range [-127, 127], and casts x_i / X to the element format with
round-to-nearest-even and saturation to +-max. `quantize_mx` returns the dequantised values
P_i * X (fake quantisation), so a model can be evaluated or trained "as if" in MX.

Formats (`MX_FORMATS`):
- "mxfp4": elements E2M1 (`jnp.float4_e2m1fn`): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, emax_elem = 2;
- "mxfp8": elements E4M3 (`jnp.float8_e4m3fn`): max 448, emax_elem = 8.

Exactness and backends: everything is computed in float32, and the power-of-two scalings
x / X and P * X are done on the bit patterns (`_ldexp`), not with float multiplications.
XLA on CPU flushes float32 subnormals to zero in arithmetic and comparisons (FTZ/DAZ), and
`jnp.ldexp` / `jnp.frexp` mishandle subnormals there; with the bit-level scaling the result
is the exact IEEE value (subnormal inputs and outputs included) on every backend. The block
amax and floor(log2(amax)) are likewise taken from the bit patterns, so they are exact.

JAX's casts, as found on jax 0.10.2 (checked in tests/quant/test_mx.py through
`quantize_mx`): float32 -> float4_e2m1fn rounds to nearest even and saturates, but maps NaN
to -0 (E2M1 has no NaN); float32 -> float8_e4m3fn rounds to nearest even but does not
saturate (|v| > 464 becomes NaN). `quantize_mx` therefore clips to +-max before the cast
and sets non-finite blocks explicitly.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class _Format(NamedTuple):
    dtype: object  # the JAX element dtype
    emax: int  # exponent of the largest normal element (emax_elem in the spec)
    max: float  # largest finite element
    deadzone: float  # smallest positive rounding midpoint: half the smallest subnormal


def _format(dtype, emax: int) -> _Format:
    info = jnp.finfo(dtype)
    return _Format(dtype, emax, float(info.max), float(info.smallest_subnormal) / 2)


_FORMATS = {
    "mxfp4": _format(jnp.float4_e2m1fn, 2),
    "mxfp8": _format(jnp.float8_e4m3fn, 8),
}
MX_FORMATS = tuple(_FORMATS)

# E8M0 encodes 2^e for e in [-127, 127] (255 is NaN).
_E8M0_MIN, _E8M0_MAX = -127, 127
_SIGN = 0x80000000
_ABS = 0x7FFFFFFF
_INF_BITS = 0x7F800000


def _get_format(fmt: str) -> _Format:
    """The element format behind an MX format name; ValueError for an unknown one."""
    if fmt not in _FORMATS:
        raise ValueError(f"fmt={fmt!r} is not an MX format; use one of {MX_FORMATS}")
    return _FORMATS[fmt]


def _bits(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def _from_bits(b: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(b.astype(jnp.uint32), jnp.float32)


def _ldexp(v: jax.Array, k: jax.Array) -> jax.Array:
    """float32 v * 2^k on the bit patterns, exact whenever the product is a float32.

    A product below the normal range is rounded to nearest even (as IEEE), one above it is
    +-inf; NaN and +-inf pass through. Unlike a float multiplication on XLA:CPU, subnormal
    operands and results are not flushed to zero.

    Args:
      v: float32 array.
      k: int32 array broadcastable against v.

    Returns:
      float32 array shaped like v.
    """
    bits = _bits(v)
    sign = bits & jnp.uint32(_SIGN)
    mag = bits & jnp.uint32(_ABS)
    field = (mag >> 23).astype(jnp.int32)
    frac = mag & jnp.uint32(0x7FFFFF)
    # v = sig * 2^exp with sig a 24-bit integer (subnormals: exp = -149, no implicit bit).
    sig = jnp.where(field > 0, frac | jnp.uint32(0x800000), frac)
    exp = jnp.where(field > 0, field - 150, -149)
    shift = jnp.where(sig > 0, lax.clz(sig).astype(jnp.int32) - 8, 0)  # normalise to 2^23
    sig = sig << shift.astype(jnp.uint32)
    biased = exp - shift + k + 150  # biased exponent of sig * 2^(exp - shift + k)
    normal = sign | (biased.astype(jnp.uint32) << 23) | (sig & jnp.uint32(0x7FFFFF))
    # Below the normal range: m = sig >> (1 - biased), rounded to nearest even.
    s = jnp.clip(1 - biased, 1, 26).astype(jnp.uint32)
    m = sig >> s
    rem = sig & ((jnp.uint32(1) << s) - 1)
    half = jnp.uint32(1) << (s - 1)
    m = m + ((rem > half) | ((rem == half) & ((m & 1) == 1))).astype(jnp.uint32)
    out = jnp.where(biased >= 1, normal, sign | m)  # m = 2^23 carries into the exponent
    out = jnp.where(biased >= 255, sign | jnp.uint32(_INF_BITS), out)
    out = jnp.where((sig == 0) | (field == 255), bits, out)  # zeros, infs, NaNs unchanged
    return _from_bits(out)


def _neg(x: jax.Array) -> jax.Array:
    """-x by flipping the sign bit (never flushed)."""
    return _from_bits(_bits(x) ^ jnp.uint32(_SIGN))


def _round_to_grid(y: jax.Array, spec: _Format) -> jax.Array:
    """float32 y -> the nearest element value (RNE, saturating at +-max), as float32."""
    return jnp.clip(y, -spec.max, spec.max).astype(spec.dtype).astype(jnp.float32)


def _check(x: jax.Array, block_size: int, axis: int) -> int:
    if x.ndim < 1:
        raise ValueError(f"x has rank 0 (shape {x.shape}); MX quantisation needs rank >= 1")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x has dtype {x.dtype}; MX quantisation needs a floating array")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive int (the spec uses 32)")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for x of rank {x.ndim}")
    return axis % x.ndim


class _Blocks(NamedTuple):
    """x moved to [..., n_blocks, block_size] float32 blocks, with what is needed to undo it.

    `bits` are the float32 bit patterns; `amax_bits` ([..., n_blocks, 1], int32) the bit
    pattern of the block amax (max |x| over the block: compared as integers, so exact and
    never flushed; NaN sorts above inf).
    """

    x: jax.Array
    amax_bits: jax.Array
    shape: tuple
    axis: int


def _to_blocks(x: jax.Array, block_size: int, axis: int) -> _Blocks:
    """Splits x into blocks of `block_size` consecutive entries along `axis`.

    A ragged last block is padded with zeros (which leave its amax unchanged) and so has its
    own scale; `_from_blocks` slices the padding off again.
    """
    axis = _check(x, block_size, axis)
    xm = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    n = xm.shape[-1]
    n_blocks = -(-n // block_size)
    pad = n_blocks * block_size - n
    if pad:
        xm = jnp.pad(xm, [(0, 0)] * (xm.ndim - 1) + [(0, pad)])
    xb = xm.reshape(xm.shape[:-1] + (n_blocks, block_size))
    amax_bits = jnp.max((_bits(xb) & jnp.uint32(_ABS)).astype(jnp.int32), -1, keepdims=True)
    return _Blocks(xb, amax_bits, xm.shape[:-1] + (n,), axis)


def _from_blocks(v: jax.Array, blocks: _Blocks) -> jax.Array:
    """Inverse of `_to_blocks` for an array shaped like `blocks.x`."""
    n = blocks.shape[-1]
    v = v.reshape(v.shape[:-2] + (-1,))[..., :n]
    return jnp.moveaxis(v, -1, blocks.axis)


def _floor_log2(amax_bits: jax.Array) -> jax.Array:
    """floor(log2(a)) as int32 from the bit pattern of a finite a > 0 (subnormals included)."""
    field = amax_bits >> 23
    sub = 31 - lax.clz(amax_bits) - 149  # subnormal: a = m * 2^-149
    return jnp.where(field > 0, field - 127, sub).astype(jnp.int32)


def _scale_exponent(amax_bits: jax.Array, spec: _Format) -> jax.Array:
    """The E8M0 exponent e = clamp(floor(log2(amax)) - emax_elem, -127, 127), int32.

    An all-zero block gets e = -127 (any scale quantises it to 0).
    """
    e = jnp.clip(_floor_log2(amax_bits) - spec.emax, _E8M0_MIN, _E8M0_MAX)
    return jnp.where(amax_bits > 0, e, _E8M0_MIN)


def _block_finite(amax_bits: jax.Array) -> jax.Array:
    """True for a block without NaN or +-inf."""
    return amax_bits < _INF_BITS


def _quantize_blocks(blocks: _Blocks, spec: _Format) -> jax.Array:
    """Q_X on [..., n_blocks, block_size] float32 blocks: P_i * X, NaN for non-finite blocks."""
    e = _scale_exponent(blocks.amax_bits, spec)
    p = _round_to_grid(_ldexp(blocks.x, -e), spec)
    q = _ldexp(p, e)
    return jnp.where(_block_finite(blocks.amax_bits), q, jnp.nan)


@functools.partial(jax.jit, static_argnames=("fmt", "block_size", "axis"))
def quantize_mx(
    x: jax.Array, fmt: str = "mxfp4", block_size: int = 32, axis: int = -1
) -> jax.Array:
    """Fake-quantises x to an OCP MX format: returns the dequantised values P_i * X.

    OCP Microscaling Formats (MX) Specification v1.0, section 6.3. Per block of `block_size`
    consecutive entries along `axis`: amax = max |x_i|; shared scale X = 2^e with
    e = floor(log2(amax)) - emax_elem clamped to E8M0's [-127, 127]; P_i = x_i / X cast to
    the element format with round-to-nearest-even and saturation to +-max; output P_i * X.

    Edge cases:
    - an all-zero block gives zeros (its scale is 2^-127, never NaN or inf);
    - a block with a NaN gives NaN in all its entries (the spec's E8M0 NaN scale), other
      blocks are unaffected;
    - a block with +-inf is treated like NaN (interpretation: the spec leaves inf to the
      implementation; amax = inf has no finite scale, so the whole block becomes NaN);
    - a size along `axis` not divisible by `block_size` is padded with zeros; the last,
      partial block has its own scale;
    - computed in float32 (exactly, subnormals included, on every backend; see the module
      docstring), then cast to x.dtype. All MX values are float32-representable, and
      bfloat16-representable unless below bfloat16's normal range.

    Jit-compiled with fmt, block_size and axis static.

    Args:
      x: float array of rank >= 1, any shape [..., N, ...] with N along `axis`.
      fmt: "mxfp4" (E2M1 elements) or "mxfp8" (E4M3 elements).
      block_size: entries per shared scale (the spec's k = 32).
      axis: the axis along which blocks run (negative counts from the end).

    Returns:
      An array with x's shape and dtype: the dequantised values.

    Raises:
      ValueError: unknown fmt, block_size < 1, axis out of range or rank-0 x.
      TypeError: non-floating x.
    """
    spec = _get_format(fmt)
    blocks = _to_blocks(x, block_size, axis)
    return _from_blocks(_quantize_blocks(blocks, spec), blocks).astype(x.dtype)
