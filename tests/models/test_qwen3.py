"""Qwen3 (per-head q/k RMSNorm) and Qwen3-MoE checkpoints: logits parity with transformers,
save -> transformers, exact round trips, sampler vs teacher-forced log-probs, routing replay on
a loaded Qwen3-MoE, and the one-line errors.

Tests marked `hf` build tiny random transformers models in process (nothing is downloaded).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_parity import hf_model, parity, random_params, torch_or_skip

from rljax.models import (
    TransformerConfig,
    config_from_hf,
    forward,
    load_hf_checkpoint,
    positions_from_mask,
    save_hf_checkpoint,
)
from rljax.models.transformer import unstack_layers
from rljax.rollout.sampler import generate
from rljax.train.logprobs import completion_logprobs

_TOL = 1e-5  # max |ours - transformers| / max |transformers logit|, float32
_forward = jax.jit(forward, static_argnums=0, static_argnames="return_routes")
_logprobs = jax.jit(completion_logprobs, static_argnums=0)
_SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    max_position_embeddings=64,
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# name -> (model_type, transformers config overrides, TransformerConfig fields to expect)
_CASES = {
    # GQA, untied head, head_dim 32 != 64 / 4, non-default rope_theta.
    "qwen3_untied_headdim": (
        "qwen3",
        dict(head_dim=32, rope_parameters=dict(rope_type="default", rope_theta=5000.0)),
        dict(qk_norm=True, head_dim=32, rope_theta=5000.0, tie_embeddings=False, qkv_bias=False),
    ),
    # Tied embeddings, attention_bias (q/k/v and output biases), rms eps.
    "qwen3_tied_bias": (
        "qwen3",
        dict(head_dim=16, tie_word_embeddings=True, attention_bias=True, rms_norm_eps=1e-5),
        dict(qk_norm=True, head_dim=None, tie_embeddings=True, qkv_bias=True, o_bias=True),
    ),
    # Experts with renormalised top-k weights.
    "qwen3_moe_norm_topk": (
        "qwen3_moe",
        dict(_MOE, head_dim=16, norm_topk_prob=True),
        dict(qk_norm=True, num_experts=4, experts_per_token=2, expert_d_ff=32, norm_topk_prob=True),
    ),
    # Raw softmax weights (Qwen3MoeConfig's default), tied, 3 of 4 experts.
    "qwen3_moe_raw_topk_tied": (
        "qwen3_moe",
        dict(_MOE, head_dim=16, num_experts_per_tok=3, tie_word_embeddings=True),
        dict(experts_per_token=3, norm_topk_prob=False, tie_embeddings=True),
    ),
}


def _hf_model(model_type: str, **overrides):
    """A tiny random transformers model of `model_type` (`_SMALL` with `overrides`)."""
    return hf_model(model_type, {**_SMALL, **overrides})


_QWEN3 = TransformerConfig(
    vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, head_dim=32,
    qk_norm=True, rope_theta=20000.0,
)  # fmt: skip
_QWEN3_MOE = _QWEN3.replace(num_experts=4, experts_per_token=2, expert_d_ff=24)


@pytest.mark.hf
@pytest.mark.parametrize("case", sorted(_CASES))
def test_qwen3_logits_match_transformers(case, tmp_path):
    model_type, overrides, expect = _CASES[case]
    model = _hf_model(model_type, **overrides)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, graphdef, params = load_hf_checkpoint(tmp_path)
    for field, value in expect.items():
        assert getattr(config, field) == value, field
    layer = unstack_layers(nnx.to_pure_dict(params))["layers"][0]
    assert layer["attn"]["q_norm"]["weight"].shape == (model.config.head_dim,)
    err = parity(model, graphdef, params)
    print(f"{case}: max relative logits error {err:.2e}")
    assert err < _TOL


@pytest.mark.hf
@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_saved_qwen3_loads_in_transformers(model_type, tmp_path):
    torch_or_skip()
    import transformers

    config = _QWEN3_MOE if model_type == "qwen3_moe" else _QWEN3.replace(tie_embeddings=True)
    graphdef, params = random_params(config, seed=3)
    save_hf_checkpoint(tmp_path, config, params, model_type=model_type)
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
        .float()
        .eval()
    )
    want = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[model_type]
    assert type(model).__name__ == want
    err = parity(model, graphdef, params)
    print(f"ours -> transformers ({model_type}): max relative logits error {err:.2e}")
    assert err < _TOL


@pytest.mark.parametrize("kind", ["qwen3_tied_bias", "qwen3_moe_sharded"])
def test_qwen3_save_load_round_trip_is_exact(kind, tmp_path):
    if kind == "qwen3_moe_sharded":
        config, model_type, shard = _QWEN3_MOE.replace(norm_topk_prob=False), "qwen3_moe", 20_000
    else:
        config = _QWEN3.replace(qkv_bias=True, o_bias=True, tie_embeddings=True, rms_eps=1e-5)
        model_type, shard = "qwen3", None
    _, params = random_params(config, seed=4)
    save_hf_checkpoint(tmp_path, config, params, model_type=model_type, shard_size=shard)
    if shard is not None:  # the experts of a layer are spread over several files
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        files = {
            index["weight_map"][f"model.layers.0.mlp.experts.{j}.up_proj.weight"] for j in (0, 3)
        }
        assert len(files) == 2
    loaded_config, _, loaded = load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    ours, theirs = nnx.to_pure_dict(params), nnx.to_pure_dict(loaded)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def loaded_qwen3(tmp_path_factory):
    """model_type -> (graphdef, params) loaded from a transformers-saved tiny checkpoint."""
    loaded = {}
    for model_type, overrides in (("qwen3", dict(head_dim=32)), ("qwen3_moe", _MOE)):
        path = tmp_path_factory.mktemp(model_type)
        _hf_model(model_type, **overrides).save_pretrained(path, safe_serialization=True)
        loaded[model_type] = load_hf_checkpoint(path)[1:]
    return loaded


def _rollout(graphdef, params):
    """Two samples for each of three left-padded prompts (5, 3 and 2 real tokens)."""
    rng = np.random.default_rng(0)
    tokens = np.zeros((3, 5), np.int32)
    mask = np.zeros((3, 5), bool)
    for i, n in enumerate([5, 3, 2]):
        tokens[i, 5 - n :] = rng.integers(2, _SMALL["vocab_size"], n)
        mask[i, 5 - n :] = True
    return generate(
        graphdef,
        params,
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jax.random.key(0),
        max_new_tokens=6,
        eos_id=1,
        pad_id=0,
        n_samples=2,
    )


@pytest.mark.hf
@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_sampler_logprobs_equal_teacher_forced_on_loaded_qwen3(loaded_qwen3, model_type):
    """The cached decode (q/k norms on each new token) and the full forward pass agree; for
    Qwen3-MoE the trainer replays the sampler's routes (`Rollout.routes`)."""
    graphdef, params = loaded_qwen3[model_type]
    rollout = _rollout(graphdef, params)
    assert rollout.completion_mask.sum() > 6  # several decoded tokens are compared
    args = (rollout.prompt_tokens, rollout.prompt_mask)
    args += (rollout.completion_tokens, rollout.completion_mask)
    routes = rollout.routes if model_type == "qwen3_moe" else None
    if routes is not None:
        assert routes.shape == (6, 11, 2, 2)
    lp, _ = _logprobs(graphdef, params, *args, routes=routes)
    m = np.asarray(rollout.completion_mask)
    np.testing.assert_allclose(np.asarray(lp)[m], np.asarray(rollout.policy_logprobs)[m], atol=1e-5)
    if routes is not None:  # the replayed forward used exactly the rollout's experts
        tokens = jnp.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1)
        mask = jnp.concatenate([rollout.prompt_mask, rollout.completion_mask], axis=1)
        positions = positions_from_mask(mask)
        _, _, used = _forward(
            graphdef, params, tokens, positions, mask, routes=routes, return_routes=True
        )
        np.testing.assert_array_equal(used, routes)


