"""Masked-diffusion policy: config checks, the MASK id never predicted, padding and slicing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.diffusion.policy import (
    DiffusionConfig,
    create_diffusion_model,
    diffusion_config,
    masked_logits,
)
from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model, forward

CONFIG = diffusion_config(11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
MASK = CONFIG.mask_id
# Jitted once: eager op-by-op dispatch of the forward pass is slower than compiling it.
LOGITS = jax.jit(masked_logits, static_argnums=0, static_argnames=("mask_id", "length"))


@pytest.fixture(scope="module")
def model():
    return create_diffusion_model(CONFIG, seed=1)


def test_diffusion_config_reserves_the_id_after_the_tokenizer_vocabulary():
    config = diffusion_config(259, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    assert (config.model.vocab_size, config.mask_id, config.model.causal) == (260, 259, False)
    with pytest.raises(ValueError, match="sets vocab_size"):
        diffusion_config(
            259, vocab_size=300, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32
        )


def test_config_rejects_causal_models_and_out_of_vocabulary_mask_ids():
    causal = TransformerConfig(
        vocab_size=12, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32
    )
    with pytest.raises(ValueError, match="causal=False"):
        DiffusionConfig(model=causal, mask_id=11)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        DiffusionConfig(model=causal.replace(causal=False), mask_id=12)
    graphdef, params = abstract_model(causal)  # shapes only: the check comes first
    tokens = jnp.zeros((1, 3), jnp.int32)
    with pytest.raises(ValueError, match="causal=False"):
        masked_logits(graphdef, params, tokens, tokens >= 0, mask_id=11)


def test_logits_are_the_bidirectional_forward_with_the_mask_column_at_minus_inf(model):
    graphdef, params = model
    tokens = jnp.array([[3, 4, 5, MASK, MASK, MASK, 6], [1, 2, MASK, 7, MASK, 9, MASK]])
    valid = jnp.ones(tokens.shape, bool)
    logits = np.asarray(LOGITS(graphdef, params, tokens, valid, mask_id=MASK))
    assert logits.shape == (2, 7, CONFIG.model.vocab_size) and logits.dtype == np.float32
    assert np.all(logits[..., MASK] == -np.inf)
    assert np.all(np.isfinite(np.delete(logits, MASK, axis=-1)))
    # Independent path: the plain transformer forward with positions 0..L-1.
    positions = jnp.broadcast_to(jnp.arange(7), tokens.shape)
    reference, _ = jax.jit(forward, static_argnums=0)(graphdef, params, tokens, positions, valid)
    np.testing.assert_allclose(
        np.delete(logits, MASK, -1),
        np.delete(np.asarray(reference), MASK, -1),
        rtol=1e-5,
        atol=1e-6,
    )
    # Bidirectional: the first masked position's logits depend on a later token.
    changed = tokens.at[1, 3].set(8)
    other = np.asarray(LOGITS(graphdef, params, changed, valid, mask_id=MASK))
    assert not np.allclose(other[1, 2], logits[1, 2])


def test_left_padding_changes_no_other_logits(model):
    graphdef, params = model
    seq = jnp.array([[3, 4, 5, MASK, MASK]])
    plain = LOGITS(graphdef, params, seq, jnp.ones((1, 5), bool), mask_id=MASK)
    padded = jnp.array([[0, 0, 3, 4, 5, MASK, MASK], [9, 6, 3, 4, 5, MASK, MASK]])
    valid = jnp.array([[False, False] + [True] * 5] * 2)
    shifted = LOGITS(graphdef, params, padded, valid, mask_id=MASK)
    for row in range(2):  # the same for any pad token values
        np.testing.assert_allclose(shifted[row, 2:], plain[0], rtol=1e-5, atol=1e-6)


def test_start_and_length_select_positions_also_when_start_is_traced(model):
    graphdef, params = model
    tokens = jnp.array([[2, 3, 4, MASK, MASK, MASK, MASK], [0, 5, 6, MASK, 1, MASK, MASK]])
    valid = jnp.array([[True] * 7, [False] + [True] * 6])
    full = LOGITS(graphdef, params, tokens, valid, mask_id=MASK)
    window = LOGITS(graphdef, params, tokens, valid, mask_id=MASK, start=jnp.int32(4), length=2)
    np.testing.assert_allclose(window, full[:, 4:6], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs a static `length`"):
        masked_logits(graphdef, params, tokens, valid, mask_id=MASK, start=jnp.int32(1))
