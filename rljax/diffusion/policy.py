"""A LLaDA-style masked-diffusion language model: the shared transformer, bidirectional, plus
a reserved MASK token.

A masked-diffusion LM (LLaDA, arXiv 2502.09992) is the decoder of `rljax.models.transformer`
with `causal=False` (every token attends to every valid token) and one vocabulary id reserved
as MASK. A noisy sequence has some tokens replaced by MASK; the logits at a MASK position
predict the clean token there. The prompt is always clean; a completion starts fully masked and
is denoised by `rljax.diffusion.sampler`.

Choosing the MASK id: reserve an id the tokenizer never emits. For the byte tokenizer
(`rljax.models.ByteTokenizer`, ids 0..258) build the model with vocab_size 259 + 1 = 260 and
mask_id = 259; `diffusion_config(token_vocab_size, ...)` does exactly that for any tokenizer.
`masked_logits` gives the MASK id a logit of -inf, so it is never predicted (its probability is
exactly 0 and its log-probability -inf: mask it out before any p * log p sum).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, positions_from_mask


@dataclasses.dataclass(frozen=True)
class DiffusionConfig:
    """A masked-diffusion LM: a bidirectional transformer and its reserved MASK id.

    Attributes:
      model: the transformer; must have `causal=False`.
      mask_id: the reserved MASK token id, in [0, model.vocab_size).
    """

    model: TransformerConfig
    mask_id: int

    def __post_init__(self):
        _check(self.model, self.mask_id)


def _check(config: TransformerConfig, mask_id: int) -> None:
    if config.causal:
        raise ValueError(
            "a masked-diffusion LM needs bidirectional attention: set "
            "TransformerConfig(causal=False)"
        )
    if not 0 <= mask_id < config.vocab_size:
        raise ValueError(
            f"mask_id={mask_id} is outside the vocabulary [0, {config.vocab_size}); reserve an "
            "id the tokenizer never emits, e.g. vocab_size = tokenizer vocab + 1 and mask_id = "
            "tokenizer vocab (`diffusion_config`)"
        )


def diffusion_config(token_vocab_size: int, **transformer_kwargs) -> DiffusionConfig:
    """A `DiffusionConfig` whose MASK id is appended after a tokenizer's vocabulary.

    Args:
      token_vocab_size: number of ids the tokenizer emits (259 for `ByteTokenizer`).
      **transformer_kwargs: every other `TransformerConfig` field (d_model, n_layers, ...);
        `vocab_size` and `causal` are set here.

    Returns:
      DiffusionConfig with model.vocab_size = token_vocab_size + 1, causal=False and
      mask_id = token_vocab_size.
    """
    for name in ("vocab_size", "causal"):
        if name in transformer_kwargs:
            raise ValueError(f"diffusion_config sets {name} itself; do not pass it")
    model = TransformerConfig(vocab_size=token_vocab_size + 1, causal=False, **transformer_kwargs)
    return DiffusionConfig(model=model, mask_id=token_vocab_size)


def create_diffusion_model(
    config: DiffusionConfig, seed: int = 0
) -> tuple[nnx.GraphDef, nnx.State]:
    """Randomly initialised (graphdef, params) of the bidirectional transformer of `config`."""
    return create_model(config.model, seed)


def masked_logits(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens: jax.Array,
    valid_mask: jax.Array,
    *,
    mask_id: int,
    start: int | jax.Array = 0,
    length: int | None = None,
) -> jax.Array:
    """Float32 logits predicting the clean token at every position of a partly masked sequence.

    One bidirectional forward pass over [prompt, completion] (LLaDA's mask predictor). RoPE
    positions count the valid tokens (`positions_from_mask`), so left padding of the prompt
    changes no other position's logits. The MASK id gets -inf everywhere.

    Args:
      graphdef, params: a model with `causal=False` (`create_diffusion_model`).
      tokens: [B, L] int ids; MASK (`mask_id`) where a token is hidden.
      valid_mask: [B, L] bool, False on padding (MASK positions are valid tokens).
      mask_id: the reserved MASK id.
      start: first position whose logits are returned (may be traced).
      length: number of positions from `start` (static); None means L - start with a static
        `start`. Only those positions go through the output head, which saves the [B, L, V]
        tensor when only the completion, or one block of it, is needed.

    Returns:
      logits: [B, length, V] float32 (the MASK column is -inf).
    """
    chex.assert_rank([tokens, valid_mask], 2)
    chex.assert_equal_shape([tokens, valid_mask])
    if length is None:
        if not isinstance(start, int):
            raise ValueError("an array `start` needs a static `length`")
        length = tokens.shape[1] - start
    model = nnx.merge(graphdef, params)
    _check(model.config, mask_id)
    valid_mask = valid_mask.astype(bool)
    hidden, _ = model.hidden_states(tokens, positions_from_mask(valid_mask), valid_mask)
    if not (isinstance(start, int) and start == 0 and length == tokens.shape[1]):
        hidden = jax.lax.dynamic_slice_in_dim(hidden, start, length, axis=1)
    logits = model.logits(hidden)
    return logits.at[..., mask_id].set(-jnp.inf)