_HF_MOE = dict(
    model_type="qwen3_moe",
    vocab_size=10,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
)


def test_config_from_hf_reads_qwen3_fields():
    dense = {k: v for k, v in _HF_MOE.items() if "expert" not in k and "moe" not in k}
    config = config_from_hf(dict(dense, model_type="qwen3"))
    assert config.qk_norm and config.head_dim == 128  # Qwen3Config's default head_dim
    assert config.num_experts == 0 and not config.qkv_bias
    config = config_from_hf(dict(_HF_MOE, attention_bias=True, head_dim=4))
    assert config.qk_norm and config.qkv_bias and config.o_bias and config.head_dim is None
    assert (config.num_experts, config.experts_per_token) == (4, 2)
    assert config.expert_d_ff is None and config.resolved_expert_d_ff == 16
    assert not config.norm_topk_prob  # Qwen3MoeConfig's default
    renamed = {k: v for k, v in _HF_MOE.items() if k != "num_experts"}  # transformers' alias
    assert config_from_hf(dict(renamed, num_local_experts=8)).num_experts == 8
    assert not config_from_hf(dict(dense, model_type="qwen2")).qk_norm


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(decoder_sparse_step=2), r"decoder_sparse_step=2.*mixed dense/MoE"),
        (dict(mlp_only_layers=[0]), r"mlp_only_layers=\[0\].*mixed dense/MoE"),
        (dict(num_experts_per_tok=None), "num_experts_per_tok"),
        (dict(architectures=["Qwen3ForCausalLM"]), "Qwen3MoeForCausalLM"),
        (dict(use_sliding_window=True), "sliding-window"),
    ],
)
def test_qwen3_config_errors(change, message):
    hf = dict(_HF_MOE, **change)
    if hf["num_experts_per_tok"] is None:
        del hf["num_experts_per_tok"]
    with pytest.raises(ValueError, match=message) as err:
        config_from_hf(hf)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config, model_type, message",
    [
        (_QWEN3, "qwen2", "qk_norm=True; save it with model_type='qwen3'"),
        (_QWEN3.replace(qk_norm=False), "qwen3", "qk_norm=False; save it with 'qwen2' or 'llama'"),
        (
            _QWEN3_MOE,
            "qwen3",
            "num_experts=4; save mixture-of-experts models as 'mixtral' or 'qwen3_moe'",
        ),
        (_QWEN3, "qwen3_moe", "num_experts=0; save dense models as"),
        (_QWEN3.replace(qkv_bias=True), "qwen3", "Qwen3ForCausalLM's attention_bias sets"),
    ],
)
def test_save_refuses_configs_the_qwen3_types_cannot_hold(config, model_type, message, tmp_path):
    _, params = random_params(config, seed=0)
    with pytest.raises(ValueError, match=message):
        save_hf_checkpoint(tmp_path, config, params, model_type=model_type)


