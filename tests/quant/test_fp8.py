"""Tests for rljax.quant.fp8 against a numpy reference: scales from float32 numpy absmax
(per channel by an explicit loop over channels), ml_dtypes' FP8 casts after clipping."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.quant import quantize_fp8
from rljax.quant.fp8 import fp8_max

NP_DTYPE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def ref_group(g: np.ndarray, fmt: str) -> np.ndarray:
    """One scale group in numpy float32."""
    g = np.asarray(g, np.float32)
    amax = np.float32(np.max(np.abs(g)))
    if amax == 0:
        return np.zeros_like(g)
    scale = np.float32(amax / np.float32(MAX[fmt]))
    q = np.clip(g / scale, -MAX[fmt], MAX[fmt]).astype(NP_DTYPE[fmt]).astype(np.float32)
    return (q * scale).astype(np.float32)


def reference(x: np.ndarray, granularity: str, axis: int, fmt: str) -> np.ndarray:
    if granularity == "tensor":
        return ref_group(x, fmt)
    out = np.zeros_like(x, dtype=np.float32)
    for c in range(x.shape[axis]):
        idx = [slice(None)] * x.ndim
        idx[axis] = c
        out[tuple(idx)] = ref_group(x[tuple(idx)], fmt)
    return out


def test_fp8_max():
    assert fp8_max("e4m3") == 448.0
    assert fp8_max("e5m2") == 57344.0


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.sampled_from([(7,), (5, 9), (3, 4, 6)]),
    granularity=st.sampled_from(["tensor", "channel"]),
    fmt=st.sampled_from(["e4m3", "e5m2"]),
    log_scale=st.floats(-20, 20),
)
def test_matches_numpy_reference(seed, shape, granularity, fmt, log_scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(3, size=shape) * 2.0**log_scale).astype(np.float32)
    axis = int(rng.integers(-len(shape), len(shape)))
    out = np.asarray(quantize_fp8(jnp.asarray(x), granularity, axis, fmt))
    np.testing.assert_array_equal(out, reference(x, granularity, axis, fmt))


def test_amax_maps_to_max_and_saturation_no_nan():
    # Without the clip, e4m3 would turn values just above 448 (after rounding of the scale)
    # into NaN; the amax entry must come back as (almost exactly) itself.
    x = jnp.array([1e6, -3.0, 1e-3, -1e6 * (1 + 2**-20)], jnp.float32)
    out = np.asarray(quantize_fp8(x))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(np.abs(out[[0, 3]]), 1e6 * (1 + 2**-20), rtol=1e-6)


def test_per_channel_scales_are_independent():
    # Column 1 is 1000x column 0; per channel, column 0 keeps its relative precision.
    x = np.array([[0.3, 300.0], [0.1, 100.0], [-0.2, -200.0]], np.float32)
    per_ch = np.asarray(quantize_fp8(jnp.asarray(x), "channel", axis=-1))
    np.testing.assert_array_equal(per_ch[:, 0], ref_group(x[:, 0], "e4m3"))
    np.testing.assert_array_equal(per_ch[:, 1], ref_group(x[:, 1], "e4m3"))


def test_zero_tensor_and_zero_channel_give_zeros():
    np.testing.assert_array_equal(np.asarray(quantize_fp8(jnp.zeros((3, 4)))), 0)
    x = jnp.array([[0.0, 1.0], [0.0, -2.0]])
    out = np.asarray(quantize_fp8(x, "channel", axis=1))
    np.testing.assert_array_equal(out[:, 0], 0)
    np.testing.assert_array_equal(out[:, 1], [1.0, -2.0])


def test_nan_propagates_within_its_group_only():
    x = jnp.array([[1.0, jnp.nan], [2.0, 3.0]])
    assert np.all(np.isnan(np.asarray(quantize_fp8(x))))
    out = np.asarray(quantize_fp8(x, "channel", axis=1))
    assert np.all(np.isnan(out[:, 1]))
    np.testing.assert_array_equal(out[:, 0], [1.0, 2.0])


def test_dtype_preserved_bfloat16():
    x = jnp.linspace(-3, 3, 16).astype(jnp.bfloat16)
    out = quantize_fp8(x)
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(granularity="block"), "granularity"),
        (dict(fmt="e3m4"), "FP8 format"),
        (dict(granularity="channel", axis=2), "axis"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_fp8(jnp.ones((2, 3)), **kwargs)


def test_integer_input_is_a_type_error():
    with pytest.raises(TypeError):
        quantize_fp8(jnp.ones((2, 3), jnp.int32))
