"""Tests for rljax.quant.mx against an independent numpy reference of the OCP MX v1.0
conversion (section 6.3): a brute-force E2M1 grid with ties to the even encoding, ml_dtypes'
float8_e4m3fn cast for E4M3, and scales from Python's math.frexp in float64."""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from rljax.quant import MX_FORMATS, quantize_mx

# E2M1 values by encoding index (the mantissa bit is the index's lowest bit).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
EMAX = {"mxfp4": 2, "mxfp8": 8}


def e2m1_round(y: float) -> float:
    """Nearest E2M1 value by brute force; a tie goes to the even encoding index; saturating."""
    a = abs(y)
    dist = np.abs(E2M1 - a)
    best = np.flatnonzero(dist == dist.min())
    idx = best[0] if len(best) == 1 else [i for i in best if i % 2 == 0][0]
    return math.copysign(float(E2M1[idx]), y)


def e4m3_round(y: float) -> float:
    """ml_dtypes' float8_e4m3fn cast (RNE) after saturating at +-448."""
    clipped = np.float32(min(max(y, -448.0), 448.0))
    return float(np.array(clipped).astype(ml_dtypes.float8_e4m3fn).astype(np.float64))


def reference_block(block: np.ndarray, fmt: str) -> np.ndarray:
    """One block in float64: scale 2^(floor(log2 amax) - emax) clamped to [-127, 127]."""
    vals = [float(v) for v in block]
    if any(not math.isfinite(v) for v in vals):
        return np.full(len(vals), np.nan)
    amax = max(abs(v) for v in vals)
    if amax == 0.0:
        return np.zeros(len(vals))
    _, exp = math.frexp(amax)  # amax = m * 2^exp, m in [0.5, 1): floor(log2 amax) = exp - 1
    e = min(max(exp - 1 - EMAX[fmt], -127), 127)
    scale = 2.0**e
    rnd = e2m1_round if fmt == "mxfp4" else e4m3_round
    return np.array([rnd(v / scale) * scale for v in vals])


def reference(x: np.ndarray, fmt: str, block_size: int, axis: int) -> np.ndarray:
    """quantize_mx by explicit loops over the lines along `axis` and their blocks."""
    xm = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    out = np.zeros(xm.shape)
    for idx in np.ndindex(xm.shape[:-1]):
        line = xm[idx]
        for start in range(0, len(line), block_size):
            out[idx][start : start + block_size] = reference_block(
                line[start : start + block_size], fmt
            )
    return np.moveaxis(out, -1, axis).astype(np.float32)


def wide_data(shape, seed, lo=-149, hi=120):
    """float32 data whose magnitudes vary widely between entries, with zeros and exact grid
    values, including blocks of subnormals and blocks near the top of the float32 range."""
    rng = np.random.default_rng(seed)
    base = rng.integers(lo, hi, shape[:-1] + (1,))
    x = rng.standard_normal(shape) * 2.0 ** (base + rng.integers(-10, 3, shape))
    grid = rng.choice(np.concatenate([E2M1, -E2M1]), shape) * 2.0**base
    x = np.where(rng.random(shape) < 0.2, grid, x)
    x = np.where(rng.random(shape) < 0.1, 0.0, x)
    return x.astype(np.float32)


def assert_bitwise(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# ----- against the reference -----


@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize(
    "shape, axis, block_size",
    [
        ((4, 37), -1, 32),  # ragged: a last block of 5
        ((4, 37), 1, 8),
        ((70,), 0, 32),
        ((13, 3), 0, 8),  # blocks along a leading axis
        ((2, 11, 3), -2, 4),
        ((2, 3, 9), 2, 1),  # one entry per block: each is its own amax
    ],
)
def test_matches_reference(fmt, shape, axis, block_size):
    x = wide_data(shape, seed=sum(shape) * 10 + block_size + len(fmt))
    got = quantize_mx(jnp.asarray(x), fmt, block_size, axis)
    assert got.shape == x.shape and got.dtype == jnp.float32
    ref = reference(x, fmt, block_size, axis)
    # Exact, and with the IEEE value for subnormal inputs and outputs on every backend.
    np.testing.assert_array_equal(np.asarray(got), ref)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_extreme_ranges_match_reference(fmt):
    tiny = wide_data((6, 32), seed=1, lo=-149, hi=-120)  # subnormal and clamped scales
    huge = wide_data((6, 32), seed=2, lo=110, hi=125)
    huge[0, 0] = np.finfo(np.float32).max
    for x in (tiny, huge):
        np.testing.assert_array_equal(np.asarray(quantize_mx(x, fmt)), reference(x, fmt, 32, -1))


# ----- element rounding and saturation -----


def test_mxfp4_ties_to_even_and_saturation():
    # amax = 5 -> floor(log2 5) = 2 -> X = 2^(2 - 2) = 1: the entries are the scaled values.
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5], np.float32)
    np.testing.assert_array_equal(quantize_mx(mids, block_size=9), [0, 1, 1, 2, 2, 4, 4, -0.0, -2])
    # amax = 7.9 -> X = 1; 7.9 and -7 saturate to +-6 (not NaN, not 8).
    x = np.array([7.9, -7.0, 6.5, 0.3], np.float32)
    np.testing.assert_array_equal(quantize_mx(x, block_size=4), [6, -6, 6, 0.5])
    # amax = 2.9 -> X = 2^(1 - 2) = 0.5; 2.9 / 0.5 = 5.8 -> 6 -> 3.0.
    np.testing.assert_array_equal(quantize_mx(np.float32([2.9, 1.1]), block_size=2), [3.0, 1.0])


