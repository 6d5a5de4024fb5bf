"""GSPO: clipped surrogate on a length-normalised sequence-level importance ratio."""

import chex
import jax
import jax.numpy as jnp

from rljax.core.aggregation import check_aggregation_mode, masked_row_mean
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import PGInputs, clipped_surrogate, policy_gradient_objective

# |log ratio| is clamped here before exp so padded or stale tokens cannot overflow (as verl does).
_MAX_LOG_RATIO = 20.0


def _check_clip(eps_low: float, eps_high: float) -> None:
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1) so that 1 - eps_low > 0")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")


def sequence_log_ratio(
    new_logprobs: jax.Array, old_logprobs: jax.Array, mask: jax.Array
) -> jax.Array:
    """Length-normalised sequence log importance ratio of GSPO.

    log s_i = (1/|y_i|) sum_{t valid} (log pi_new(y_it) - log pi_old(y_it)), i.e.
    s_i = (pi_new(y_i) / pi_old(y_i))^(1/|y_i|) (Zheng et al. 2025, "Group Sequence
    Policy Optimization", arXiv 2507.18071). Each token's log-ratio is clamped
    to [-20, 20] before the mean. A row with no valid token gets 0 (s = 1).

    Args:
      new_logprobs: [B, T] log-probs under the policy being optimised.
      old_logprobs: [B, T] log-probs under the policy that sampled the batch.
      mask: [B, T] bool, the valid (completion) tokens; |y_i| is its row sum.

    Returns:
      [B] log s_i.
    """
    chex.assert_rank(new_logprobs, 2)
    chex.assert_equal_shape([new_logprobs, old_logprobs, mask])
    log_ratio = jnp.clip(new_logprobs - old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return masked_row_mean(log_ratio, mask)


def _gspo(
    eps_low: float,
    eps_high: float,
    aggregation: str,
    max_len: int | None,
    token_level: bool,
) -> Objective:
    _check_clip(eps_low, eps_high)
    check_aggregation_mode(aggregation, max_len)
    prefix = "gspo_token" if token_level else "gspo"

    def surrogate(pg: PGInputs):
        batch, new_logprobs = pg.batch, pg.logprobs
        mask = batch.completion_mask
        chex.assert_equal_shape([new_logprobs, batch.old_logprobs, mask, batch.advantages])
        seq_log_ratio = sequence_log_ratio(new_logprobs, batch.old_logprobs, mask)  # [B]
        seq_ratio = jnp.exp(seq_log_ratio)
        if token_level:
            # s_it = sg(s_i) * pi(y_t) / sg(pi(y_t)): the value is s_i, the gradient per token.
            log_ratio = (
                jax.lax.stop_gradient(seq_log_ratio)[:, None]
                + new_logprobs
                - jax.lax.stop_gradient(new_logprobs)
            )
            ratio = jnp.exp(log_ratio)  # [B, T]
            adv = batch.advantages  # [B, T]
        else:
            ratio = seq_ratio  # [B]
            adv = masked_row_mean(batch.advantages, mask)  # [B]: the sequence advantage
        loss_terms, is_clipped = clipped_surrogate(ratio, adv, eps_low, eps_high)
        if token_level:
            per_token = loss_terms
        else:
            # The per-sequence loss, repeated on every token of its row.
            per_token = jnp.broadcast_to(loss_terms[:, None], mask.shape)

        has_token = mask.any(axis=1)
        n_seq = jnp.maximum(has_token.sum(), 1).astype(jnp.float32)

        def seq_mean(x):
            return jnp.where(has_token, x.astype(jnp.float32), 0.0).sum() / n_seq

        metrics = {
            f"{prefix}/clip_frac": pg.mean(is_clipped) if token_level else seq_mean(is_clipped),
            f"{prefix}/ratio_mean": seq_mean(seq_ratio),
            f"{prefix}/ratio_max": jnp.where(
                has_token.any(), jnp.where(has_token, seq_ratio, -jnp.inf).max(), 0.0
            ),
            f"{prefix}/ratio_min": jnp.where(
                has_token.any(), jnp.where(has_token, seq_ratio, jnp.inf).min(), 0.0
            ),
        }
        return per_token, metrics

    # The token-level ratio only gives the standard approx_kl; the sequence ratios are above.
    return policy_gradient_objective(
        prefix, surrogate, aggregation, max_len, ratio_metrics=("approx_kl",)
    )


def gspo(
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    aggregation: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> Objective:
    """GSPO's sequence-level clipped surrogate.

    Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071.

    With s_i = `sequence_log_ratio` exponentiated (the length-normalised sequence
    ratio against `batch.old_logprobs`, over `batch.completion_mask` tokens) and A_i
    the sequence advantage, read as the masked mean of `batch.advantages` over row i
    (GRPO-style advantages carry the same value on every token of a row), the
    per-sequence loss is
      l_i = -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i).
    The whole sequence is clipped or not: a clipped sequence gets zero gradient on
    all its tokens. |y_i| and s_i use every `completion_mask` token, also tokens
    whose loss weight a transform set to 0 (the ratio is a property of the
    sequence). The paper's defaults are tiny (3e-4 / 4e-4) because s_i is a
    per-token geometric mean and so stays close to 1.

    Aggregation: l_i is written on every token of row i and passed to `aggregate`
    with `batch.loss_weights`. The default "seq-mean-token-mean" gives the paper's
    (1/G) sum_i l_i, the mean over the sequences with any positive weight (a row
    that a filter zeroed, or an empty row, drops out of the count; the values of
    positive weights inside a row do not matter, since l_i is constant on the row).
    The other modes are allowed and mean: "token-mean" weighs each l_i by its
    weight sum (length-weighted); "seq-mean-token-sum" and
    "seq-mean-token-sum-norm" scale l_i by its weight sum (and divide by B*max_len).

    Metrics ("gspo/..."): "loss"; "clip_frac", the fraction of sequences with a
    valid token whose clipped term is taken; "ratio_mean", "ratio_max", "ratio_min"
    of s_i over those sequences; "approx_kl", token mean of the k3 estimate
    r - 1 - log r of the per-token ratio r.

    Args:
      eps_low: lower clip range, s >= 1 - eps_low; in [0, 1).
      eps_high: upper clip range, s <= 1 + eps_high; >= 0.
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for out-of-range clip parameters or an invalid aggregation.
    """
    return _gspo(eps_low, eps_high, aggregation, max_len, token_level=False)


def gspo_token(
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    aggregation: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> Objective:
    """GSPO-token: per-token advantages with GSPO's sequence-level ratio.

    From Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071.

    Per token, s_it = sg(s_i) * pi(y_it) / sg(pi(y_it)), whose value is s_i (see
    `gspo`) but whose gradient flows through token t only:
      loss_t = -min(s_it * A_it, clip(s_it, 1 - eps_low, 1 + eps_high) * A_it),
    with A_it = `batch.advantages`. Aggregated with `batch.loss_weights`; the
    default "seq-mean-token-mean" is the paper's (1/G) sum_i (1/|y_i|) sum_t.

    When every token of a row carries the same advantage, the value, the clipping
    and the gradient equal `gspo`'s (the paper's remark); with token-varying
    advantages the value still equals `gspo`'s where no token is clipped (the
    row mean of A_it is the sequence advantage), but token t's gradient is
    proportional to its own A_it instead of the row mean.

    Metrics ("gspo_token/..."): as `gspo`, but "clip_frac" is the fraction of valid
    tokens whose clipped term is taken.

    Args:
      eps_low: lower clip range; in [0, 1).
      eps_high: upper clip range; >= 0.
      aggregation: loss aggregation mode.
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for out-of-range clip parameters or an invalid aggregation.
    """
    return _gspo(eps_low, eps_high, aggregation, max_len, token_level=True)
