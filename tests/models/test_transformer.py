"""Transformer properties: config validation, GQA as repeated heads, dtypes, tied embeddings."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, positions_from_mask, rope_frequencies

BASE = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)


def run(config, params_or_seed=0, batch=2, length=9):
    graphdef, params = create_model(config, seed=0)
    if not isinstance(params_or_seed, int):
        params = params_or_seed
    tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, config.vocab_size)
    mask = jnp.ones_like(tokens, bool)
    return forward(graphdef, params, tokens, positions_from_mask(mask), mask)[0], params


def test_gqa_equals_multi_head_attention_with_repeated_kv_heads():
    gqa = TransformerConfig(**BASE)
    logits_gqa, params = run(gqa)
    mha = gqa.replace(n_kv_heads=4)
    mha_params = nnx.to_pure_dict(params)
    attn = mha_params["layers"]["attn"]  # stacked: [n_layers, d_model, kv_heads, head_dim]
    for name in ("k_proj", "v_proj"):  # kv head j serves query heads 2j and 2j+1
        attn[name] = jnp.repeat(attn[name], 2, axis=2)
    _, template = create_model(mha)
    nnx.replace_by_pure_dict(template, mha_params)
    logits_mha, _ = run(mha, template)
    np.testing.assert_allclose(logits_gqa, logits_mha, atol=1e-5, rtol=1e-5)


def test_causality_future_tokens_do_not_change_past_logits():
    config = TransformerConfig(**BASE)
    graphdef, params = create_model(config)
    tokens = jax.random.randint(jax.random.key(2), (1, 8), 0, config.vocab_size)
    changed = tokens.at[0, 5:].set((tokens[0, 5:] + 1) % config.vocab_size)
    mask = jnp.ones_like(tokens, bool)
    pos = positions_from_mask(mask)
    a = forward(graphdef, params, tokens, pos, mask)[0]
    b = forward(graphdef, params, changed, pos, mask)[0]
    np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_bfloat16_compute_is_close_to_float32():
    config = TransformerConfig(**BASE)
    f32, params = run(config)
    bf16, _ = run(config.replace(dtype="bfloat16"), params)
    assert bf16.dtype == jnp.float32  # logits always come back in float32
    np.testing.assert_allclose(bf16, f32, atol=0.05)


def test_bfloat16_params_are_stored_in_bfloat16():
    _, params = create_model(TransformerConfig(**BASE, param_dtype="bfloat16"))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_tied_embeddings_have_no_lm_head_and_use_the_embedding():
    config = TransformerConfig(**BASE, tie_embeddings=True)
    graphdef, params = create_model(config)
    assert "lm_head" not in nnx.to_pure_dict(params)
    model = nnx.merge(graphdef, params)
    hidden = jax.random.normal(jax.random.key(0), (3, config.d_model))
    np.testing.assert_allclose(model.logits(hidden), hidden @ model.embed[...].T, atol=1e-5)


def test_rope_frequencies_default_and_linear():
    config = TransformerConfig(**BASE, rope_theta=500.0)
    dim = config.resolved_head_dim
    want = 1.0 / 500.0 ** (np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(rope_frequencies(config), want, rtol=1e-6)
    linear = config.replace(rope_scaling={"rope_type": "linear", "factor": 4.0})
    np.testing.assert_allclose(rope_frequencies(linear), want / 4.0, rtol=1e-6)


def test_config_is_hashable_with_rope_scaling():
    config = TransformerConfig(**BASE, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert hash(config) == hash(config.replace())
    assert config.rope_scaling_dict == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(n_kv_heads=3), "multiple of n_kv_heads"),
        (dict(d_model=30), "not divisible by n_heads"),
        (dict(dtype="float64"), "dtype"),
        (dict(n_layers=0), "n_layers"),
        (dict(rope_scaling={"rope_type": "yarn"}), "not supported"),
    ],
)
def test_config_errors_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{**BASE, **changes})


@pytest.mark.parametrize("experts", [0, 4])
def test_block_remat_gives_the_same_loss_and_gradient_and_keeps_less(experts):
    cfg = TransformerConfig(
        vocab_size=40, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, num_experts=experts
    )
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 64)), jnp.int32)
    mask = jnp.ones_like(tokens, bool)

    def loss_and_grad(remat):
        graphdef, params = create_model(dataclasses.replace(cfg, remat=remat), seed=0)

        def loss(p):
            logits, _ = forward(graphdef, p, tokens, positions_from_mask(mask), mask)
            return jax.nn.logsumexp(logits, -1).mean()

        fn = jax.jit(jax.value_and_grad(loss))
        temp = fn.lower(params).compile().memory_analysis().temp_size_in_bytes
        return fn(params), temp

    (value, grads), temp = loss_and_grad("none")
    (value_r, grads_r), temp_r = loss_and_grad("block")
    np.testing.assert_allclose(value_r, value, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_r, grads
    )
    assert temp_r < temp  # the blocks' activations are not all kept for the backward pass


def test_query_chunked_attention_equals_full_attention_and_keeps_less():
    cfg = TransformerConfig(**BASE)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 70)), jnp.int32)
    mask = jnp.asarray(np.arange(70)[None, :] >= np.array([[0], [5]]))  # left padding in row 1

    def loss_and_grad(chunk):
        graphdef, params = create_model(dataclasses.replace(cfg, attention_chunk=chunk), seed=0)

        def loss(p):
            logits, _ = forward(graphdef, p, tokens, positions_from_mask(mask), mask)
            return (jax.nn.logsumexp(logits, -1) * mask).sum()

        fn = jax.jit(jax.value_and_grad(loss))
        temp = fn.lower(params).compile().memory_analysis().temp_size_in_bytes
        return fn(params), temp

    (value, grads), temp = loss_and_grad(0)
    (value_c, grads_c), temp_c = loss_and_grad(16)  # 70 = 4 x 16 + 6: a padded last block
    np.testing.assert_allclose(value_c, value, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_c, grads
    )
    assert temp_c < temp
    with pytest.raises(ValueError, match="attention_chunk=-1"):
        TransformerConfig(**BASE, attention_chunk=-1)


def test_bidirectional_model_lets_past_tokens_see_future_ones():
    tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, 40)
    changed = tokens.at[:, -1].set((tokens[:, -1] + 1) % 40)
    cfg = TransformerConfig(**BASE, causal=False)
    graphdef, params = create_model(cfg, seed=0)
    mask = jnp.ones_like(tokens, bool)
    a = forward(graphdef, params, tokens, positions_from_mask(mask), mask)[0]
    b = forward(graphdef, params, changed, positions_from_mask(mask), mask)[0]
    assert not np.allclose(a[:, 0], b[:, 0])  # the first token's logits see the last token
    cfg_causal = TransformerConfig(**BASE)
    a = forward(*create_model(cfg_causal, seed=0), tokens, positions_from_mask(mask), mask)[0]
    b = forward(*create_model(cfg_causal, seed=0), changed, positions_from_mask(mask), mask)[0]
    np.testing.assert_array_equal(a[:, :-1], b[:, :-1])
