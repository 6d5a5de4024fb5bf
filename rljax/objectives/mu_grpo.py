"""Mu-GRPO: PPO clip with a relaxed range and a veto of drifted tokens in negative responses."""

import math

import chex
import jax
import jax.numpy as jnp

from rljax.core.aggregation import check_aggregation_mode, masked_row_mean
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import (
    PGInputs,
    clipped_surrogate,
    policy_gradient_objective,
)


def negative_advantage_veto(
    log_ratio: jax.Array, advantages: jax.Array, mask: jax.Array, delta: float
) -> jax.Array:
    """Keep-mask of Mu-GRPO's veto: cut negative responses at their first drifted token.

    From "Mu-GRPO" (arXiv 2605.17570); the paper's rule is not published in detail, so this is
    an interpretation of its veto. A row is negative when its sequence advantage, the mean of
    `advantages` over the row's `mask` tokens, is < 0. In a negative row let t* be the first
    `mask` token with |log_ratio| > delta (the current policy has drifted from the frozen stage
    policy mu there); every position t >= t* is vetoed. Pushing down the probability of a bad
    response after the policy has already moved away from it compounds the drift; positive
    responses (A >= 0) and rows with no trigger are never touched. The kept set of each row is
    a prefix (the vetoed set a suffix). Positions outside `mask` never trigger, but those after
    t* are vetoed too, so the mask is exactly prefix-closed; combine with `mask` for validity.

    Args:
      log_ratio: [B, T] log(pi_theta / mu) per token; pass it stop-gradient (it only selects).
      advantages: [B, T] token advantages; their masked row mean is the sequence advantage.
      mask: [B, T] bool, the valid (completion) tokens.
      delta: trigger threshold on |log_ratio|, >= 0 (Mu-GRPO: log(1 + eps_high)).

    Returns:
      [B, T] bool, True where the token is kept.

    Raises:
      ValueError: if delta < 0.
    """
    chex.assert_rank(log_ratio, 2)
    chex.assert_equal_shape([log_ratio, advantages, mask])
    if delta < 0:
        raise ValueError(f"delta={delta} must be >= 0 (a threshold on |log ratio|)")
    mask = mask.astype(bool)
    negative = masked_row_mean(advantages, mask) < 0  # [B]
    trigger = mask & (jnp.abs(log_ratio) > delta)  # [B, T]
    after_trigger = jnp.cumsum(trigger.astype(jnp.int32), axis=1) > 0  # t >= t*, per row
    return ~(negative[:, None] & after_trigger)


def mu_grpo(
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    veto_delta: float | None = None,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """Mu-GRPO's surrogate: relaxed asymmetric PPO clip plus a negative-advantage veto.

    From "Mu-GRPO" (arXiv 2605.17570). Facts from the paper: training runs in a few sequential
    stages; in each, the policy mu = pi_theta_k is frozen, the stage's prompts are rolled out
    once and many minibatch updates follow, so the ratio to mu drifts far more than in on-policy
    GRPO. The per-token rule below is an interpretation (no code is published): with
    r = exp(new_logprobs - batch.old_logprobs), batch.old_logprobs being log mu (log-ratio
    clamped to [-20, 20] before exp) and A = `batch.advantages`,
      loss_t = -min(r*A, clip(r, 1 - eps_low, 1 + eps_high)*A) * keep_t,
    keep = `negative_advantage_veto(sg(log r), A, completion_mask, veto_delta)`: in a response
    with A < 0, the tokens from the first one with |log r| > veto_delta on contribute 0 loss and
    0 gradient. The veto changes only the per-token loss, never the aggregation weights: the
    loss is `aggregate(loss_t, batch.loss_weights, aggregation, max_len)`, so the denominator
    is the same as without the veto, and micro-batch accumulation with
    `aggregation_denominator(batch.loss_weights)` stays exact. With veto_delta at its default
    log(1 + eps_high) and (1 + eps_high)(1 - eps_low) >= 1, a batch whose ratios all lie in the
    clip band is never vetoed (then this is `ppo_clip(eps_low, eps_high)`). Counting stage
    staleness (updates since mu was frozen) is the training loop's job.

    Metrics ("mu_grpo/...", token means over valid `batch.completion_mask` tokens):
      "loss": the aggregated loss.
      "clip_frac": fraction of valid tokens that are kept and whose clipped term is taken
        (with "veto_frac", the tokens the surrogate gives no gradient).
      "veto_frac": fraction of valid tokens vetoed.
      "veto_row_frac": fraction of rows with a valid token that have a vetoed valid token.
      "ratio_mean": of r.
      "approx_kl": k3 estimate of KL(mu || pi_theta), mean of r - 1 - log r.

    Args:
      eps_low: lower clip range, r >= 1 - eps_low; in [0, 1).
      eps_high: upper clip range, r <= 1 + eps_high; >= 0 (relaxed: 0.28-0.4).
      veto_delta: veto threshold on |log r|, >= 0; None means log(1 + eps_high).
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for out-of-range clip or veto parameters or an invalid aggregation.
    """
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1) so that 1 - eps_low > 0")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    delta = math.log1p(eps_high) if veto_delta is None else float(veto_delta)
    if delta < 0.0:
        raise ValueError(f"veto_delta={veto_delta} must be >= 0 (a threshold on |log ratio|)")
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg: PGInputs):
        mask = pg.batch.completion_mask
        chex.assert_equal_shape([pg.logprobs, pg.batch.old_logprobs, pg.advantages, mask])
        keep = negative_advantage_veto(
            jax.lax.stop_gradient(pg.log_ratio), pg.advantages, mask, delta
        )
        loss, is_clipped = clipped_surrogate(pg.ratio, pg.advantages, eps_low, eps_high)
        vetoed = mask & ~keep  # [B, T]
        has_token = mask.any(axis=1)  # [B]
        n_rows = jnp.maximum(has_token.sum(), 1).astype(jnp.float32)
        metrics = {
            "mu_grpo/clip_frac": pg.mean(keep & is_clipped),
            "mu_grpo/veto_frac": pg.mean(vetoed),
            "mu_grpo/veto_row_frac": vetoed.any(axis=1).sum().astype(jnp.float32) / n_rows,
        }
        return jnp.where(keep, loss, 0.0), metrics

    return policy_gradient_objective(
        "mu_grpo", surrogate, aggregation, max_len, ratio_metrics=("ratio_mean", "approx_kl")
    )
