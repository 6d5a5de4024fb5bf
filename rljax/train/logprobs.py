"""Log-probabilities and other next-token statistics, computed in chunks over the vocabulary.

A [B, T, V] float32 logits tensor never exists at once: the output matrix is visited in
vocabulary chunks with an online log-sum-exp (running max m, sum of exp s, sum of exp * logit
u and sum of exp^2 q), and each chunk is rematerialised in the backward pass.
  log p(y) = z_y - (m + log s),   H = (m + log s) - u / s,   sum_v p_v^2 = q / s^2.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.transformer import positions_from_mask
from rljax.train.packing import packed_hidden_states


class TokenStats(NamedTuple):
    """Per-token statistics of next-token distributions, each [B, T] float32."""

    logprobs: jax.Array  # log p(target)
    entropy: jax.Array  # -sum_v p_v log p_v
    sum_sq_prob: jax.Array  # sum_v p_v^2 (the collision probability)


def _logits_at(logits: jax.Array, ids: jax.Array, offset) -> jax.Array:
    """[B, T, K] logits of the vocabulary chunk starting at `offset` at token `ids` [B, T, K]:
    the chunk's logit for the ids inside it, 0 for the others (summed over chunks, each id
    gets its logit once)."""
    local = ids - offset
    inside = (local >= 0) & (local < logits.shape[-1])
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, logits.shape[-1] - 1), axis=-1)
    return jnp.where(inside, picked, 0.0)


def _merge_sum_exp(m0, s0, m1, s1):
    """Two (max, sum of exp(x - max)) pairs as one, rescaled to the larger max."""
    m = jnp.maximum(m0, m1)
    return m, s0 * jnp.exp(m0 - m) + s1 * jnp.exp(m1 - m)


def _chunk_stats(hidden, head_chunk, targets, offset):
    """Max, sum-exp, sum exp*logit, sum exp^2 (relative to that max) and the target logit."""
    logits = jnp.einsum("btd,dv->btv", hidden, head_chunk, preferred_element_type=jnp.float32)
    m = jnp.max(logits, axis=-1)
    e = jnp.exp(logits - m[..., None])
    picked = _logits_at(logits, targets[..., None], offset)[..., 0]
    return m, e.sum(-1), (e * logits).sum(-1), (e * e).sum(-1), picked


def _merge(acc, chunk):
    """Combines running statistics with a chunk's, rescaling both to the larger max."""
    m0, s0, u0, q0, t0 = acc
    m1, s1, u1, q1, t1 = chunk
    m = jnp.maximum(m0, m1)
    a0, a1 = jnp.exp(m0 - m), jnp.exp(m1 - m)
    return m, s0 * a0 + s1 * a1, u0 * a0 + u1 * a1, q0 * a0**2 + q1 * a1**2, t0 + t1


