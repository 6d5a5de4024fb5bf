"""rollout_weights: the sampler's (maybe fake-quantized) copy of the weights."""

import functools

import jax
import numpy as np
import pytest

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.quant import quantize_fp8, quantize_mx, rollout_weights
from rljax.quant.corrections import quantize_params

CONFIG = TransformerConfig(vocab_size=30, d_model=64, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)


def test_none_is_the_trainer_weights_and_formats_match_quantize_params():
    _, params = create_model(CONFIG, seed=0)
    assert rollout_weights(params, "none") is params
    for fmt, fn in (
        ("mxfp4", functools.partial(quantize_mx, fmt="mxfp4")),
        ("mxfp8", functools.partial(quantize_mx, fmt="mxfp8")),
        ("fp8", functools.partial(quantize_fp8, granularity="tensor")),
    ):
        got = jax.tree.leaves(rollout_weights(params, fmt))
        want = jax.tree.leaves(quantize_params(params, fn))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        changed = sum(
            not np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(got, jax.tree.leaves(params), strict=True)
        )
        assert changed > 0, fmt


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match="weight_format='int4' is unknown"):
        rollout_weights({}, "int4")
