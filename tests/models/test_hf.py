"""Hugging Face checkpoint loading/saving: logits parity with transformers, round trips, errors.

Tests marked `hf` need torch + transformers (the [hf] extra) and build tiny random models in
process; nothing is downloaded. The error and round-trip tests need neither.
"""

from __future__ import annotations

import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx
from hf_parity import hf_model, parity, random_params, torch_or_skip

from rljax.models import (
    TransformerConfig,
    config_from_hf,
    forward,
    load_hf_checkpoint,
    save_hf_checkpoint,
)

_TOL = 1e-4
_forward = jax.jit(forward, static_argnums=0)
_SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
)


def _hf_model(model_type: str, **overrides):
    """A tiny random transformers model of `model_type` (`_SMALL` with `overrides`)."""
    return hf_model(model_type, {**_SMALL, **overrides})


_LLAMA3_SCALING = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8,
)
_LLAMA3 = dict(_LLAMA3_SCALING, rope_theta=50000.0)
_CASES = {
    # GQA, untied head, Qwen2 q/k/v biases.
    "qwen2_gqa_untied": (
        "qwen2",
        dict(tie_word_embeddings=False),
        dict(qkv_bias=True, o_bias=False, tie_embeddings=False),
    ),
    # Tied embeddings, non-default rope_theta, head_dim != hidden / heads.
    "qwen2_tied_theta_headdim": (
        "qwen2",
        dict(
            tie_word_embeddings=True,
            head_dim=32,
            rope_parameters=dict(rope_type="default", rope_theta=5000.0),
        ),
        dict(tie_embeddings=True, head_dim=32, rope_theta=5000.0),
    ),
    # attention_bias (q/k/v and output), llama3 RoPE scaling, GQA.
    "llama_bias_llama3": (
        "llama",
        dict(attention_bias=True, rope_parameters=_LLAMA3),
        dict(qkv_bias=True, o_bias=True, rope_theta=50000.0),
    ),
    # Multi-head (kv = heads), tied, head_dim 32, linear RoPE scaling.
    "llama_tied_linear_headdim": (
        "llama",
        dict(
            num_key_value_heads=4,
            tie_word_embeddings=True,
            head_dim=32,
            rope_parameters=dict(rope_type="linear", rope_theta=20000.0, factor=2.0),
        ),
        dict(n_kv_heads=4, tie_embeddings=True, head_dim=32, qkv_bias=False, o_bias=False),
    ),
}


@pytest.mark.hf
@pytest.mark.parametrize("case", sorted(_CASES))
def test_logits_match_transformers(case, tmp_path):
    model_type, overrides, expect = _CASES[case]
    model = _hf_model(model_type, **overrides)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, graphdef, params = load_hf_checkpoint(tmp_path)
    for field, value in expect.items():
        assert getattr(config, field) == value, field
    err = parity(model, graphdef, params)
    print(f"{case}: max relative logits error {err:.2e}")
    assert err < _TOL


@pytest.mark.hf
def test_sharded_and_bf16_checkpoints(tmp_path):
    torch = torch_or_skip()
    model = _hf_model("qwen2")
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="40KB")
    assert os.path.isfile(tmp_path / "sharded" / "model.safetensors.index.json")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    _, graphdef, params = load_hf_checkpoint(tmp_path / "sharded")
    err = parity(model, graphdef, params)
    print(f"sharded: max relative logits error {err:.2e}")
    assert err < _TOL

    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", safe_serialization=True)
    q_ref = model.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [H*hd, D]
    for param_dtype, np_dtype in (("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)):
        config, _, params = load_hf_checkpoint(tmp_path / "bf16", param_dtype=param_dtype)
        q = np.asarray(params["layers"]["attn"]["q_proj"][...][1])
        assert q.dtype == np_dtype
        np.testing.assert_array_equal(q.astype(np.float32).reshape(64, -1).T, q_ref)


@pytest.mark.hf
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_saved_checkpoint_loads_in_transformers(model_type, tmp_path):
    torch_or_skip()
    import transformers

    if model_type == "qwen2":
        config = TransformerConfig(
            vocab_size=96,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            d_ff=128,
            qkv_bias=True,
            rope_theta=3000.0,
        )
        shard_size = None
    else:
        config = TransformerConfig(
            vocab_size=96,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=1,
            d_ff=96,
            head_dim=32,
            qkv_bias=True,
            o_bias=True,
            tie_embeddings=True,
            rope_theta=40000.0,
            rope_scaling=_LLAMA3_SCALING,
        )
        shard_size = 50_000  # also exercise our sharded writer
    graphdef, params = random_params(config, seed=3)
    save_hf_checkpoint(
        tmp_path,
        config,
        params,
        model_type=model_type,
        shard_size=shard_size,
        extra_config={"max_position_embeddings": 64},
    )
    if shard_size is not None:
        assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
        .float()
        .eval()
    )
    assert (
        type(model).__name__
        == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[model_type]
    )
    err = parity(model, graphdef, params)
    print(f"ours -> transformers ({model_type}): max relative logits error {err:.2e}")
    assert err < _TOL


# ------------------------------------------------------------------------------------------
# No torch needed below.


def _tiny_config(**changes) -> TransformerConfig:
    base = dict(
        vocab_size=32, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24, qkv_bias=True
    )
    return TransformerConfig(**{**base, **changes})


def _saved(tmp_path, config=None, **save_kwargs):
    config = config or _tiny_config()
    _, params = random_params(config)
    save_hf_checkpoint(tmp_path, config, params, **save_kwargs)
    return config, params


@pytest.mark.parametrize("kind", ["qwen2", "llama_tied_bf16", "sharded"])
def test_save_load_round_trip_is_exact(kind, tmp_path):
    if kind == "qwen2":
        config, params = _saved(tmp_path)
    elif kind == "llama_tied_bf16":
        config = _tiny_config(
            qkv_bias=False,
            tie_embeddings=True,
            param_dtype="bfloat16",
            rope_scaling={"rope_type": "linear", "factor": 4.0},
        )
        config, params = _saved(tmp_path, config, model_type="llama")
    else:
        config, params = _saved(tmp_path, shard_size=4_000)
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
        assert not (tmp_path / "model.safetensors").exists()
    loaded_config, _, loaded = load_hf_checkpoint(tmp_path, param_dtype=config.param_dtype)
    assert loaded_config == config
    ours, theirs = nnx.to_pure_dict(params), nnx.to_pure_dict(loaded)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_resaving_unsharded_removes_old_shards(tmp_path):
    _saved(tmp_path, shard_size=4_000)
    config, params = _saved(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    _, _, loaded = load_hf_checkpoint(tmp_path)
    np.testing.assert_array_equal(loaded["embed"][...], params["embed"][...])


def test_config_from_hf_reads_both_rope_styles():
    v4 = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        rope_scaling={"type": "linear", "factor": 2.0},
    )
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    for hf in (v4, v5):
        config = config_from_hf(hf)
        assert config.n_kv_heads == 2 and config.rms_eps == 1e-5 and config.rope_theta == 500.0
        assert config.rope_scaling_dict == {"rope_type": "linear", "factor": 2.0}
        assert not config.qkv_bias and not config.tie_embeddings
    default = dict(v5, rope_parameters={"rope_type": "default", "rope_theta": 7.0})
    assert config_from_hf(default).rope_scaling is None
    assert config_from_hf(dict(v5, model_type="qwen2")).qkv_bias


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model_type="gemma2"), "supported model types"),
        (dict(architectures=["LlamaForSequenceClassification"]), "LlamaForCausalLM"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(use_sliding_window=True), "sliding-window attention is not supported for"),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0}), "yarn"),
        (dict(vocab_size=None), "vocab_size"),
    ],
)
def test_config_from_hf_errors(change, message):
    hf = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
    )
    hf.update(change)
    if hf["vocab_size"] is None:
        del hf["vocab_size"]
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)


