"""An exact three-way decomposition of the MX quantisation error: scale bias, deadzone, grid noise.

Interpretation of "MXFP4 error decomposition" (arXiv 2605.20402), whose code is not public.
Per block, with amax = max |x_i|:
- s* = amax / max_elem, the ideal (unrounded) scale that maps amax onto the largest element
  (6 for E2M1, 448 for E4M3);
- X = 2^e, the power-of-two E8M0 scale of `rljax.quant.mx.quantize_mx`;
- Q_s(x) = s * grid(x / s), grid = nearest element value, ties to even, saturating at +-max;
  Q_X is exactly `quantize_mx`;
- d = the smallest positive midpoint of the element grid, half the smallest subnormal
  element (0.25 for E2M1, 2^-10 for E4M3); entries with |x / s*| < d are the deadzone.

The error Q_X(x) - x splits into
- scale_bias = Q_X(x) - Q_{s*}(x): the error from rounding the scale to a power of two;
- deadzone   = -x * 1{|x / s*| < d}: small entries that the ideal scale zeroes;
- grid_noise = (Q_{s*}(x) - x) * 1{|x / s*| >= d}: rounding to the element grid.

Precisely, all three are float32 values and x / s* means the float32 quotient, the very
value `grid` rounds, so the deadzone is exactly where grid(x / s*) = 0 below the first
midpoint (an entry exactly at the midpoint, x / s* = +-d, rounds to 0 too, by ties to even;
it counts as grid noise, equal to -x). s* and Q_{s*}(x) are float32 roundings of amax / max
and s* * grid(x / s*) (computed on the block scaled by a power of two, which changes no
rounding but avoids the subnormal flushing of XLA:CPU; Q_{s*}(x) is rounded to float32 once).

Exactness: scale_bias + deadzone + grid_noise == quantize_mx(x) - x bitwise in IEEE float32
(numpy) for every finite x, summed as (scale_bias + deadzone) + grid_noise. With q = Q_X(x),
r = Q_{s*}(x), both float32:
- in the deadzone, r = +-0, so scale_bias = q exactly and grid_noise = +0; the sum is
  fl(q - x), the same single rounding as quantize_mx(x) - x;
- elsewhere deadzone = +0 and the sum is fl((q - r) + (r - x)); both differences are exact
  float32 values, so the sum is fl(q - x). r - x is exact by Sterbenz's lemma: r and x have
  the same sign and r / 2 <= x <= 2 r, since every element value g >= smallest subnormal has
  the rounding interval [g - gap/2, g + gap/2] within [g / 2, 3 g / 2] (and a saturated
  x / s* exceeds max by float32 rounding only). q - r is exact because q = P * 2^e has few
  significant bits (P an element value), so q is a multiple of ulp(r), and
  |q - r| < 2^(floor(log2|r|) + 1): |q| <= |r| trivially, and |q| > |r| only with
  |q| / |r| <= 1.75 (q / r = (g_q / u) / (g_r / v) for u = x / X, v = x / s*; the scale
  ratio X / s* lies in (3/4, 3/2] for E2M1 and (7/8, 7/4] for E4M3, and the relative
  rounding g / w of a nonzero element is in [2/3, 2) with values above 4/3 only in the first
  grid interval, so the quotient stays below 2 in every case; for clamped or subnormal
  scales all values are below 2^-124 and differences of multiples of 2^-149 are exact).
The components are computed exactly (differences on the block scaled into the normal
range, then scaled back on the bit patterns), so the identity holds on every backend.
It is also checked numerically (hypothesis) in tests/quant/test_decompose.py. Evaluating
the sum itself on XLA:CPU (which flushes subnormals) can differ where a component is
subnormal (|value| < 2^-126, blocks with amax below about 2^-90).

Non-finite blocks (NaN or +-inf anywhere) give NaN in all three components.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.quant.mx import (
    _ABS,
    _bits,
    _block_finite,
    _Blocks,
    _floor_log2,
    _from_bits,
    _from_blocks,
    _get_format,
    _ldexp,
    _neg,
    _quantize_blocks,
    _round_to_grid,
    _to_blocks,
)


class MXError(NamedTuple):
    """The three parts of quantize_mx(x) - x, float32 arrays shaped like x."""

    scale_bias: jax.Array
    deadzone: jax.Array
    grid_noise: jax.Array


def _decompose_blocks(blocks: _Blocks, fmt: str):
    """(scale_bias, deadzone, grid_noise, q) on [..., n_blocks, block_size] float32 blocks."""
    spec = _get_format(fmt)
    x = blocks.x
    q = _quantize_blocks(blocks, spec)
    finite = _block_finite(blocks.amax_bits)
    nonzero = blocks.amax_bits > 0
    # Scale each block by 2^k so that its amax is in [1, 2): exact, and no value that takes
    # part in an inexact-looking operation below is subnormal.
    k = jnp.where(finite & nonzero, -_floor_log2(blocks.amax_bits), 0)
    amax_k = _ldexp(_from_bits(blocks.amax_bits), k)
    s_k = jnp.where(finite & nonzero, amax_k / spec.max, 1.0)  # s* * 2^k
    x_k = _ldexp(x, k)
    y = x_k / s_k  # x / s*, as rounded by the grid
    dead = jnp.abs(y) < spec.deadzone
    r = _ldexp(s_k * _round_to_grid(y, spec), -k)  # Q_{s*}(x), one float32 rounding
    r_k = _ldexp(r, k)
    scale_bias = _ldexp(_ldexp(q, k) - r_k, -k)
    grid_noise = jnp.where(dead, 0.0, _ldexp(r_k - x_k, -k))
    deadzone = jnp.where(dead, _neg(x), 0.0)
    nan = jnp.float32(jnp.nan)
    return (
        jnp.where(finite, scale_bias, nan),
        jnp.where(finite, deadzone, nan),
        jnp.where(finite, grid_noise, nan),
        q,
    )


@functools.partial(jax.jit, static_argnames=("fmt", "block_size", "axis"))
def decompose_mx(x: jax.Array, fmt: str = "mxfp4", block_size: int = 32, axis: int = -1) -> MXError:
    """Splits the MX quantisation error quantize_mx(x) - x into three exact parts.

    Interpretation of arXiv 2605.20402 ("MXFP4 error decomposition"); definitions and the
    proof of exactness are in the module docstring. In short, with s* = amax / max_elem the
    ideal block scale and X the E8M0 power-of-two scale:
    scale_bias = Q_X(x) - Q_{s*}(x); deadzone = -x where |x / s*| < d (d = 0.25 for E2M1);
    grid_noise = Q_{s*}(x) - x elsewhere; and, bitwise in IEEE float32,
    (scale_bias + deadzone) + grid_noise == quantize_mx(x, fmt, block_size, axis) - x.

    Jit-compiled with fmt, block_size and axis static.

    Args:
      x: float array of rank >= 1 (computed in float32).
      fmt: "mxfp4" or "mxfp8".
      block_size: entries per shared scale (the spec's 32).
      axis: the axis along which blocks run.

    Returns:
      `MXError` of float32 arrays shaped like x; NaN in blocks that hold a NaN or +-inf.
      An all-zero block gives zeros; a block whose amax is 6 * 2^j (E2M1) has X = s* and
      zero scale_bias.

    Raises:
      ValueError: unknown fmt, block_size < 1, axis out of range or rank-0 x.
      TypeError: non-floating x.
    """
    blocks = _to_blocks(x, block_size, axis)
    parts = _decompose_blocks(blocks, fmt)[:3]
    return MXError(*(_from_blocks(p, blocks) for p in parts))


def _norm(v: jax.Array) -> jax.Array:
    """L2 norm of all entries, scaled by the largest |v| so squares cannot overflow."""
    m = jnp.max(jnp.abs(v))
    safe = jnp.where(m > 0, m, 1.0)
    return jnp.where(m > 0, m * jnp.sqrt(jnp.sum(jnp.square(v / safe))), m)


@functools.partial(jax.jit, static_argnames=("fmt", "block_size", "axis"))
def mx_error_metrics(
    x: jax.Array, fmt: str = "mxfp4", block_size: int = 32, axis: int = -1
) -> dict[str, jax.Array]:
    """Per-tensor summaries of `decompose_mx`, for logging per layer.

    Args:
      x: float array of rank >= 1 (e.g. a weight matrix).
      fmt, block_size, axis: as for `quantize_mx`.

    Returns:
      float32 scalars: "scale_bias_norm", "deadzone_norm", "grid_noise_norm" (L2 norms of
      the components), "error_norm" (L2 norm of quantize_mx(x) - x) and "deadzone_frac" (the
      fraction of the nonzero entries of x that fall in the deadzone; 0 if x is all zero).
      NaN norms if x holds a NaN or +-inf.

    Raises:
      As `decompose_mx`.
    """
    blocks = _to_blocks(x, block_size, axis)
    scale_bias, deadzone, grid_noise, q = _decompose_blocks(blocks, fmt)
    # Counted on the bit patterns: XLA:CPU would read subnormals as zero.
    nonzero = (_bits(blocks.x) & _ABS) != 0
    n_nonzero = jnp.sum(nonzero)
    n_dead = jnp.sum(nonzero & ((_bits(deadzone) & _ABS) != 0))
    return {
        "scale_bias_norm": _norm(scale_bias),
        "deadzone_norm": _norm(deadzone),
        "grid_noise_norm": _norm(grid_noise),
        "error_norm": _norm(q - blocks.x),
        "deadzone_frac": jnp.where(n_nonzero > 0, n_dead / jnp.maximum(n_nonzero, 1), 0.0),
    }
