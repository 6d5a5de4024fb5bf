"""Property tests over every public function of `rljax.quant`.

Fake quantisation (MX, FP8, macro-block MX, outlier fallback, the MX error decomposition,
params-pytree quantisation) on tensors with extreme magnitudes: +-3e38, subnormals, zeros,
all-equal blocks, ragged last blocks. Round trips must be finite, keep shape and dtype, map
zeros to zeros, keep signs and stay within the format's reach of the block amax; the
decomposition must add up bitwise. The mismatch corrections run on random batches (see
prop_cases.py) with log-prob gaps up to 30 nats.
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from prop_cases import (  # noqa: E402
    CTX,
    PROPS,
    assert_finite,
    assert_metrics,
    assert_token_field,
    build_batch,
    cases,
    jit_program,
)

from rljax import quant  # noqa: E402

SHAPE = (8, 48)  # along the last axis: one full block of 32 and a ragged one of 16
BLOCK = 32
REGIMES = ("normal", "huge", "subnormal", "zeros", "equal_blocks", "mixed")
# |q| / amax reachable after rounding: the largest element over 2^emax (6/4, 448/256).
MX_REACH = {"mxfp4": 1.5, "mxfp8": 1.75}


@st.composite
def tensors(draw):
    """[8, 48] float32 tensors with extreme magnitudes, built by numpy from drawn regimes."""
    regime = draw(st.sampled_from(REGIMES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(size=SHAPE)
    if regime == "huge":
        x = x / np.abs(x).max() * 3e38
    elif regime == "subnormal":
        x = x * 1e-40
    elif regime == "zeros":
        x[rng.random(SHAPE[0]) < 0.5] = 0.0
        x[:, BLOCK:] = 0.0
    elif regime == "equal_blocks":
        x[:, :BLOCK] = rng.choice([3e38, -1e-40, 1.0, 0.0])
    elif regime == "mixed":
        x = rng.choice([0.0, 3e38, -3e38, 1e-45, -1e-40, 1e-30, 1.0, 448.0, 6.0], size=SHAPE)
    return x.astype(np.float32)


def _array_program(x: jax.Array) -> dict:
    out = {}
    for fmt in quant.MX_FORMATS:
        q = quant.quantize_mx(x, fmt, BLOCK)
        out[fmt] = {
            "q": q,
            "again": quant.quantize_mx(q, fmt, BLOCK),
            "axis0": quant.quantize_mx(x, fmt, BLOCK, axis=0),
            "macro": quant.macro_block_quantize_mx(x, fmt, BLOCK, 64),
            "macro_row": quant.macro_block_quantize_mx(x, fmt, BLOCK, "row"),
            "outlier": quant.outlier_fallback_mx(x, 0.05, fmt, BLOCK),
            "parts": quant.decompose_mx(x, fmt, BLOCK),
            "metrics": quant.mx_error_metrics(x, fmt, BLOCK),
        }
    for fmt in quant.FP8_FORMATS:
        out[fmt] = {g: quant.quantize_fp8(x, g, 0, fmt) for g in ("tensor", "channel")}
    params = {
        "attn": {"q_proj": x.reshape(48, 2, 4), "o_proj": x.reshape(2, 24, 8)},
        "attn_norm": {"weight": x[0]},
    }
    out["params"] = quant.quantize_params(params, functools.partial(quant.quantize_mx, fmt="mxfp4"))
    out["noisy"] = quant.add_norm_noise(params, jax.random.PRNGKey(1), 1e-2)
    out["sigma"] = [quant.aqn_sigma(jnp.int32(s), 10) for s in (0, 1, 5, 9, 10, 1000)]
    out["rollout"] = {}
    for fmt in ("mxfp4", "mxfp8", "fp8"):
        for correction in quant.WEIGHT_CORRECTIONS if fmt != "fp8" else ("none",):
            weights = quant.RolloutWeights(fmt, correction, 64, 0.05, 1e-2, 1e-4, 4, 10)
            out["rollout"][f"{fmt}_{correction}"] = quant.rollout_weights(
                params, weights, jnp.int32(5), jax.random.PRNGKey(2)
            )
    out["error_metrics"] = {
        fmt: quant.rollout_error_metrics(params, quant.RolloutWeights(fmt))
        for fmt in quant.WEIGHT_FORMATS
    }
    return out


_arrays = jax.jit(_array_program)


def _np(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def _block_amax(x: np.ndarray) -> np.ndarray:
    """[8, 48] -> [8, 48] max |x| of each entry's block of 32 along the last axis."""
    a = np.abs(x)
    out = np.empty_like(a)
    for start in range(0, x.shape[1], BLOCK):
        out[:, start : start + BLOCK] = a[:, start : start + BLOCK].max(axis=1, keepdims=True)
    return out


@PROPS
@given(x=tensors())
def test_mx_round_trip_is_finite_bounded_and_idempotent(x):
    out = _np(_arrays(x))
    amax = _block_amax(x).astype(np.float64)  # float64: 1.5 * 3e38 must not overflow
    for fmt in quant.MX_FORMATS:
        o = out[fmt]
        for key in ("q", "axis0", "macro", "macro_row", "outlier"):
            q = o[key]
            assert q.shape == x.shape and q.dtype == np.float32, (fmt, key)
            assert_finite(q, f"{fmt} {key}")
            assert np.all(q[x == 0] == 0), f"{fmt} {key}: zeros did not stay zero"
            assert np.all(np.sign(q) * np.sign(x) >= 0), f"{fmt} {key}: a sign flipped"
        q = o["q"]
        assert np.all(np.abs(q) <= MX_REACH[fmt] * amax + 2.0**-126), fmt
        np.testing.assert_array_equal(o["again"], q)  # values on the grid stay put
        # The decomposition adds up to the error bitwise (IEEE float32, numpy).
        sb, dz, gn = o["parts"]
        assert_finite((sb, dz, gn), f"{fmt} decomposition")
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal((sb + dz) + gn, q - x)
        # The norms are float32: they exist only while the true (float64) norms fit, which
        # the error components' norms (each at most ~|x|) do when 4 ||x|| < float32 max.
        if 4 * np.linalg.norm(x.astype(np.float64)) < np.finfo(np.float32).max:
            assert_metrics(o["metrics"])
        assert 0 <= o["metrics"]["deadzone_frac"] <= 1