def _scan_vocab(chunk_fn, merge_fn, vocab: int, chunk_size: int, *heads: jax.Array):
    """Folds `chunk_fn(*head_chunks, offset)` over vocabulary chunks with `merge_fn`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    chunk_size = min(chunk_size, vocab)
    n_full, rest = divmod(vocab, chunk_size)
    stats = jax.checkpoint(chunk_fn)

    def body(acc, i):
        offset = i * chunk_size
        chunks = [jax.lax.dynamic_slice_in_dim(h, offset, chunk_size, axis=1) for h in heads]
        return merge_fn(acc, stats(*chunks, offset)), None

    acc = stats(*[h[:, :chunk_size] for h in heads], 0)
    acc, _ = jax.lax.scan(body, acc, jnp.arange(1, n_full))
    if rest:
        tail = n_full * chunk_size
        acc = merge_fn(acc, stats(*[h[:, tail:] for h in heads], tail))
    return acc


def token_stats(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk_size: int = 8192
) -> TokenStats:
    """log p(targets), entropy and sum of squared probabilities of each next-token distribution.

    Args:
      hidden: [B, T, D] final hidden states.
      head: [D, V] output matrix.
      targets: [B, T] int token ids whose log-probability is wanted.
      chunk_size: vocabulary columns per chunk; V need not be a multiple.

    Returns:
      `TokenStats` of [B, T] float32 arrays. Statistics a caller does not use cost nothing
      under jit (dead-code elimination).
    """
    chex.assert_rank([hidden, head, targets], [3, 2, 2])
    m, s, u, q, target_logit = _scan_vocab(
        lambda chunk, offset: _chunk_stats(hidden, chunk, targets, offset),
        _merge,
        head.shape[1],
        chunk_size,
        head,
    )
    lse = m + jnp.log(s)
    return TokenStats(target_logit - lse, lse - u / s, q / (s * s))


def token_logprobs_and_entropy(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk_size: int = 8192
) -> tuple[jax.Array, jax.Array]:
    """log p(targets) [B, T] and the entropy [B, T] of each next-token distribution."""
    stats = token_stats(hidden, head, targets, chunk_size)
    return stats.logprobs, stats.entropy


def _overlap_chunk(hidden_p, hidden_q, head_p, head_q, offset):
    del offset
    zp = jnp.einsum("btd,dv->btv", hidden_p, head_p, preferred_element_type=jnp.float32)
    zq = jnp.einsum("btd,dv->btv", hidden_q, head_q, preferred_element_type=jnp.float32)
    mp, mq = zp.max(-1), zq.max(-1)
    cross = jnp.exp(0.5 * ((zp - mp[..., None]) + (zq - mq[..., None]))).sum(-1)
    return mp, jnp.exp(zp - mp[..., None]).sum(-1), mq, jnp.exp(zq - mq[..., None]).sum(-1), cross


def _overlap_merge(acc, chunk):
    mp0, sp0, mq0, sq0, c0 = acc
    mp1, sp1, mq1, sq1, c1 = chunk
    mp, mq = jnp.maximum(mp0, mp1), jnp.maximum(mq0, mq1)
    ap0, ap1, aq0, aq1 = jnp.exp(mp0 - mp), jnp.exp(mp1 - mp), jnp.exp(mq0 - mq), jnp.exp(mq1 - mq)
    cross = c0 * jnp.sqrt(ap0 * aq0) + c1 * jnp.sqrt(ap1 * aq1)
    return mp, sp0 * ap0 + sp1 * ap1, mq, sq0 * aq0 + sq1 * aq1, cross


def token_hellinger(
    hidden_p: jax.Array,
    head_p: jax.Array,
    hidden_q: jax.Array,
    head_q: jax.Array,
    chunk_size: int = 8192,
) -> jax.Array:
    """Squared Hellinger distance 1 - sum_v sqrt(p_v q_v) between two next-token distributions.

    Both policies' logits are visited chunk by chunk (no [B, T, V] tensor); the Bhattacharyya
    sum is rescaled with the running maxima like the log-sum-exp. The result lies in [0, 1]
    and is 0 when the two distributions are equal (clamped at 0 against rounding).

    Args:
      hidden_p, head_p: [B, T, D] hidden states and [D, V] output matrix of the first policy.
      hidden_q, head_q: the same for the second policy (same T and V; D may differ).
      chunk_size: vocabulary columns per chunk.

    Returns:
      [B, T] float32.
    """
    chex.assert_rank([hidden_p, head_p, hidden_q, head_q], [3, 2, 3, 2])
    chex.assert_equal_shape_prefix([hidden_p, hidden_q], 2)
    if head_p.shape[1] != head_q.shape[1]:
        raise ValueError(f"vocabularies differ: {head_p.shape[1]} vs {head_q.shape[1]}")
    _, sp, _, sq, cross = _scan_vocab(
        lambda cp, cq, offset: _overlap_chunk(hidden_p, hidden_q, cp, cq, offset),
        _overlap_merge,
        head_p.shape[1],
        chunk_size,
        head_p,
        head_q,
    )
    return jnp.maximum(1.0 - cross / jnp.sqrt(sp * sq), 0.0)


def _picked_chunk(hidden, head_chunk, ids, offset):
    """Max and sum-exp of a chunk's logits (as `_chunk_stats`) and the logits of the `ids`
    [B, T, K] that fall in it (0 for the others)."""
    logits = jnp.einsum("btd,dv->btv", hidden, head_chunk, preferred_element_type=jnp.float32)
    m = jnp.max(logits, axis=-1)
    return m, jnp.exp(logits - m[..., None]).sum(-1), _logits_at(logits, ids, offset)


def _picked_merge(acc, chunk):
    (m0, s0, p0), (m1, s1, p1) = acc, chunk
    return (*_merge_sum_exp(m0, s0, m1, s1), p0 + p1)


def token_logprobs_of(
    hidden: jax.Array, head: jax.Array, ids: jax.Array, chunk_size: int = 8192
) -> jax.Array:
    """log p(id) of several token ids per position, e.g. a teacher's top-k candidates.

    Args:
      hidden: [B, T, D] final hidden states.
      head: [D, V] output matrix.
      ids: [B, T, K] int token ids in [0, V).
      chunk_size: vocabulary columns per chunk (no [B, T, V] tensor exists at once).

    Returns:
      [B, T, K] float32, differentiable in `hidden` and `head`.
    """
    chex.assert_rank([hidden, head, ids], [3, 2, 3])
    m, s, picked = _scan_vocab(
        lambda chunk, offset: _picked_chunk(hidden, chunk, ids, offset),
        _picked_merge,
        head.shape[1],
        chunk_size,
        head,
    )
    return picked - (m + jnp.log(s))[..., None]


def token_top_k(
    hidden: jax.Array, head: jax.Array, k: int, chunk_size: int = 8192
) -> tuple[jax.Array, jax.Array]:
    """The k likeliest next tokens of each position and their log-probs, chunk by chunk: each
    chunk's top k are merged with the running top k, next to the running log-sum-exp.

    Args:
      hidden: [B, T, D] final hidden states.
      head: [D, V] output matrix.
      k: candidates per position, 1 <= k <= V.
      chunk_size: vocabulary columns per chunk (raised to k when smaller).

    Returns:
      (log-probs [B, T, k] float32 in descending order, ids [B, T, k] int32).
    """
    chex.assert_rank([hidden, head], [3, 2])
    vocab = head.shape[1]
    if not 1 <= k <= vocab:
        raise ValueError(f"top-k k={k} must be in [1, {vocab}] (the vocabulary size)")

    def chunk_fn(head_chunk, offset):
        logits = jnp.einsum("btd,dv->btv", hidden, head_chunk, preferred_element_type=jnp.float32)
        m = jnp.max(logits, axis=-1)
        values, ids = jax.lax.top_k(logits, min(k, logits.shape[-1]))
        return m, jnp.exp(logits - m[..., None]).sum(-1), values, ids + offset

    def merge(acc, chunk):
        (m0, s0, v0, i0), (m1, s1, v1, i1) = acc, chunk
        m, s = _merge_sum_exp(m0, s0, m1, s1)
        values = jnp.concatenate([v0, v1], axis=-1)
        ids = jnp.concatenate([i0, i1], axis=-1)
        values, order = jax.lax.top_k(values, k)
        return m, s, values, jnp.take_along_axis(ids, order, axis=-1)

    m, s, values, ids = _scan_vocab(chunk_fn, merge, vocab, max(chunk_size, k), head)
    return values - (m + jnp.log(s))[..., None], ids.astype(jnp.int32)


class PolicyStates(NamedTuple):
    """A teacher-forced pass of a policy over prompt + completion."""

    prompt_hidden: jax.Array  # [B, P, D] final hidden states at the prompt tokens
    completion_hidden: jax.Array  # [B, T, D] the states that predict each completion token
    head: jax.Array  # [D, V] output matrix


def policy_states(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    completion_mask: jax.Array,
    routes: jax.Array | None = None,
    pack_rows: int = 0,
) -> PolicyStates:
    """Runs the policy once over prompt + completion.

    Args:
      graphdef, params: the policy.
      prompt_tokens, prompt_mask: [B, P], left-padded.
      completion_tokens, completion_mask: [B, T]; the mask says which completion tokens the
        pass attends to and counts positions over: in a multi-turn episode the policy's and
        the environment's tokens (`rljax.core.batch.context_mask`), not only the policy's.
      routes: MoE policies only: None to route freely, or [B, P + T, n_layers, k] experts to
        replay (`Rollout.routes`, routing replay; see `rljax.models.moe`).
      pack_rows: > 0 runs the pass on that many packed rows when the sequences fit
      (`rljax.train.packing`; the same states, less padding); not with `routes`.

    Returns:
      `PolicyStates`.

    Raises:
      ValueError: the model soft-caps its logits (`final_logit_softcap`), which the chunked
        statistics over `PolicyStates.head` do not apply.
    """
    model = nnx.merge(graphdef, params)
    if model.config.final_logit_softcap is not None:
        raise ValueError(
            f"the policy soft-caps its logits (final_logit_softcap="
            f"{model.config.final_logit_softcap}), which the trainer's chunked log-probs do not "
            "apply yet; train a model without final_logit_softcapping"
        )
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
    positions = positions_from_mask(mask)
    if pack_rows and routes is None:
        hidden = packed_hidden_states(model, tokens, positions, mask, pack_rows)
    else:
        hidden, _ = model.hidden_states(tokens, positions, mask, routes=routes)
    p = prompt_tokens.shape[1]
    # The state after token i predicts token i + 1: states P-1 .. P+T-2 predict the completion.
    return PolicyStates(hidden[:, :p], hidden[:, p - 1 : -1], model.output_head())


def completion_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    completion_mask: jax.Array,
    chunk_size: int = 8192,
    routes: jax.Array | None = None,
    pack_rows: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log-probs and entropies of a completion given its prompt.

    Args:
      graphdef, params: the policy.
      prompt_tokens, prompt_mask: [B, P], left-padded.
      completion_tokens, completion_mask: [B, T].
      chunk_size: vocabulary chunk (see `token_stats`).
      routes: MoE only: [B, P + T, n_layers, k] experts to replay (see `policy_states`).
      pack_rows: > 0 packs the sequences into that many rows (see `policy_states`).

    Returns:
      logprobs [B, T] and entropy [B, T] of the next-token distributions that produced each
      completion token, zero where `completion_mask` is False.
    """
    states = policy_states(
        graphdef,
        params,
        prompt_tokens,
        prompt_mask,
        completion_tokens,
        completion_mask,
        routes,
        pack_rows,
    )
    stats = token_stats(states.completion_hidden, states.head, completion_tokens, chunk_size)
    zero = lambda x: jnp.where(completion_mask, x, 0.0)
    return zero(stats.logprobs), zero(stats.entropy)