def test_mxfp8_saturates_instead_of_nan():
    # amax = 500 -> floor(log2 500) = 8 -> X = 2^(8 - 8) = 1. jnp's float8_e4m3fn cast would
    # give NaN above 464; quantize_mx saturates. 464 is a tie between 448 and (unrepresentable)
    # 480: 448 by ties to even; 0.0029 = 1.48 * 2^-9 -> 2^-9 (E4M3's smallest subnormal).
    x = np.array([500.0, -465.0, 464.0, 300.0, 0.0029, 2.0**-10], np.float32)
    got = np.asarray(quantize_mx(x, "mxfp8", block_size=6))
    np.testing.assert_array_equal(got, [448, -448, 448, 288, 2.0**-9, 0.0])


# ----- edge cases -----


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_zero_nan_and_inf_blocks(fmt):
    x = np.tile(np.float32([1.0, -0.3, 2.5, 0.01]), (5, 1))
    x[0] = 0.0
    x[1, 2] = np.nan
    x[2, 0] = np.inf
    x[3, 3] = -np.inf
    got = np.asarray(quantize_mx(x, fmt, block_size=4))
    assert np.all(np.isfinite(got[0])) and np.all(got[0] == 0)  # zero block: no NaN scale
    assert np.all(np.isnan(got[1:4]))  # NaN, +inf and -inf poison their whole block
    np.testing.assert_array_equal(got[4], reference(x[4:], fmt, 4, -1)[0])  # others unaffected


def test_ragged_last_block_has_its_own_scale():
    x = wide_data((37,), seed=3, lo=-5, hi=5)
    x[35] = 1e4  # a large value in the last (partial) block of 5
    got = np.asarray(quantize_mx(x, block_size=32))
    np.testing.assert_array_equal(got[:32], np.asarray(quantize_mx(x[:32], block_size=32)))
    np.testing.assert_array_equal(got[32:], np.asarray(quantize_mx(x[32:], block_size=5)))


def test_dtype_shape_and_jit():
    x = jnp.asarray(wide_data((3, 40), seed=4, lo=-3, hi=3), jnp.bfloat16)
    got = quantize_mx(x, "mxfp4", 32, 1)
    assert got.dtype == jnp.bfloat16 and got.shape == (3, 40)
    ref = reference(np.asarray(x.astype(jnp.float32)), "mxfp4", 32, 1)
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), ref)
    inner = jax.jit(lambda v: quantize_mx(v * 2, "mxfp8", 8, 0))(x.astype(jnp.float32))
    assert inner.shape == (3, 40)
    # Idempotent: MX values are fixed points.
    q = quantize_mx(x.astype(jnp.float32))
    assert_bitwise(quantize_mx(q), q)


def test_errors():
    x = jnp.ones((4, 8))
    with pytest.raises(ValueError, match=r"fmt='nvfp4' is not an MX format.*mxfp4.*mxfp8"):
        quantize_mx(x, "nvfp4")
    with pytest.raises(ValueError, match="block_size=0 must be a positive int"):
        quantize_mx(x, block_size=0)
    with pytest.raises(ValueError, match="axis=2 is out of range for x of rank 2"):
        quantize_mx(x, axis=2)
    with pytest.raises(ValueError, match="rank 0"):
        quantize_mx(jnp.float32(1.0))
    with pytest.raises(TypeError, match="dtype int32.*floating"):
        quantize_mx(jnp.ones((4,), jnp.int32))