def _rewrite_weights(path, edit):
    file = os.path.join(path, "model.safetensors")
    tensors = safetensors.numpy.load_file(file)
    edit(tensors)
    safetensors.numpy.save_file(tensors, file, metadata={"format": "pt"})


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    _saved(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_checkpoint(tmp_path)

    _saved(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(dict(hf, model_type="gpt2", architectures=["GPT2LMHeadModel"]))
    )
    with pytest.raises(ValueError, match="'gpt2'.*not supported"):
        load_hf_checkpoint(tmp_path)

    name = "model.layers.1.self_attn.k_proj.weight"
    _saved(tmp_path)
    _rewrite_weights(tmp_path, lambda t: t.update({name: t[name][:4]}))
    with pytest.raises(ValueError, match=r"k_proj.weight.*\(4, 16\).*expected \(8, 16\)"):
        load_hf_checkpoint(tmp_path)

    _saved(tmp_path)
    _rewrite_weights(tmp_path, lambda t: t.pop("model.layers.0.self_attn.q_proj.bias"))
    with pytest.raises(ValueError, match="lacks 1 tensor.*q_proj.bias"):
        load_hf_checkpoint(tmp_path)

    _saved(tmp_path)
    _rewrite_weights(
        tmp_path,
        lambda t: t.update({"model.layers.0.mlp.gate_proj.bias": np.zeros(24, np.float32)}),
    )
    with pytest.raises(ValueError, match="does not use.*gate_proj.bias"):
        load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "name, damage",
    [
        ("model.safetensors", "half"),
        ("model.safetensors", "header"),
        ("model.safetensors", "empty"),
        ("model.safetensors", "flipped_header"),
        ("config.json", "half"),
    ],
)
def test_damaged_files_name_the_file(name, damage, tmp_path):
    """A cut-off download or flipped bytes: one ValueError naming the file, not a Rust error."""
    _saved(tmp_path)
    file = tmp_path / name
    data = file.read_bytes()
    damaged = {
        "half": data[: len(data) // 2],
        "header": data[:20],
        "empty": b"",
        "flipped_header": data[:8] + b"\xff" * 16 + data[24:],
    }[damage]
    file.write_bytes(damaged)
    message = rf"^{file} is damaged \(truncated\?\): .*; re-download it$"
    with pytest.raises(ValueError, match=message):
        load_hf_checkpoint(tmp_path)


def test_ignorable_buffers_and_tied_head(tmp_path):
    config, params = _saved(tmp_path, _tiny_config(tie_embeddings=True))
    embed = np.asarray(params["embed"][...])

    def add(tensors):
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(2, np.float32)
        tensors["lm_head.weight"] = embed

    _rewrite_weights(tmp_path, add)
    _, _, loaded = load_hf_checkpoint(tmp_path)
    assert "lm_head" not in nnx.to_pure_dict(loaded)
    np.testing.assert_array_equal(loaded["embed"][...], embed)


def test_save_rejects_biases_the_model_type_cannot_hold(tmp_path):
    _, params = random_params(_tiny_config(qkv_bias=False))
    with pytest.raises(ValueError, match="model_type='llama'"):
        save_hf_checkpoint(tmp_path, _tiny_config(qkv_bias=False), params, model_type="qwen2")
    _, params = random_params(_tiny_config())
    with pytest.raises(ValueError, match="model_type='qwen2'"):
        save_hf_checkpoint(tmp_path, _tiny_config(), params, model_type="llama")