@PROPS
@given(x=tensors())
def test_fp8_round_trip_is_finite_and_within_amax(x):
    out = _np(_arrays(x))
    for fmt in quant.FP8_FORMATS:
        for granularity, q in out[fmt].items():
            assert q.shape == x.shape and q.dtype == np.float32
            assert_finite(q, f"{fmt} {granularity}")
            assert np.all(q[x == 0] == 0) and np.all(np.sign(q) * np.sign(x) >= 0)
            a = np.abs(x).astype(np.float64)
            amax = a.max() if granularity == "tensor" else a.max(axis=1)[:, None]
            assert np.all(np.abs(q) <= amax * (1 + 1e-6)), (fmt, granularity)


@PROPS
@given(x=tensors())
def test_params_quantisation_and_noise(x):
    out = _np(_arrays(x))
    params = {"q_proj": x.reshape(48, 2, 4), "o_proj": x.reshape(2, 24, 8), "weight": x[0]}
    q = out["params"]
    np.testing.assert_array_equal(q["attn_norm"]["weight"], params["weight"])  # not a kernel
    for name in ("q_proj", "o_proj"):
        assert q["attn"][name].shape == params[name].shape
        assert_finite(q["attn"][name], name)
    noisy = out["noisy"]
    np.testing.assert_array_equal(noisy["attn"]["q_proj"], params["q_proj"])  # not a norm
    assert noisy["attn_norm"]["weight"].shape == (48,)
    sigma = np.array(out["sigma"])
    assert_finite(sigma, "aqn_sigma")
    assert sigma[0] == 0 and np.all(sigma >= 0) and np.all(np.diff(sigma[1:]) <= 0)
    for name, tree in out["rollout"].items():
        assert jax.tree_util.tree_structure(tree) == jax.tree_util.tree_structure(q), name
        assert_finite(tree["attn"], name)
    # Excluded: |w| > ~1.8e19, where the implementation's sums of squares overflow float32
    # (the relative errors themselves exist; see the report). No real kernel gets there.
    if np.abs(x).max() < 1e18:
        for fmt, metrics in out["error_metrics"].items():
            assert_metrics(metrics)
            assert (fmt == "none") == (metrics == {})
    assert quant.is_norm_weight(("attn_norm", "weight")) and not quant.is_norm_weight(("q_proj",))
    assert quant.transformer_reduction_axes(("attn", "o_proj"), None) == 2


def _mismatch_program(a: dict, g: int) -> dict:
    del g
    batch = build_batch(a)
    mask = a["completion_mask"]
    out = {
        "token": quant.token_log_ratio(batch),
        "sequence": {r: quant.sequence_log_ratio(batch, r) for r in quant.mismatch.SEQUENCE_RATIOS},
        "metrics": quant.mismatch_metrics(batch),
        "ess": quant.effective_sample_size(
            jnp.exp(a["old_logprobs"] - a["rollout_logprobs"]), mask
        ),
        "lambda": quant.ais_lambda(quant.token_log_ratio(batch), a["advantages"], mask, 0.01),
        "transforms": {},
    }
    transforms = {
        "adaptive_is": quant.adaptive_is(),
        "adaptive_is_fixed": quant.adaptive_is(2.0, 0.01, 1.0),
    }
    for level in quant.mismatch.LEVELS:
        for ratio in quant.mismatch.SEQUENCE_RATIOS:
            transforms[f"tis_{level}_{ratio}"] = quant.truncated_is(2.0, level, ratio)
            transforms[f"mis_{level}_{ratio}"] = quant.masked_is(0.5, 2.0, level, ratio)
    for name, t in transforms.items():
        out["transforms"][name] = t.apply(batch, t.init(), CTX)
    return out


run_mismatch = jit_program(_mismatch_program)


@PROPS
@given(case=cases())
def test_mismatch_corrections_are_finite_and_bounded(case):
    out, mask = run_mismatch(case), case.completion_mask
    assert_token_field(out["token"], mask, "token_log_ratio")
    assert np.all(np.abs(out["token"]) <= 20)
    for seq in out["sequence"].values():
        assert seq.shape == case.rewards.shape and np.all(np.abs(seq) <= 20)
    assert_metrics(out["metrics"])
    assert 0 < out["ess"] <= 1 + 1e-6
    lam, metrics = out["lambda"]
    assert_metrics(metrics)
    assert 0 <= lam <= 1
    for name, (batch, state, metrics) in out["transforms"].items():
        assert state == ()
        assert_metrics(metrics)
        weights = np.asarray(batch.loss_weights)
        assert_token_field(weights, mask, f"{name} loss_weights")
        if name.startswith("mis"):
            assert np.all((weights == 0) | (weights == mask))
        else:
            w = np.asarray(batch.extras["is_weight"])
            assert_token_field(w, mask, f"{name} is_weight", zero_off_mask=False)
            assert np.all(w[~mask] == 1) and np.all((w >= 0) & (w <= 2.0 + 1e-6))
