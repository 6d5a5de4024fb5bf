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
from rljax.models.transformer import unstack_layers
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


def _write_gemma3_gguf(path: str) -> dict[str, np.ndarray]:
    """A tiny F32 gemma3 GGUF as llama.cpp writes one: norm weights stored as 1 + w, six layers
    (llama.cpp makes every 6th global), head_dim 256 (transformers' GGUF loader takes
    query_pre_attn_scalar 256 from Gemma3TextConfig's defaults), and a SentencePiece vocabulary
    of pieces in merge order, byte tokens and Gemma's control and user-defined tokens. Returns
    the HF-convention weights (w) by GGUF name."""
    import gguf

    pieces = ["\u2581", "a", "b", "h", "i", "t", "e", "\u2581t", "he", "\u2581the", "hi", "\u2581a"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\n", "  ", "   "]
    types = [3, 3, 3, 2, 3, 4, 4, 4] + [6] * 256 + [1] * len(pieces)
    tokens += [f"<0x{b:02X}>" for b in range(256)] + pieces
    d, f, heads, kv, layers, hd = 64, 96, 2, 1, 6, 256
    rng = np.random.default_rng(6)
    normal = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    weights = {"token_embd.weight": normal(len(tokens), d), "output_norm.weight": normal(d)}
    for i in range(layers):
        b = f"blk.{i}."
        weights |= {
            b + n: normal(d)
            for n in (
                "attn_norm.weight",
                "post_attention_norm.weight",
                "ffn_norm.weight",
                "post_ffw_norm.weight",
            )
        }
        weights |= {b + "attn_q_norm.weight": normal(hd), b + "attn_k_norm.weight": normal(hd)}
        weights |= {
            b + "attn_q.weight": normal(heads * hd, d),
            b + "attn_k.weight": normal(kv * hd, d),
            b + "attn_v.weight": normal(kv * hd, d),
            b + "attn_output.weight": normal(d, heads * hd),
            b + "ffn_gate.weight": normal(f, d),
            b + "ffn_up.weight": normal(f, d),
            b + "ffn_down.weight": normal(d, f),
        }  # fmt: skip
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_context_length(256)
    writer.add_embedding_length(d)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(f)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(4)
    writer.add_file_type(0)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(
        [-1000.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    )
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    for name, value in weights.items():
        writer.add_tensor(name, value + 1.0 if name.endswith("norm.weight") else value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def test_gemma3_gguf_loads_norms_without_the_stored_offset(tmp_path):
    from rljax.models import load_gguf

    weights = _write_gemma3_gguf(str(tmp_path / "gemma3.gguf"))
    config, _, params = load_gguf(str(tmp_path / "gemma3.gguf"))
    assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert (config.sliding_window, config.rope_local_theta, config.head_dim) == (4, 1e4, 256)
    assert config.norm_unit_offset and config.sandwich_norms and config.tie_embeddings
    layer = unstack_layers(nnx.to_pure_dict(params))["layers"][2]
    for ours, name in [(layer["post_mlp_norm"], "post_ffw_norm"), (layer["mlp_norm"], "ffn_norm"),
                       (layer["attn"]["k_norm"], "attn_k_norm")]:  # fmt: skip
        np.testing.assert_allclose(ours["weight"], weights[f"blk.2.{name}.weight"], atol=1e-7)


@pytest.mark.hf
def test_gemma3_gguf_logits_and_tokens_match_transformers(tmp_path):
    torch = torch_or_skip()
    import transformers

    from rljax.models import gguf_tokenizer, load_gguf

    _write_gemma3_gguf(str(tmp_path / "gemma3.gguf"))
    where = dict(pretrained_model_name_or_path=tmp_path, gguf_file="gemma3.gguf")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        **where, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(model).__name__ == "Gemma3ForCausalLM"
    _, graphdef, params = load_gguf(str(tmp_path / "gemma3.gguf"))
    err = parity(model, graphdef, params)
    print(f"gemma3 GGUF: max relative logits error {err:.2e}")
    assert err < _TOL
    tok, hf_tok = (
        gguf_tokenizer(str(tmp_path / "gemma3.gguf")),
        transformers.AutoTokenizer.from_pretrained(**where),
    )
    for text in ["the hat", "  the\n   ahi<start_of_turn>", "tea é", " a\tb"]:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(ids, skip_special=False) == text
    assert tok.encode("hi", add_bos=tok.add_bos_token) == hf_tok.encode("hi")
