"""Gemma 3 text checkpoints (gemma3_text): logits parity with transformers (sliding windows
shorter than the sequence, padding, local/global RoPE bases, soft-capping), save ->
transformers, exact round trips, sampler vs teacher-forced log-probs, and the one-line errors.

Tests marked `hf` build tiny random transformers models in process (nothing is downloaded).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_parity import hf_model, parity, random_params, torch_or_skip

from rljax.models import (
    TransformerConfig,
    abstract_model,
    config_from_hf,
    load_hf_checkpoint,
    save_hf_checkpoint,
)
from rljax.models.hf import config_to_hf
from rljax.rollout.sampler import generate
from rljax.train.logprobs import completion_logprobs

_TOL = 1e-5  # max |ours - transformers| / max |transformers logit|, float32
_logprobs = jax.jit(completion_logprobs, static_argnums=0)
_SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    head_dim=16,
    max_position_embeddings=64,
)
_ROPE = dict(  # transformers 5's per-layer-type RoPE: scaled global, unscaled local base
    full_attention=dict(rope_type="linear", factor=2.0, rope_theta=5000.0),
    sliding_attention=dict(rope_type="default", rope_theta=100.0),
)
_MIXED = ["sliding_attention", "full_attention", "sliding_attention"]
# name -> (transformers config overrides, TransformerConfig fields to expect)
_CASES = {
    # Tied, windows of 4 < the 12 tokens on layers 0 and 2, query_pre_attn_scalar != head_dim.
    "tied_window_scalar": (
        dict(sliding_window=4, layer_types=_MIXED, rope_parameters=_ROPE, query_pre_attn_scalar=24),
        dict(sliding_window=4, layer_types=tuple(_MIXED), rope_local_theta=100.0,
             rope_theta=5000.0, query_pre_attn_scalar=24, tie_embeddings=True),
    ),
    # Untied, biases, soft-capped logits, Gemma3TextConfig's default pattern and RoPE bases.
    "untied_bias_softcap": (
        dict(sliding_window=5, sliding_window_pattern=2, tie_word_embeddings=False,
             attention_bias=True, final_logit_softcapping=2.0),
        dict(layer_types=("sliding_attention", "full_attention", "sliding_attention"),
             rope_theta=1e6, rope_local_theta=1e4, qkv_bias=True, o_bias=True,
             final_logit_softcap=2.0, tie_embeddings=False),
    ),
}  # fmt: skip


def _hf_model(**overrides):
    """A tiny random Gemma3ForCausalLM (`_SMALL` with `overrides`)."""
    return hf_model("gemma3_text", {**_SMALL, **overrides})


@pytest.mark.hf
@pytest.mark.parametrize("case", sorted(_CASES))
def test_gemma3_logits_match_transformers(case, tmp_path):
    overrides, expect = _CASES[case]
    model = _hf_model(**overrides)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, graphdef, params = load_hf_checkpoint(tmp_path)
    for field, value in expect.items():
        assert getattr(config, field) == value, field
    assert config.norm_unit_offset and config.sandwich_norms and config.scale_embeddings
    assert config.mlp_activation == "gelu_tanh" and config.qk_norm
    err = parity(model, graphdef, params)
    print(f"{case}: max relative logits error {err:.2e}")
    assert err < _TOL


@pytest.mark.hf
def test_every_gemma3_feature_is_needed_for_parity(tmp_path):
    """Each Gemma field, set back to its Llama default, breaks parity: the parity test above
    exercises every one of them."""
    overrides, _ = _CASES["untied_bias_softcap"]
    model = _hf_model(**dict(overrides, rope_parameters=_ROPE, query_pre_attn_scalar=24))
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, _, params = load_hf_checkpoint(tmp_path)
    defaults = dict(
        norm_unit_offset=False,
        scale_embeddings=False,
        mlp_activation="silu",
        query_pre_attn_scalar=None,
        rope_local_theta=None,
        final_logit_softcap=None,
    )
    for field, value in defaults.items():
        graphdef, _ = abstract_model(config.replace(**{field: value}))
        err = parity(model, graphdef, params)
        print(f"without {field}: {err:.2e}")
        assert err > 1e-3, field


_GEMMA3 = TransformerConfig(
    vocab_size=96, d_model=64, n_layers=3, n_heads=4, n_kv_heads=1, d_ff=96, head_dim=32,
    qk_norm=True, norm_unit_offset=True, sandwich_norms=True, scale_embeddings=True,
    mlp_activation="gelu_tanh", query_pre_attn_scalar=16, rope_theta=20000.0,
    rope_local_theta=500.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
    sliding_window=3, layer_types=("full_attention", "sliding_attention", "sliding_attention"),
    tie_embeddings=True,
)  # fmt: skip


@pytest.mark.hf
def test_saved_gemma3_loads_in_transformers(tmp_path):
    torch_or_skip()
    import transformers

    graphdef, params = random_params(_GEMMA3, seed=3)
    save_hf_checkpoint(tmp_path, _GEMMA3, params, model_type="gemma3_text")
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
        .float()
        .eval()
    )
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.config.layer_types == list(_GEMMA3.layer_types)
    err = parity(model, graphdef, params)
    print(f"ours -> transformers (gemma3_text): max relative logits error {err:.2e}")
    assert err < _TOL


def test_gemma3_save_load_round_trip_is_exact(tmp_path):
    config = _GEMMA3.replace(
        tie_embeddings=False, qkv_bias=True, o_bias=True, final_logit_softcap=20.0, rms_eps=1e-5,
    )  # fmt: skip
    _, params = random_params(config, seed=4)
    save_hf_checkpoint(tmp_path, config, params, model_type="gemma3_text")
    loaded_config, _, loaded = load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    ours, theirs = nnx.to_pure_dict(params), nnx.to_pure_dict(loaded)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.hf
def test_sampler_logprobs_equal_teacher_forced_on_loaded_gemma3(tmp_path):
    """Cached decoding (windows of 4 over 5-token prompts + 6 new tokens, local and global RoPE
    bases, the scaled embedding) equals the full forward pass."""
    overrides, _ = _CASES["tied_window_scalar"]
    _hf_model(**overrides).save_pretrained(tmp_path)
    _, graphdef, params = load_hf_checkpoint(tmp_path)
    rng = np.random.default_rng(0)
    tokens = np.zeros((3, 5), np.int32)
    mask = np.zeros((3, 5), bool)
    for i, n in enumerate([5, 3, 2]):
        tokens[i, 5 - n :] = rng.integers(2, _SMALL["vocab_size"], n)
        mask[i, 5 - n :] = True
    rollout = generate(
        graphdef, params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0),
        max_new_tokens=6, eos_id=1, pad_id=0, n_samples=2,
    )  # fmt: skip
    assert rollout.completion_mask.sum() > 12
    args = (rollout.prompt_tokens, rollout.prompt_mask)
    lp, _ = _logprobs(graphdef, params, *args, rollout.completion_tokens, rollout.completion_mask)
    m = np.asarray(rollout.completion_mask)
    np.testing.assert_allclose(np.asarray(lp)[m], np.asarray(rollout.policy_logprobs)[m], atol=1e-5)


def test_trainer_refuses_soft_capped_logits():
    """The chunked log-probs read the output matrix, not `Transformer.logits`: a soft-capped
    model would train on other log-probs than it samples from, so it is refused."""
    graphdef, params = random_params(_GEMMA3.replace(final_logit_softcap=30.0), seed=0)
    tokens, mask = jnp.ones((1, 3), jnp.int32), jnp.ones((1, 3), bool)
    with pytest.raises(ValueError, match=r"final_logit_softcap=30.0\), which the trainer"):
        completion_logprobs(graphdef, params, tokens, mask, tokens, mask)


_HF = dict(_SMALL, model_type="gemma3_text")


def test_config_from_hf_reads_gemma3_defaults():
    """Gemma3TextConfig's defaults where config.json omits fields (as older exports do), and
    transformers 4's rope_theta / rope_local_base_freq / rope_scaling."""
    omitted = {k: v for k, v in _HF.items() if k != "head_dim"}
    config = config_from_hf(dict(omitted, num_hidden_layers=7))
    assert config.head_dim == 256 and config.query_pre_attn_scalar is None
    assert config.sliding_window == 4096 and config.tie_embeddings
    assert [t == "full_attention" for t in config.layer_types] == [0, 0, 0, 0, 0, 1, 0]
    assert (config.rope_theta, config.rope_local_theta, config.rope_scaling) == (1e6, 1e4, None)
    old = config_from_hf(
        dict(_HF, rope_theta=3e5, rope_local_base_freq=77.0,
             rope_scaling={"rope_type": "linear", "factor": 8.0})
    )  # fmt: skip
    assert (old.rope_theta, old.rope_local_theta) == (3e5, 77.0)
    assert old.rope_scaling_dict == {"rope_type": "linear", "factor": 8.0}
    assert config_to_hf(old, "gemma3_text")["rope_parameters"]["full_attention"]["factor"] == 8.0


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_activation="gelu"), r"hidden_activation='gelu' is not supported"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0 is not supported"),
        (
            dict(rope_parameters=dict(_ROPE, sliding_attention=dict(rope_type="linear", factor=2))),
            "sliding_attention rope_parameters",
        ),
        (dict(architectures=["Gemma3ForConditionalGeneration"]), "Gemma3ForCausalLM"),
    ],
)
def test_gemma3_config_errors(change, message):
    with pytest.raises(ValueError, match=message) as err:
        config_from_hf(dict(_HF, **change))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config, model_type, message",
    [
        (_GEMMA3, "qwen3", "norm_unit_offset=True; save it with model_type='gemma3_text'"),
        (
            _GEMMA3.replace(norm_unit_offset=False),
            "gemma3_text",
            "norm_unit_offset=False; Gemma 3 always has it",
        ),
        (_GEMMA3.replace(rope_local_theta=None), "gemma3_text", "rope_local_base_freq"),
        (
            TransformerConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2,
                              d_ff=8, final_logit_softcap=30.0),
            "llama",
            "final_logit_softcap=30.0; save it with model_type='gemma3_text'",
        ),
    ],
)  # fmt: skip
def test_save_refuses_configs_gemma3_cannot_hold(config, model_type, message, tmp_path):
    _, params = random_params(config, seed=0)
    with pytest.raises(ValueError, match=message):
        save_hf_checkpoint(tmp_path, config, params, model_type=model_type)
