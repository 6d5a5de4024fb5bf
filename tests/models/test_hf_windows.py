"""Mistral, Qwen2 with sliding windows and Mixtral: logits parity with transformers, saving.

Tiny random models in float32 with a window (4) shorter than the sequence (12), so the window
changes the logits; built in process, nothing is downloaded.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from hf_parity import hf_model, parity, random_params, torch_or_skip

from rljax.models import (
    TransformerConfig,
    abstract_model,
    config_from_hf,
    forward,
    load_hf_checkpoint,
    save_hf_checkpoint,
)
from rljax.models.hf import config_to_hf

_TOL = 1e-5
_forward = jax.jit(forward, static_argnums=0)
_SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    sliding_window=4,
)
# model_type -> (HF config overrides, TransformerConfig fields the load must give).
_CASES = {
    "mistral": (dict(), dict(sliding_window=4, layer_types=None, qkv_bias=False)),
    # Layer 0 full, layer 1 windowed (transformers: window on layers >= max_window_layers).
    "qwen2": (
        dict(use_sliding_window=True, max_window_layers=1),
        dict(sliding_window=4, layer_types=("full_attention", "sliding_attention")),
    ),
    "mixtral": (
        dict(num_local_experts=4, num_experts_per_tok=2),
        dict(sliding_window=4, num_experts=4, experts_per_token=2, norm_topk_prob=True),
    ),
}


def _hf_model(model_type: str, **overrides):
    """A tiny random transformers model of `model_type` (`_SMALL` with `overrides`)."""
    return hf_model(model_type, {**_SMALL, **overrides})


@pytest.mark.hf
@pytest.mark.parametrize("model_type", sorted(_CASES))
def test_windowed_logits_match_transformers(model_type, tmp_path):
    overrides, expect = _CASES[model_type]
    model = _hf_model(model_type, **overrides)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, graphdef, params = load_hf_checkpoint(tmp_path)
    for field, value in expect.items():
        assert getattr(config, field) == value, field
    err = parity(model, graphdef, params)
    print(f"{model_type}: max relative logits error {err:.2e}")
    assert err < _TOL
    # The window matters: without it the same weights give other logits.
    full_graphdef, full = abstract_model(config.replace(sliding_window=None, layer_types=None))
    nnx.replace_by_pure_dict(full, nnx.to_pure_dict(params))
    assert parity(model, full_graphdef, full) > 1e-2


@pytest.mark.hf
@pytest.mark.parametrize("model_type", sorted(_CASES))
def test_saved_windowed_checkpoint_loads_in_transformers(model_type, tmp_path):
    torch_or_skip()
    import transformers

    base = dict(vocab_size=96, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=80)
    config = {
        "mistral": TransformerConfig(**base, sliding_window=3),
        "qwen2": TransformerConfig(
            **base,
            qkv_bias=True,
            sliding_window=3,
            layer_types=("sliding_attention", "full_attention", "sliding_attention"),
        ),
        "mixtral": TransformerConfig(
            **base, sliding_window=5, num_experts=3, experts_per_token=2, expert_d_ff=48
        ),
    }[model_type]
    graphdef, params = random_params(config, seed=3)
    save_hf_checkpoint(tmp_path, config, params, model_type=model_type)
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
        .float()
        .eval()
    )
    assert type(model).__name__ == config_to_hf(config, model_type)["architectures"][0]
    err = parity(model, graphdef, params)
    print(f"ours -> transformers ({model_type}): max relative logits error {err:.2e}")
    assert err < _TOL


# ------------------------------------------------------------------------------------------
# No torch needed below.


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "mixtral"])
def test_windowed_save_load_round_trip_is_exact(model_type, tmp_path):
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24)
    config = {
        "mistral": TransformerConfig(**base, sliding_window=5),
        "qwen2": TransformerConfig(
            **base,
            qkv_bias=True,
            sliding_window=2,
            layer_types=("sliding_attention", "full_attention"),
        ),
        "mixtral": TransformerConfig(**base, sliding_window=3, num_experts=3),
    }[model_type]
    _, params = random_params(config)
    save_hf_checkpoint(tmp_path, config, params, model_type=model_type)
    loaded, _, params2 = load_hf_checkpoint(tmp_path)
    assert loaded == config
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(params2), nnx.to_pure_dict(params))


def _hf(model_type: str, **fields) -> dict:
    base = dict(
        model_type=model_type,
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=16,
    )
    return {**base, **fields}


def test_config_from_hf_window_semantics():
    qwen = config_from_hf(
        _hf("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2)
    )
    assert qwen.layer_windows == (None, None, 8, 8)
    # transformers' default max_window_layers is 28: no layer of a 4-layer model is windowed.
    assert (
        config_from_hf(_hf("qwen2", use_sliding_window=True, sliding_window=8)).layer_windows
        == (None,) * 4
    )
    # Without use_sliding_window Qwen2 ignores sliding_window; Mistral windows every layer.
    assert config_from_hf(_hf("qwen2", sliding_window=8)).sliding_window is None
    assert config_from_hf(_hf("mistral", sliding_window=8)).layer_windows == (8,) * 4
    assert config_from_hf(_hf("mistral", sliding_window=None)).sliding_window is None
    explicit = ["sliding_attention", "full_attention"] * 2
    pattern = _hf("qwen2", use_sliding_window=True, sliding_window=3, layer_types=explicit)
    assert config_from_hf(pattern).layer_types == tuple(explicit)


@pytest.mark.parametrize(
    "hf, message",
    [
        (_hf("llama", use_sliding_window=True), "not supported for model_type 'llama'"),
        (_hf("qwen2", layer_types=["sliding_attention"] * 4), "no window"),
        (
            _hf("qwen2", use_sliding_window=True, sliding_window=3, layer_types=["chunked"] * 4),
            "chunked",
        ),
        (_hf("mixtral", num_local_experts=4), "num_experts_per_tok"),
    ],
)
def test_config_from_hf_window_errors(hf, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)


@pytest.mark.parametrize(
    "changes, model_type, message",
    [
        (dict(sliding_window=4), "llama", "Llama has no sliding-window"),
        (
            dict(sliding_window=4, layer_types=("full_attention", "sliding_attention")),
            "mistral",
            "mix full and sliding",
        ),
        (dict(qkv_bias=True), "mistral", "no biases"),
        (dict(), "mixtral", "num_experts=0; save dense models as"),
        (dict(num_experts=2), "qwen2", "save mixture-of-experts models as 'mixtral'"),
        (dict(num_experts=2, norm_topk_prob=False), "mixtral", "norm_topk_prob=False"),
    ],
)
def test_save_refuses_what_the_family_cannot_hold(changes, model_type, message):
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24)
    if model_type == "qwen2":
        base["qkv_bias"] = True
    with pytest.raises(ValueError, match=message):
        config_to_hf(TransformerConfig(**{**base, **changes}), model_type)
