"""Sliding-window attention: the window's bounds, and the same window in every attention path
(query chunks, packing, cached decoding, the sampler)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, init_cache, positions_from_mask
from rljax.rollout.sampler import generate
from rljax.train.packing import packed_hidden_states

forward = jax.jit(forward, static_argnums=0)

BASE = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)
# Layer 0 windowed, layer 1 full: a per-layer pattern exercises both kinds in one model.
MIXED = TransformerConfig(
    **BASE, sliding_window=3, layer_types=("sliding_attention", "full_attention")
)


def _logits(config, params, tokens, mask, seed=0):
    graphdef, _ = create_model(config, seed=seed)
    return forward(graphdef, params, tokens, positions_from_mask(mask), mask)[0]


def _left_padded(batch: int, length: int, pads: list[int], seed: int = 0):
    tokens = jax.random.randint(jax.random.key(seed), (batch, length), 2, BASE["vocab_size"])
    mask = jnp.arange(length)[None, :] >= jnp.asarray(pads)[:, None]
    return jnp.where(mask, tokens, 0), mask


def test_a_query_sees_exactly_the_last_window_tokens():
    """One layer with window w: the logits at position p equal full attention over tokens
    p - w + 1 .. p alone (at their own positions), and differ from full attention over all."""
    window = 3
    config = TransformerConfig(**{**BASE, "n_layers": 1}, sliding_window=window)
    graphdef, params = create_model(config, seed=1)
    full_graphdef, _ = create_model(config.replace(sliding_window=None), seed=1)
    tokens, mask = _left_padded(1, 9, [0])
    positions = positions_from_mask(mask)
    windowed = forward(graphdef, params, tokens, positions, mask)[0][0]
    full = forward(full_graphdef, params, tokens, positions, mask)[0][0]
    for p in range(9):
        lo = max(0, p - window + 1)
        alone = forward(
            full_graphdef,
            params,
            tokens[:, lo : p + 1],
            positions[:, lo : p + 1],
            mask[:, lo : p + 1],
        )[0][0, -1]
        np.testing.assert_allclose(windowed[p], alone, atol=1e-5, rtol=1e-5)
    assert np.abs(np.asarray(windowed[window:] - full[window:])).min(axis=-1).max() > 1e-3
    np.testing.assert_allclose(windowed[:window], full[:window], atol=1e-6)


def test_query_chunks_packing_and_cache_keep_the_window():
    graphdef, params = create_model(MIXED, seed=2)
    model = nnx.merge(graphdef, params)
    tokens, mask = _left_padded(3, 10, [0, 4, 7])
    positions = positions_from_mask(mask)
    reference = np.asarray(model(tokens, positions, mask)[0])
    valid = np.asarray(mask)
    full_graphdef, _ = create_model(MIXED.replace(sliding_window=None, layer_types=None))
    unwindowed = np.asarray(forward(full_graphdef, params, tokens, positions, mask)[0])
    assert np.abs(unwindowed - reference)[valid].max() > 1e-3  # the window matters here

    chunked_graphdef, _ = create_model(MIXED.replace(attention_chunk=4))
    chunked = forward(chunked_graphdef, params, tokens, positions, mask)[0]
    np.testing.assert_allclose(np.asarray(chunked)[valid], reference[valid], atol=1e-5)

    # Three rows of 6, 3 and 3 real tokens packed into two rows of 10.
    packed = packed_hidden_states(model, tokens, positions, mask, rows=2)
    np.testing.assert_allclose(np.asarray(model.logits(packed))[valid], reference[valid], atol=1e-5)

    cache, pieces = init_cache(MIXED, 3, 12), []
    for lo, hi in [(0, 5), (5, 6), (6, 8), (8, 9), (9, 10)]:  # prefill, then 1-2 at a time
        logits, cache = forward(
            graphdef, params, tokens[:, lo:hi], positions[:, lo:hi], mask[:, lo:hi], cache
        )
        pieces.append(logits)
    incremental = np.asarray(jnp.concatenate(pieces, axis=1))
    np.testing.assert_allclose(incremental[valid], reference[valid], atol=1e-5)


def _teacher_forced(graphdef, params, out):
    tokens = jnp.concatenate([out.prompt_tokens, out.completion_tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask, out.completion_mask], axis=1)
    logits = forward(graphdef, params, tokens, positions_from_mask(mask), mask)[0]
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    p = out.prompt_tokens.shape[1]
    picked = jnp.take_along_axis(logprobs[:, p - 1 : -1], out.completion_tokens[..., None], -1)
    return jnp.where(out.completion_mask, picked[..., 0], 0.0)


@pytest.mark.parametrize("experts", [0, 3])
def test_sampler_logprobs_equal_teacher_forcing_past_the_window(experts):
    """Generation (10 tokens) far longer than the window (3), dense and Mixtral-style MoE."""
    config = TransformerConfig(**BASE, sliding_window=3, num_experts=experts)
    graphdef, params = create_model(config, seed=3)
    prompts, prompt_mask = _left_padded(2, 5, [0, 3], seed=4)
    out = generate(
        graphdef,
        params,
        prompts,
        prompt_mask,
        jax.random.key(5),
        max_new_tokens=10,
        eos_id=-1,
        pad_id=0,
        n_samples=2,
    )
    assert bool(out.completion_mask.all())
    reference = _teacher_forced(graphdef, params, out)
    np.testing.assert_allclose(out.policy_logprobs, reference, atol=1e-5)
    full_graphdef, _ = create_model(config.replace(sliding_window=None), seed=3)
    unwindowed = _teacher_forced(full_graphdef, params, out)
    assert np.abs(np.asarray(unwindowed - reference)).max() > 1e-3


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(sliding_window=0), "sliding_window=0 must be >= 1"),
        (dict(sliding_window=2, layer_types=("full_attention",)), "give one per layer"),
        (dict(sliding_window=2, layer_types=("local", "full_attention")), "'local'"),
        (dict(layer_types=("sliding_attention",) * 2), "sliding_window is None"),
        (dict(sliding_window=2, causal=False), "causal=False"),
    ],
)
def test_window_config_errors_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**BASE, **changes)
    assert TransformerConfig(
        **BASE, sliding_window=2, layer_types=["full_attention"] * 2
    ).layer_types == (
        "full_attention",
        "full_attention",
    )
