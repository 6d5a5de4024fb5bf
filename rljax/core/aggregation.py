"""Loss aggregation: the one place that turns a per-token loss into a scalar."""

import chex
import jax
import jax.numpy as jnp

AGGREGATION_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def check_aggregation_mode(mode: str, max_len: int | None = None) -> None:
    """Validates an aggregation mode and its `max_len`, so factories fail early.

    Args:
      mode: one of `AGGREGATION_MODES`.
      max_len: the constant normaliser of "seq-mean-token-sum-norm", or None.

    Raises:
      ValueError: for an unknown mode, a non-positive `max_len`, or a `max_len`
        given to a mode that does not use it.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; valid modes: {list(AGGREGATION_MODES)}"
        )
    if max_len is None:
        return
    if mode != "seq-mean-token-sum-norm":
        raise ValueError(
            f"max_len={max_len} is only used by 'seq-mean-token-sum-norm', not {mode!r}; "
            "pass max_len=None"
        )
    if max_len <= 0:
        raise ValueError(f"max_len={max_len} must be positive (the generation budget)")


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """num / den where den > 0, else 0; gradient-safe (no NaN through the masked branch)."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Scalar mean of `x` over the True entries of `mask` (all axes together); 0 if none.

    For batch-level statistics (entropy, covariances, metrics); loss aggregation over
    weights is `aggregate`. Masked entries never reach the sum, so NaN there is ignored.
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    total = jnp.where(mask, x, 0.0).sum()
    return total / jnp.maximum(jnp.sum(mask), 1).astype(x.dtype)


def masked_row_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """[B, T] -> [B]: the mean of x over the mask's entries in each row; 0 for a row with
    none (a sequence's mean token statistic: GSPO's ratio, GMPO's, a row's advantage)."""
    total = jnp.where(mask, x, 0.0).sum(axis=1)
    return total / jnp.maximum(mask.sum(axis=1), 1).astype(x.dtype)


def aggregate(
    per_token_loss: jax.Array,
    weights: jax.Array,
    mode: str,
    max_len: int | None = None,
) -> jax.Array:
    """Aggregates a per-token loss into a scalar.

    With w the weights (usually the completion mask, maybe importance weights),
    l the loss, B the batch and S the set of sequences with sum_t w > 0:
      "token-mean":              sum_bt l*w / sum_bt w  (DAPO, Yu et al. 2025).
      "seq-mean-token-sum":      (1/|S|) sum_{b in S} sum_t l*w.
      "seq-mean-token-mean":     (1/|S|) sum_{b in S} (sum_t l*w / sum_t w)
                                 (GRPO, Shao et al. 2024).
      "seq-mean-token-sum-norm": sum_bt l*w / (B * max_len), max_len defaulting to
                                 T (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783).
    A sequence with all-zero weights contributes 0 and is left out of the
    seq-mean counts |S|; "seq-mean-token-sum-norm" keeps the constant B * max_len
    (all B sequences count), which is the point of Dr. GRPO. If no weight is
    positive the result is 0, never NaN. Tokens with zero weight are ignored even
    if their loss is inf or NaN.

    Args:
      per_token_loss: [B, T] loss per token.
      weights: [B, T] non-negative token weights.
      mode: one of `AGGREGATION_MODES`.
      max_len: constant normaliser for "seq-mean-token-sum-norm" (default T).

    Returns:
      A scalar loss.

    Raises:
      ValueError: as `check_aggregation_mode`.
    """
    check_aggregation_mode(mode, max_len)
    chex.assert_rank(per_token_loss, 2)
    chex.assert_equal_shape([per_token_loss, weights])
    weights = weights.astype(per_token_loss.dtype)
    weighted = jnp.where(weights != 0, per_token_loss, 0.0) * weights
    if mode == "token-mean":
        return safe_div(weighted.sum(), weights.sum())
    if mode == "seq-mean-token-sum-norm":
        b, t = per_token_loss.shape
        return weighted.sum() / (b * (t if max_len is None else max_len))
    seq_weight = weights.sum(axis=1)
    seq_loss = weighted.sum(axis=1)
    if mode == "seq-mean-token-mean":
        seq_loss = safe_div(seq_loss, seq_weight)
    n_seq = (seq_weight > 0).sum()
    return safe_div(seq_loss.sum(), n_seq.astype(seq_loss.dtype))


def aggregation_denominator(weights: jax.Array, mode: str) -> jax.Array:
    """The count `aggregate` divides by: what a micro-batch weighs in gradient accumulation.

    For a batch split into micro-batches m, sum_m aggregate(l_m, w_m) * d_m / sum_m d_m with
    d_m = aggregation_denominator(w_m) equals aggregate(l, w) on the whole batch (exactly for
    "token-mean", "seq-mean-*" and "seq-mean-token-sum-norm" with a fixed max_len).

    Args:
      weights: [B, T] token weights.
      mode: one of `AGGREGATION_MODES`.

    Returns:
      A float32 scalar: the weight sum ("token-mean"), the number of sequences with any weight
      ("seq-mean-token-sum", "seq-mean-token-mean") or B ("seq-mean-token-sum-norm").
    """
    check_aggregation_mode(mode)
    chex.assert_rank(weights, 2)
    weights = weights.astype(jnp.float32)
    if mode == "token-mean":
        return weights.sum()
    if mode == "seq-mean-token-sum-norm":
        return jnp.asarray(weights.shape[0], jnp.float32)
    return (weights.sum(axis=1) > 0).sum().astype(jnp.float32)
