"""Log-probabilities and entropies of given tokens, computed in chunks over the vocabulary.

A [B, T, V] float32 logits tensor never exists at once: the output matrix is visited in
vocabulary chunks with an online log-sum-exp (running max m, sum of exp s, and sum of
exp * logit u), and each chunk is rematerialised in the backward pass.
  log p(y) = z_y - (m + log s),   H = (m + log s) - u / s.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.transformer import positions_from_mask


def _chunk_stats(hidden, head_chunk, targets, offset):
    """Max, sum-exp (relative to that max), sum exp*logit and the target logit of one chunk."""
    logits = jnp.einsum("btd,dv->btv", hidden, head_chunk, preferred_element_type=jnp.float32)
    m = jnp.max(logits, axis=-1)
    e = jnp.exp(logits - m[..., None])
    local = targets - offset
    inside = (local >= 0) & (local < logits.shape[-1])
    picked = jnp.take_along_axis(
        logits, jnp.clip(local, 0, logits.shape[-1] - 1)[..., None], axis=-1
    )[..., 0]
    return m, e.sum(-1), (e * logits).sum(-1), jnp.where(inside, picked, 0.0)


def _merge(acc, chunk):
    """Combines running statistics with a chunk's, rescaling both to the larger max."""
    m0, s0, u0, t0 = acc
    m1, s1, u1, t1 = chunk
    m = jnp.maximum(m0, m1)
    a0, a1 = jnp.exp(m0 - m), jnp.exp(m1 - m)
    return m, s0 * a0 + s1 * a1, u0 * a0 + u1 * a1, t0 + t1


def token_logprobs_and_entropy(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk_size: int = 8192
) -> tuple[jax.Array, jax.Array]:
    """log p(targets) and the entropy of the full next-token distribution.

    Args:
      hidden: [B, T, D] final hidden states.
      head: [D, V] output matrix.
      targets: [B, T] int token ids whose log-probability is wanted.
      chunk_size: vocabulary columns per chunk; V need not be a multiple.

    Returns:
      logprobs [B, T] and entropy [B, T], both float32.
    """
    chex.assert_rank([hidden, head, targets], [3, 2, 2])
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    vocab = head.shape[1]
    chunk_size = min(chunk_size, vocab)
    n_full, rest = divmod(vocab, chunk_size)
    stats = jax.checkpoint(_chunk_stats)

    def body(acc, i):
        offset = i * chunk_size
        chunk = jax.lax.dynamic_slice_in_dim(head, offset, chunk_size, axis=1)
        return _merge(acc, stats(hidden, chunk, targets, offset)), None

    acc = stats(hidden, head[:, :chunk_size], targets, 0)
    acc, _ = jax.lax.scan(body, acc, jnp.arange(1, n_full))
    if rest:
        acc = _merge(
            acc, stats(hidden, head[:, n_full * chunk_size :], targets, n_full * chunk_size)
        )
    m, s, u, target_logit = acc
    lse = m + jnp.log(s)
    return target_logit - lse, lse - u / s


def completion_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    completion_mask: jax.Array,
    chunk_size: int = 8192,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log-probs and entropies of a completion given its prompt.

    Args:
      graphdef, params: the policy.
      prompt_tokens, prompt_mask: [B, P], left-padded.
      completion_tokens, completion_mask: [B, T].
      chunk_size: vocabulary chunk (see `token_logprobs_and_entropy`).

    Returns:
      logprobs [B, T] and entropy [B, T] of the next-token distributions that produced each
      completion token, zero where `completion_mask` is False.
    """
    model = nnx.merge(graphdef, params)
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
    hidden, _ = model.hidden_states(tokens, positions_from_mask(mask), mask)
    p = prompt_tokens.shape[1]
    # The state after token i predicts token i + 1: states P-1 .. P+T-2 predict the completion.
    logprobs, entropy = token_logprobs_and_entropy(
        hidden[:, p - 1 : -1], model.output_head(), completion_tokens, chunk_size
    )
    return jnp.where(completion_mask, logprobs, 0.0), jnp.where(completion_mask, entropy, 0.0)