def _write_qwen3_gguf(path: str, head_dim: int = 128) -> dict[str, np.ndarray]:
    """A tiny F32 qwen3 GGUF as llama.cpp writes one (q/k rows unpermuted, attn_q_norm /
    attn_k_norm per head); returns its weights by GGUF name. head_dim 128 because transformers'
    GGUF loader ignores attention.key_length for qwen3 and falls back on Qwen3Config's 128."""
    import gguf
    from gguf_files import MERGES, vocabulary  # the tiny byte-level BPE vocabulary

    d, f, heads, kv, layers = 64, 96, 4, 2, 2
    tokens = vocabulary()
    rng = np.random.default_rng(5)
    normal = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    weights = {"token_embd.weight": normal(len(tokens), d), "output_norm.weight": 1 + normal(d)}
    for i in range(layers):
        b = f"blk.{i}."
        weights |= {
            b + "attn_norm.weight": 1 + normal(d),
            b + "ffn_norm.weight": 1 + normal(d),
            b + "attn_q.weight": normal(heads * head_dim, d),
            b + "attn_k.weight": normal(kv * head_dim, d),
            b + "attn_v.weight": normal(kv * head_dim, d),
            b + "attn_output.weight": normal(d, heads * head_dim),
            b + "attn_q_norm.weight": 1 + normal(head_dim),
            b + "attn_k_norm.weight": 1 + normal(head_dim),
            b + "ffn_gate.weight": normal(f, d),
            b + "ffn_up.weight": normal(f, d),
            b + "ffn_down.weight": normal(d, f),
        }
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_context_length(256)
    writer.add_embedding_length(d)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(f)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3, 4] + [1] * (len(tokens) - 4))
    writer.add_token_merges(MERGES)
    writer.add_eos_token_id(2)
    for name, value in weights.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def test_qwen3_gguf_loads_its_head_norms(tmp_path):
    from rljax.models import load_gguf

    weights = _write_qwen3_gguf(str(tmp_path / "qwen3.gguf"))
    config, _, params = load_gguf(str(tmp_path / "qwen3.gguf"))
    assert config.qk_norm and config.head_dim == 128 and config.tie_embeddings
    attn = unstack_layers(nnx.to_pure_dict(params))["layers"][1]["attn"]
    np.testing.assert_array_equal(attn["q_norm"]["weight"], weights["blk.1.attn_q_norm.weight"])
    np.testing.assert_array_equal(attn["k_norm"]["weight"], weights["blk.1.attn_k_norm.weight"])
    np.testing.assert_array_equal(  # not un-permuted: llama.cpp writes qwen3 q/k as HF does
        attn["k_proj"], weights["blk.1.attn_k.weight"].T.reshape(64, 2, 128)
    )


@pytest.mark.hf
def test_qwen3_gguf_logits_match_transformers(tmp_path):
    torch = torch_or_skip()
    import transformers

    from rljax.models import load_gguf

    _write_qwen3_gguf(str(tmp_path / "qwen3.gguf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="qwen3.gguf", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    _, graphdef, params = load_gguf(str(tmp_path / "qwen3.gguf"))
    err = parity(model, graphdef, params)
    print(f"qwen3 GGUF: max relative logits error {err:.2e}")
    assert err < _TOL


def test_validation_refuses_lope_with_a_qwen3_moe_checkpoint(tmp_path):
    """model.num_experts is 0 for a checkpoint run: the experts come from its config.json."""
    from configs.grpo_addition import get_config
    from rljax.config import validate_config

    _, params = random_params(_QWEN3_MOE, seed=0)
    extra = {"max_position_embeddings": 4096}
    save_hf_checkpoint(tmp_path, _QWEN3_MOE, params, model_type="qwen3_moe", extra_config=extra)
    config = get_config()
    config.model.checkpoint = str(tmp_path)
    config.lope.num_perturbed = 1
    with pytest.raises(ValueError, match=r"^lope does not combine with an MoE model yet; .* 4 "):
        validate_config(config)
