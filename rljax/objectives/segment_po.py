"""segment_po: a clipped surrogate on length-normalised importance ratios of delimited segments."""

import numbers
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp

from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.objective import Objective
from rljax.objectives.importance import apply_is_weight

# |log ratio| is clamped here before exp so padded or stale tokens cannot overflow (as verl does).
_MAX_LOG_RATIO = 20.0


def _check_delimiters(delimiter_ids: Sequence[int]) -> tuple[int, ...]:
    if isinstance(delimiter_ids, (numbers.Integral, str)):
        raise ValueError(
            f"delimiter_ids={delimiter_ids!r} must be a tuple of token ids, e.g. "
            f"({delimiter_ids!r},)"
        )
    ids = tuple(delimiter_ids)
    bad = [d for d in ids if isinstance(d, bool) or not isinstance(d, numbers.Integral)]
    if bad:
        raise ValueError(
            f"delimiter_ids={ids!r} holds non-integers {bad}; pass token ids, e.g. the ids of "
            "'\\n\\n' or of a step marker"
        )
    return tuple(int(d) for d in ids)


def segment_ids(
    completion_tokens: jax.Array, completion_mask: jax.Array, delimiter_ids: tuple[int, ...]
) -> jax.Array:
    """Index of each token's segment within its row, segments ending at delimiter tokens.

    Segments as in "Segment-Aligned Policy Optimization"; the paper's code is not
    available, so this split is an interpretation. Counting from 0, a valid token that is one
    of `delimiter_ids` closes its segment: it belongs to the segment it ends and the next token
    starts a new one. So the index of token t is the number of valid delimiter tokens strictly
    before t. Indices are non-decreasing along a row and lie in [0, T - 1]. A padded token
    (outside `completion_mask`) never closes a segment and gets the index the next segment
    would have; callers must still mask it out of every reduction.

    Args:
      completion_tokens: [B, T] int token ids.
      completion_mask: [B, T] bool, the valid tokens.
      delimiter_ids: token ids that end a segment; () gives one segment per row.

    Returns:
      [B, T] int32 segment indices.

    Raises:
      ValueError: if a delimiter id is not an int.
    """
    chex.assert_rank(completion_tokens, 2)
    chex.assert_equal_shape([completion_tokens, completion_mask])
    ids = _check_delimiters(delimiter_ids)
    if not ids:
        return jnp.zeros(completion_tokens.shape, jnp.int32)
    is_delim = jnp.isin(completion_tokens, jnp.asarray(ids, completion_tokens.dtype))
    closes = (is_delim & completion_mask.astype(bool)).astype(jnp.int32)  # [B, T]
    return (jnp.cumsum(closes, axis=1) - closes).astype(jnp.int32)  # exclusive count, per row


def segment_po(
    delimiter_ids: Sequence[int],
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """Segment-Aligned Policy Optimization's segment-level clipped surrogate (an interpretation).

    "Segment-Aligned Policy Optimization", named segment_po here because "SAPO" in verl, TRL,
    AReaL and SkyRL is Soft Adaptive Policy Optimization, a different method. Neither code nor
    a formula of the paper is available; this objective is an interpretation: GSPO's
    length-normalised ratio (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv
    2507.18071) taken per segment, the segments split at `delimiter_ids` (see `segment_ids`;
    e.g. reasoning steps split at newlines). For segment k of row i, over its valid
    (`batch.completion_mask`) tokens S_ik,
      log s_ik = mean_{t in S_ik} clamp(new_logprobs_t - old_logprobs_t, -20, 20),
      A_ik = mean_{t in S_ik} advantages_t,
      l_ik = -min(s_ik A_ik, clip(s_ik, 1 - eps_low, 1 + eps_high) A_ik).
    l_ik is written on every valid token of the segment and aggregated with
    `batch.loss_weights` (default "token-mean": each segment weighs by its weight sum). A
    clipped segment gives zero gradient to all its tokens. Segment ratios, like GSPO's, use all
    `completion_mask` tokens, also those whose loss weight is 0.

    Limits: with `delimiter_ids=()` every row is one segment and the loss and gradient equal
    `gspo(eps_low, eps_high, aggregation)` with the same aggregation (in any mode; note gspo's
    default mode is "seq-mean-token-mean", segment_po's "token-mean"). When every token is a
    delimiter each token is its own segment and this is `ppo_clip(eps_low, eps_high)`. The
    default eps 0.2 suits short segments; a long segment's geometric-mean ratio stays close to
    1, as in GSPO, and wants a narrower band.

    Metrics ("segment_po/...", over the segments with a valid token):
      "loss": the aggregated loss.
      "clip_frac": fraction of segments whose clipped term is taken.
      "segments_per_row": mean number of segments per row with a valid token.
      "ratio_mean": mean of s_ik.

    Args:
      delimiter_ids: token ids that close a segment.
      eps_low: lower clip range, s >= 1 - eps_low; in [0, 1).
      eps_high: upper clip range, s <= 1 + eps_high; >= 0.
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for non-integer delimiter ids, out-of-range clip parameters or an invalid
        aggregation.
    """
    ids = _check_delimiters(delimiter_ids)
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1) so that 1 - eps_low > 0")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_entropy
        mask = batch.completion_mask.astype(bool)
        chex.assert_rank(new_logprobs, 2)
        chex.assert_equal_shape([new_logprobs, batch.old_logprobs, batch.advantages, mask])
        b, t = mask.shape
        seg = segment_ids(batch.completion_tokens, mask, ids)  # [B, T], in [0, T - 1]
        flat = (jnp.arange(b, dtype=jnp.int32)[:, None] * t + seg).reshape(-1)  # [B*T]
        log_ratio = jnp.clip(new_logprobs - batch.old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)

        def seg_sum(x):  # [B, T] -> [B*T]: sum over each segment's valid tokens
            x = jnp.where(mask, x, 0.0).reshape(-1)
            return jax.ops.segment_sum(x, flat, num_segments=b * t, indices_are_sorted=True)

        count = seg_sum(jnp.ones_like(log_ratio))  # [B*T] valid tokens per segment
        nonempty = count > 0
        denom = jnp.maximum(count, 1.0)
        seg_log_ratio = seg_sum(log_ratio) / denom  # 0 (s = 1) for an empty segment
        seg_adv = seg_sum(batch.advantages.astype(log_ratio.dtype)) / denom
        seg_ratio = jnp.exp(seg_log_ratio)
        unclipped = -seg_adv * seg_ratio
        clipped = -seg_adv * jnp.clip(seg_ratio, 1.0 - eps_low, 1.0 + eps_high)
        seg_loss = jnp.maximum(unclipped, clipped)  # [B*T]
        per_token = seg_loss[flat].reshape(b, t)  # each segment's loss on its tokens
        per_token = apply_is_weight(per_token, batch)
        loss = aggregate(per_token, batch.loss_weights, aggregation, max_len)

        n_seg = nonempty.sum().astype(jnp.float32)
        n_seg_safe = jnp.maximum(n_seg, 1.0)
        n_rows = jnp.maximum(mask.any(axis=1).sum(), 1).astype(jnp.float32)

        def seg_mean(x):
            return jnp.where(nonempty, x.astype(jnp.float32), 0.0).sum() / n_seg_safe

        metrics = {
            "segment_po/loss": loss,
            "segment_po/clip_frac": seg_mean(clipped > unclipped),
            "segment_po/segments_per_row": n_seg / n_rows,
            "segment_po/ratio_mean": seg_mean(seg_ratio),
        }
        return loss, metrics

    return objective
