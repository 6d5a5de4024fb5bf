"""rollout_weights and rollout_error_metrics: the sampler's (maybe fake-quantized) weights."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, unstack_layers
from rljax.quant import (
    aqn_sigma,
    decompose_mx,
    macro_block_quantize_mx,
    outlier_fallback_mx,
    quantize_fp8,
    quantize_mx,
    rollout_error_metrics,
    rollout_weights,
)
from rljax.quant.corrections import is_norm_weight, path_names, quantize_params
from rljax.quant.rollout import RolloutWeights

CONFIG = TransformerConfig(vocab_size=30, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)
KERNELS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


@pytest.fixture(scope="module")
def params():
    return create_model(CONFIG, seed=0)[1]


def leaves(tree):
    """The leaves, one layer at a time from the stacked blocks."""
    return [np.asarray(x) for x in jax.tree.leaves(unstack_layers(nnx.to_pure_dict(tree)))]


def test_formats_and_corrections_match_quantize_params(params):
    assert rollout_weights(params, RolloutWeights()) is params
    for weights, fn in (
        (RolloutWeights("mxfp4"), functools.partial(quantize_mx, fmt="mxfp4")),
        (RolloutWeights("mxfp8"), functools.partial(quantize_mx, fmt="mxfp8")),
        (RolloutWeights("fp8"), functools.partial(quantize_fp8, granularity="tensor")),
        (
            RolloutWeights("mxfp4", "macro_block", macro_block=64),
            functools.partial(macro_block_quantize_mx, macro_block=64),
        ),
        (
            RolloutWeights("mxfp4", "outlier_fallback", outlier_fraction=0.02),
            functools.partial(outlier_fallback_mx, fraction=0.02),
        ),
    ):
        got, want = leaves(rollout_weights(params, weights)), leaves(quantize_params(params, fn))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        changed = sum(not np.array_equal(a, b) for a, b in zip(got, leaves(params), strict=True))
        assert changed == (len(KERNELS) - 1) * CONFIG.n_layers + 1, weights


def test_aqn_noises_only_the_norm_weights_on_its_schedule(params):
    weights = RolloutWeights("mxfp4", aqn_sigma_start=0.1, aqn_sigma_end=0.01, total_steps=100)
    plain = jax.tree_util.tree_flatten_with_path(
        unstack_layers(nnx.to_pure_dict(rollout_weights(params, RolloutWeights("mxfp4"))))
    )
    rng = jax.random.PRNGKey(3)
    for step in (0, 10, 95):
        noisy = leaves(rollout_weights(params, weights, step, rng))
        sigma = float(aqn_sigma(step, 100, 0.1, 0.01))
        for (path, a), b in zip(plain[0], noisy, strict=True):
            diff = b - np.asarray(a)
            if is_norm_weight(path_names(path)) and sigma > 0:
                # 64 draws of N(0, sigma^2): the sample std is within 35% of sigma.
                assert abs(diff.std() / sigma - 1.0) < 0.35, (path, step)
            else:
                np.testing.assert_array_equal(diff, 0.0)
    with pytest.raises(ValueError, match="needs an rng"):
        rollout_weights(params, weights, 10)


def test_error_metrics_match_numpy_per_kind_of_kernel(params):
    metrics = jax.jit(rollout_error_metrics, static_argnums=1)(params, RolloutWeights("mxfp4"))
    flat = jax.tree_util.tree_flatten_with_path(unstack_layers(nnx.to_pure_dict(params)))[0]
    total = {"w": 0.0, "err": 0.0, "scale_bias": 0.0, "dead": 0, "size": 0}
    for kind in KERNELS:
        w2 = err2 = sb2 = 0.0
        dead = size = 0
        for path, leaf in flat:
            if path_names(path)[-1] != kind:
                continue
            r = 2 if kind == "o_proj" else 1  # leading axes contracted with the input
            x = leaf.reshape((int(np.prod(leaf.shape[:r])),) + leaf.shape[r:])
            w = np.asarray(x, np.float64)
            q = np.asarray(quantize_mx(x, axis=0), np.float64)
            parts = decompose_mx(x, axis=0)
            w2 += (w**2).sum()
            err2 += ((q - w) ** 2).sum()
            sb2 += (np.asarray(parts.scale_bias, np.float64) ** 2).sum()
            dead += int((np.asarray(parts.deadzone) != 0).sum())
            size += w.size
        np.testing.assert_allclose(
            metrics[f"quant/{kind}/rel_error"], np.sqrt(err2 / w2), rtol=1e-4
        )
        np.testing.assert_allclose(
            metrics[f"quant/{kind}/scale_bias"], np.sqrt(sb2 / w2), rtol=1e-4
        )
        np.testing.assert_allclose(metrics[f"quant/{kind}/deadzone_frac"], dead / size, rtol=1e-5)
        for key, value in (("w", w2), ("err", err2), ("scale_bias", sb2), ("dead", dead)):
            total[key] += value
        total["size"] += size
    np.testing.assert_allclose(
        metrics["quant/rel_error"], np.sqrt(total["err"] / total["w"]), rtol=1e-4
    )
    np.testing.assert_allclose(
        metrics["quant/deadzone_frac"], total["dead"] / total["size"], rtol=1e-5
    )
    # MXFP4 on Gaussian-initialised kernels: a few percent error, all three components present.
    assert 0.01 < float(metrics["quant/rel_error"]) < 0.3
    for key in ("scale_bias", "deadzone", "grid_noise"):
        assert float(metrics[f"quant/{key}"]) > 0, key
    assert rollout_error_metrics(params, RolloutWeights()) == {}
    fp8 = rollout_error_metrics(params, RolloutWeights("fp8"))
    assert set(fp8) == {f"quant/{k}/rel_error" for k in KERNELS} | {"quant/rel_error"}


def test_corrections_lower_the_applied_error(params):
    plain = rollout_error_metrics(params, RolloutWeights("mxfp4"))
    np.testing.assert_allclose(plain["quant/rel_error"], plain["quant/mx_error"], rtol=1e-6)
    outlier = rollout_error_metrics(
        params, RolloutWeights("mxfp4", "outlier_fallback", outlier_fraction=0.05)
    )
    np.testing.assert_allclose(outlier["quant/mx_error"], plain["quant/mx_error"], rtol=1e-6)
    assert float(outlier["quant/rel_error"]) < float(plain["quant/rel_error"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(format="int4"), "weight_format='int4' is unknown"),
        (dict(format="mxfp4", correction="magic"), "weight_correction='magic' is unknown"),
        (dict(format="fp8", correction="macro_block"), "needs weight_format mxfp4 or mxfp8"),
        (dict(format="mxfp4", macro_block=48), "macro_block=48 must be a multiple of 32"),
        (dict(format="mxfp4", outlier_fraction=1.0), "outlier_fraction=1.0"),
        (dict(aqn_sigma_start=-1.0), "aqn_sigma_start=-1.0"),
        (dict(aqn_sigma_start=0.1, aqn_stages=1), "num_stages=1"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutWeights(**kwargs)
