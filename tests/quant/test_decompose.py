"""Tests for rljax.quant.decompose: the exact identity scale_bias + deadzone + grid_noise ==
quantize_mx(x) - x (bitwise, hypothesis), the zero cases, a hand-computed MXFP4 example and
the logged metrics against numpy."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.quant import MX_FORMATS, decompose_mx, mx_error_metrics, quantize_mx

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def parts(x, fmt="mxfp4", block_size=8, axis=-1):
    return tuple(np.asarray(p) for p in decompose_mx(jnp.asarray(x), fmt, block_size, axis))


def assert_exact(x, fmt, block_size, axis=-1):
    """(scale_bias + deadzone) + grid_noise == quantize_mx(x) - x, bitwise in IEEE float32."""
    x = np.asarray(x, np.float32)
    sb, dz, gn = parts(x, fmt, block_size, axis)
    assert sb.shape == dz.shape == gn.shape == x.shape
    assert sb.dtype == dz.dtype == gn.dtype == np.float32
    lhs = (sb + dz) + gn
    rhs = np.asarray(quantize_mx(x, fmt, block_size, axis)) - x
    np.testing.assert_array_equal(lhs.view(np.uint32), rhs.view(np.uint32))


# ----- exactness -----

# A few fixed shapes so that each is compiled once; 37 is ragged for both block sizes.
SHAPES = [(37,), (3, 13)]


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(
        st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
        min_size=37,
        max_size=37,
    ),
    fmt=st.sampled_from(MX_FORMATS),
    block_size=st.sampled_from([8, 32]),
)
def test_exact_identity_any_floats(values, fmt, block_size):
    assert_exact(np.array(values, np.float32), fmt, block_size)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from(SHAPES),
    fmt=st.sampled_from(MX_FORMATS),
    block_size=st.sampled_from([8, 32]),
    lo=st.sampled_from([-149, -130, -40, 0, 100]),
)
def test_exact_identity_structured_blocks(seed, shape, fmt, block_size, lo):
    """Blocks of similar magnitudes (so all three parts are active), from subnormal to huge,
    with zeros, exact grid values, midpoints of the E2M1 grid and subnormal entries."""
    rng = np.random.default_rng(seed)
    base = rng.integers(lo, min(lo + 40, 124), shape[:-1] + (1,))
    x = rng.standard_normal(shape) * 2.0 ** (base + rng.integers(-6, 3, shape))
    grid = rng.choice(np.concatenate([E2M1, -E2M1, [0.25, 0.75, 2.5, 5.0]]), shape) * 2.0**base
    x = np.where(rng.random(shape) < 0.25, grid, x)
    x = np.where(rng.random(shape) < 0.1, 0.0, x)
    x = np.where(rng.random(shape) < 0.05, rng.standard_normal(shape) * 2.0**-140, x)
    assert_exact(x.astype(np.float32), fmt, block_size)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_exact_identity_along_other_axes(fmt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((13, 3, 2)) * 2.0 ** rng.integers(-20, 20, (1, 3, 2))).astype(
        np.float32
    )
    assert_exact(x, fmt, 8, axis=0)
    assert_exact(x, fmt, 4, axis=1)


# ----- the zero cases -----


@pytest.mark.parametrize("k", [-120, -7, 0, 3, 120])
def test_no_scale_bias_when_amax_is_six_times_a_power_of_two(k):
    # amax = 6 * 2^k: X = 2^(floor(log2 amax) - 2) = 2^k = amax / 6 = s*.
    rng = np.random.default_rng(k + 200)
    x = (rng.uniform(-6, 6, 16) * 2.0**k).astype(np.float32)
    x[5] = -6 * 2.0**k
    sb, dz, gn = parts(x, block_size=16)
    assert np.all(sb == 0)
    assert np.any(dz != 0) or np.any(gn != 0)  # the rest of the error is still there
    assert_exact(x, "mxfp4", 16)


def test_no_deadzone_above_threshold_and_no_grid_noise_on_grid():
    s = np.float32(np.float32(2.9) / np.float32(6))  # s* of a block with amax = 2.9
    on_grid = (s * np.float32(E2M1[1:-1])).astype(np.float32)  # s* * {0.5, ..., 4}: < 2.9
    x = np.concatenate([[2.9], on_grid, -on_grid, [0.0]]).astype(np.float32)  # 14 entries
    sb, dz, gn = parts(x, block_size=14)
    np.testing.assert_array_equal(gn[1:13], 0)  # already on the grid at scale s*
    np.testing.assert_array_equal(dz, 0)  # every |x| >= 0.25 s*, or x = 0
    assert np.any(sb != 0)  # X = 0.5 != s*


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_zero_block_has_zero_parts_and_nonfinite_blocks_are_nan(fmt):
    x = np.zeros((4, 8), np.float32)
    x[1] = np.linspace(-1, 1, 8)
    x[2, 3] = np.nan
    x[3, 0] = -np.inf
    sb, dz, gn = parts(x, fmt, 8)
    for p in (sb, dz, gn):
        np.testing.assert_array_equal(p[0], 0)
        assert np.all(np.isfinite(p[1]))
        assert np.all(np.isnan(p[2:]))
    assert_exact(x[:2], fmt, 8)


# ----- a hand-computed example -----


def test_hand_example():
    # Block 1: amax = 2.9 -> floor(log2 2.9) = 1 -> X = 2^(1 - 2) = 0.5; s* = 2.9 / 6 = 0.48333.
    # Block 2: amax = 3.5 -> X = 0.5; s* = 3.5 / 6 = 0.58333 > X.
    x = np.float32([[2.9, 1.0, 0.3, -0.1, 0.13, 0.115, 0.0, -2.0], [3.5, 0.13] + [0.0] * 6])
    sb, dz, gn = parts(x, block_size=8)
    s1 = 2.9 / 6
    expected = {
        # 2.9: Q_X = 0.5 * round(5.8) = 0.5 * 6 = 3.0; Q_s* = s1 * round(6) = 2.9.
        (0, 0): (3.0 - 2.9, 0.0, 0.0),
        # 1.0: Q_X = 0.5 * 2 = 1.0; 1 / s1 = 2.069 -> 2: Q_s* = 2 s1 = 0.96667.
        (0, 1): (1.0 - 2 * s1, 0.0, 2 * s1 - 1.0),
        # 0.3: 0.3 / 0.5 = 0.6 -> 0.5: Q_X = 0.25; 0.3 / s1 = 0.621 -> 0.5: Q_s* = 0.24167.
        (0, 2): (0.25 - 0.5 * s1, 0.0, 0.5 * s1 - 0.3),
        # -0.1: |-0.1| / s1 = 0.207 < 0.25: deadzone; -0.1 / 0.5 = -0.2 -> 0 = Q_X.
        (0, 3): (0.0, 0.1, 0.0),
        # 0.13: 0.13 / s1 = 0.269 >= 0.25 -> 0.5: Q_s* = 0.24167; 0.13 / 0.5 = 0.26 -> 0.5.
        (0, 4): (0.25 - 0.5 * s1, 0.0, 0.5 * s1 - 0.13),
        # 0.115: 0.115 / s1 = 0.238 < 0.25: deadzone; 0.23 -> 0 = Q_X.
        (0, 5): (0.0, -0.115, 0.0),
        # -2.0: Q_X = 0.5 * -4 = -2; -2 / s1 = -4.14 -> -4: Q_s* = -4 s1 = -1.93333.
        (0, 7): (-2.0 + 4 * s1, 0.0, -4 * s1 + 2.0),
        # 3.5: 3.5 / 0.5 = 7 -> saturates at 6: Q_X = 3.0; Q_s* = 6 * (3.5 / 6) = 3.5.
        (1, 0): (3.0 - 3.5, 0.0, 0.0),
        # 0.13: 0.13 / (3.5 / 6) = 0.223 < 0.25: deadzone, yet 0.13 / 0.5 = 0.26 -> 0.5: Q_X = 0.25,
        # so the power-of-two scale revives it: scale bias 0.25 - 0.
        (1, 1): (0.25, -0.13, 0.0),
    }
    for idx, (e_sb, e_dz, e_gn) in expected.items():
        np.testing.assert_allclose([sb[idx], dz[idx], gn[idx]], [e_sb, e_dz, e_gn], atol=1e-6)
    np.testing.assert_array_equal([sb[0, 6], dz[0, 6], gn[0, 6]], 0)
    assert_exact(x, "mxfp4", 8)


# ----- the metrics -----


def test_metrics_against_numpy():
    x = np.float32([[2.9, 1.0, 0.3, -0.1, 0.13, 0.115, 0.0, -2.0], [3.5, 0.13] + [0.0] * 6])
    m = mx_error_metrics(jnp.asarray(x), "mxfp4", 8)
    sb, dz, gn = parts(x, block_size=8)
    err = np.asarray(quantize_mx(x, block_size=8), np.float64) - x
    for key, v in [("scale_bias", sb), ("deadzone", dz), ("grid_noise", gn)]:
        np.testing.assert_allclose(m[f"{key}_norm"], np.linalg.norm(v.astype(np.float64)), 1e-6)
    np.testing.assert_allclose(m["error_norm"], np.linalg.norm(err), rtol=1e-6)
    # Nonzero entries: 7 + 2; in the deadzone: -0.1, 0.115 and block 2's 0.13.
    np.testing.assert_allclose(m["deadzone_frac"], 3 / 9, rtol=1e-6)
    assert set(m) == {
        "scale_bias_norm",
        "deadzone_norm",
        "grid_noise_norm",
        "error_norm",
        "deadzone_frac",
    }
    zero = mx_error_metrics(jnp.zeros((2, 8)), "mxfp4", 8)
    assert all(float(v) == 0.0 for v in zero.values())
    # Scaled by 2^100 (MX commutes with powers of two): the squares would overflow float32,
    # the norms are scaled by the largest entry so they do not.
    big = mx_error_metrics(jnp.asarray(x * np.float32(2.0**100)), "mxfp4", 8)
    np.testing.assert_allclose(big["error_norm"], np.linalg.norm(err) * 2.0**100, rtol=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="fmt='fp4' is not an MX format"):
        decompose_mx(jnp.ones(8), "fp4")
    with pytest.raises(ValueError, match="axis=-2 is out of range"):
        mx_error_metrics(jnp.ones(8), axis=-2)
