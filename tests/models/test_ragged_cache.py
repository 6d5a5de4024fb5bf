"""Ragged KV cache (`KVCache.index` per row [B], `hidden_states(..., cache_span=...)`), as the
rollout engine's decode slots use it: every row writes at its own slot and attention reads the
first `cache_span` slots only, and the logits equal a full teacher-forced forward pass (the
dense reference) and the scalar-index cache path."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, init_cache

DENSE = TransformerConfig(
    vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
CONFIGS = {
    "dense": DENSE,
    # Gemma 3 style: a sliding-window layer (window 3 < the rows' lengths) with its own local
    # RoPE base and a full-attention layer, sandwich norms, qk norms, tied embeddings.
    "gemma3": TransformerConfig(
        vocab_size=50, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=48, head_dim=16,
        qk_norm=True, norm_unit_offset=True, sandwich_norms=True, scale_embeddings=True,
        mlp_activation="gelu_tanh", query_pre_attn_scalar=16, rope_theta=20000.0,
        rope_local_theta=500.0, sliding_window=3,
        layer_types=("sliding_attention", "full_attention"), tie_embeddings=True,
    ),
}  # fmt: skip

PROMPT = np.array([4, 1, 6])  # prompt lengths of the three rows (prefilled together)
TOTAL = np.array([9, 8, 11])  # sequence lengths: rows end at different steps
WIDTH, CAPACITY = 12, 16

forward_jit = jax.jit(forward, static_argnums=0)


@functools.partial(jax.jit, static_argnums=(0, 6))
def cached_step(graphdef, params, tokens, positions, mask, cache, span):
    """Logits [B, T, V] and the updated cache, attending over the first `span` cache slots."""
    model = nnx.merge(graphdef, params)
    hidden, cache = model.hidden_states(tokens, positions, mask, cache, cache_span=span)
    return model.logits(hidden), cache


def _sequences(config):
    rng = np.random.default_rng(1)
    tokens = rng.integers(2, config.vocab_size, (3, WIDTH)).astype(np.int32)
    mask = np.arange(WIDTH) < TOTAL[:, None]
    return np.where(mask, tokens, 0), mask


def _garbage_cache(config, seed=0):
    """An empty cache whose key/value slots hold noise: only `valid` may keep it out."""
    cache = init_cache(config, 3, CAPACITY)
    noise = jax.random.normal(jax.random.key(seed), cache.keys.shape, cache.keys.dtype)
    return cache.replace(keys=noise * 10, values=-noise * 10)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ragged_decoding_equals_the_full_forward_pass(name):
    config = CONFIGS[name]
    graphdef, params = create_model(config, seed=2)
    tokens, mask = _sequences(config)
    positions = np.broadcast_to(np.arange(WIDTH, dtype=np.int32), tokens.shape)
    reference = np.asarray(forward_jit(graphdef, params, tokens, positions, mask)[0])

    # Prefill the prompts (right-padded, scalar index), then make the index per row.
    p = int(PROMPT.max())
    prompt_mask = np.arange(p) < PROMPT[:, None]
    logits, cache = cached_step(
        graphdef, params, tokens[:, :p], positions[:, :p], prompt_mask, _garbage_cache(config), None
    )
    np.testing.assert_allclose(
        np.asarray(logits)[prompt_mask], reference[:, :p][prompt_mask], atol=1e-5, rtol=1e-5
    )
    cache = cache.replace(index=jnp.asarray(PROMPT, jnp.int32))

    # Decode: one 2-token step, then 1-token steps; each row at its own slot `index` (its
    # next sequence position is `col`); attention over the first `span` slots (a multiple of 4
    # holding every written slot). At step 1 row 1 writes an invalid slot (a hole, as a
    # masked-out step leaves): later slots no longer equal positions, and only `valid` keeps
    # the hole out.
    col, index, spans = PROMPT.copy(), PROMPT.copy(), set()
    valid = np.zeros((3, CAPACITY), bool)
    valid[:, :p] = prompt_mask
    chunk, step = 2, 0
    while (col < TOTAL).any():
        cols = col[:, None] + np.arange(chunk)
        live = cols < TOTAL[:, None]
        step_tokens = np.take_along_axis(tokens, np.minimum(cols, WIDTH - 1), axis=1)
        hole = np.zeros(3, bool)
        hole[1] = step == 1
        live[hole] = False
        step_tokens[hole] = 7
        span = int(-(-(index.max() + chunk) // 4) * 4)
        spans.add(span)
        logits, cache = cached_step(
            graphdef, params, step_tokens, cols.astype(np.int32), live, cache, span
        )
        got = np.asarray(logits)
        want = np.take_along_axis(reference, np.minimum(cols, WIDTH - 1)[..., None], axis=1)
        np.testing.assert_allclose(got[live], want[live], atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(cache.index), index + chunk)
        slots = index[:, None] + np.arange(chunk)
        valid[np.nonzero(live)[0], slots[live]] = True
        col = np.where(live.any(1), col + chunk, col)
        index = np.where(live.any(1) | hole, index + chunk, index)
        cache = cache.replace(index=jnp.asarray(index, jnp.int32))
        chunk, step = 1, step + 1
    assert len(spans) >= 2 and min(spans) < CAPACITY  # the span really cut the cache
    np.testing.assert_array_equal(np.asarray(cache.valid), valid)
    assert valid.sum() == TOTAL.sum() and not valid[1, PROMPT[1] + 2]  # the hole


def test_uniform_per_row_index_equals_the_scalar_index_path():
    config = CONFIGS["dense"]
    graphdef, params = create_model(config, seed=2)
    tokens, mask = _sequences(config)
    positions = np.broadcast_to(np.arange(WIDTH, dtype=np.int32), tokens.shape)
    _, cache = cached_step(
        graphdef, params, tokens[:, :5], positions[:, :5], mask[:, :5], _garbage_cache(config), None
    )
    args = (tokens[:, 5:7], positions[:, 5:7], mask[:, 5:7])
    scalar_logits, scalar_cache = cached_step(graphdef, params, *args, cache, None)
    ragged_logits, ragged_cache = cached_step(
        graphdef, params, *args, cache.replace(index=jnp.full((3,), 5, jnp.int32)), CAPACITY
    )
    np.testing.assert_allclose(ragged_logits, scalar_logits, atol=1e-6, rtol=1e-6)
    for a, b in [
        (ragged_cache.keys, scalar_cache.keys),
        (ragged_cache.values, scalar_cache.values),
        (ragged_cache.valid, scalar_cache.valid),
        (ragged_cache.positions, scalar_cache.positions),
    ]:
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ragged_cache.index, [7, 7, 7])
    assert int(scalar_cache.index) == 7
