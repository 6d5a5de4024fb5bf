"""Policy-gradient surrogates as per-token functions of arrays, and the one objective builder.

The surrogates (rlax-style: arrays in, arrays out, shapes checked) hold each paper's maths:
  clipped_surrogate     PPO's -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
  dual_clip             Ye et al.'s bound -c A on the loss of A < 0 tokens
  clipped_is_reinforce  CISPO's -sg(clip(r, low, high)) A log pi
  reinforce             -A log pi (GPG)
`policy_gradient_objective` turns a surrogate into an `Objective` and does the plumbing once:
the clamped log-ratio, GPRL's clip scale (`extras.clip_scale`), the rollout-correction IS
weight (`extras.is_weight`), aggregation with the loss weights, the declared reads and the
standard metrics ("<prefix>/loss", "ratio_mean", "ratio_max", "approx_kl").
"""

from collections.abc import Callable, Iterable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective
from rljax.core.transform import Metrics
from rljax.objectives.importance import apply_is_weight

# |log ratio| is clamped here before exp so padded or stale tokens cannot overflow (as verl does).
MAX_LOG_RATIO = 20.0
# The standard metrics the builder can report, all token means over `completion_mask` but
# "ratio_max" (the largest ratio on a valid token).
RATIO_METRICS = ("ratio_mean", "ratio_max", "approx_kl")


def clipped_surrogate(
    ratio: jax.Array, advantages: jax.Array, eps_low: jax.Array, eps_high: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate loss (Schulman et al. 2017, arXiv 1707.06347), per token.

    loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)).

    Args:
      ratio: [B, T] (or [B]) importance ratios pi_new / pi_old.
      advantages: advantages of the same shape.
      eps_low: lower clip range (a scalar, or broadcastable to `ratio`).
      eps_high: upper clip range (idem).

    Returns:
      (loss, is_clipped): the per-element loss and where the clipped term is the larger.
    """
    chex.assert_equal_shape([ratio, advantages])
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


def dual_clip(loss: jax.Array, advantages: jax.Array, c: float) -> tuple[jax.Array, jax.Array]:
    """Dual clip (Ye et al. 2020, arXiv 1912.09729): the loss of A < 0 tokens is at most -c A.

    Returns:
      (loss, active): the bounded loss and where the bound applies.
    """
    chex.assert_equal_shape([loss, advantages])
    bound = -c * advantages
    active = (advantages < 0) & (loss > bound)
    return jnp.where(active, bound, loss), active


def clipped_is_reinforce(
    logprobs: jax.Array,
    ratio: jax.Array,
    advantages: jax.Array,
    low: float | None,
    high: float,
) -> tuple[jax.Array, jax.Array]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, low, high)) A log pi, per token.

    Returns:
      (loss, weight): the per-token loss and the stop-gradient clipped weight.
    """
    chex.assert_equal_shape([logprobs, ratio, advantages])
    weight = jax.lax.stop_gradient(jnp.clip(ratio, low, high))
    return -weight * advantages * logprobs, weight


def reinforce(logprobs: jax.Array, advantages: jax.Array) -> jax.Array:
    """REINFORCE's surrogate -A log pi per token (no ratio, no clip; GPG)."""
    chex.assert_equal_shape([logprobs, advantages])
    return -advantages * logprobs


class PGInputs(NamedTuple):
    """What a surrogate gets from the builder.

    Attributes:
      logprobs: [B, T] new log-probs (differentiable).
      log_ratio: [B, T] new - old log-probs clamped to +-MAX_LOG_RATIO (None without a ratio).
      ratio: [B, T] exp(log_ratio) (None without a ratio).
      advantages: [B, T] `batch.advantages`.
      clip_scale: [B, 1] `extras.clip_scale`, or 1.0 (only with `clip_scale=True`).
      batch: the batch, for anything else.
      mean: token mean over `completion_mask` of a [B, T] array (bools count as 0/1).
    """

    logprobs: jax.Array
    log_ratio: jax.Array | None
    ratio: jax.Array | None
    advantages: jax.Array
    clip_scale: jax.Array | float
    batch: Batch
    mean: Callable[[jax.Array], jax.Array]


def policy_gradient_objective(
    prefix: str,
    surrogate: Callable[[PGInputs], tuple[jax.Array, Metrics]],
    aggregation: str = "token-mean",
    max_len: int | None = None,
    ratio: bool = True,
    clip_scale: bool = False,
    ratio_metrics: Iterable[str] = RATIO_METRICS,
    reads: Iterable[str] = (),
    name: str | None = None,
) -> Objective:
    """An `Objective` from a per-token surrogate: the plumbing every policy gradient shares.

    Per token, with the surrogate's loss l_t: the loss is
    `aggregate(l_t * sg(extras.is_weight), batch.loss_weights, aggregation, max_len)` (no IS
    weight: 1). Metrics: "<prefix>/loss", the surrogate's, then the `ratio_metrics` asked for
    ("<prefix>/ratio_mean", "<prefix>/ratio_max", "<prefix>/approx_kl" = mean(r - 1 - log r)).

    Args:
      prefix: metric prefix ("pg", "cispo", ...).
      surrogate: `(PGInputs) -> (per_token loss [B, T], metrics)`.
      aggregation: loss aggregation mode (`rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".
      ratio: compute the clamped log-ratio and ratio to old_logprobs (reads old_logprobs).
      clip_scale: pass `extras.clip_scale` ([B], GPRL's drift monitor) to the surrogate as
        [B, 1] (1.0 when absent); the objective then declares it as an optional read.
      ratio_metrics: which of RATIO_METRICS to report (needs `ratio`).
      reads: keys the surrogate reads besides advantages, loss weights, the completion mask
        (and old log-probs with `ratio`).
      name: the objective's name in key-check errors (default: `prefix`).

    Returns:
      An `Objective` declaring its reads (`rljax.core.keys.declare_objective`).

    Raises:
      ValueError: for an invalid aggregation, or ratio metrics without a ratio.
    """
    check_aggregation_mode(aggregation, max_len)
    ratio_metrics = tuple(ratio_metrics)
    unknown = sorted(set(ratio_metrics) - set(RATIO_METRICS))
    if unknown or (ratio_metrics and not ratio):
        raise ValueError(
            f"ratio_metrics={ratio_metrics}: choose from {RATIO_METRICS}, and only with ratio=True"
        )

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_entropy
        chex.assert_rank(new_logprobs, 2)
        chex.assert_equal_shape([new_logprobs, batch.advantages, batch.loss_weights])
        valid = batch.completion_mask.astype(jnp.float32)

        def mean(x):
            return aggregate(x.astype(jnp.float32), valid, "token-mean")

        log_ratio = r = None
        if ratio:
            log_ratio = jnp.clip(new_logprobs - batch.old_logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)
            r = jnp.exp(log_ratio)
        scale = 1.0
        if clip_scale and batch.extras.get("clip_scale") is not None:
            scale = batch.extras["clip_scale"][:, None]
        inputs = PGInputs(new_logprobs, log_ratio, r, batch.advantages, scale, batch, mean)
        per_token, surrogate_metrics = surrogate(inputs)
        per_token = apply_is_weight(per_token, batch)
        loss = aggregate(per_token, batch.loss_weights, aggregation, max_len)
        metrics = {f"{prefix}/loss": loss, **surrogate_metrics}
        if "ratio_mean" in ratio_metrics:
            metrics[f"{prefix}/ratio_mean"] = mean(r)
        if "ratio_max" in ratio_metrics:
            mask = batch.completion_mask
            metrics[f"{prefix}/ratio_max"] = jnp.where(
                mask.any(), jnp.where(mask, r, -jnp.inf).max(), 0.0
            )
        if "approx_kl" in ratio_metrics:
            metrics[f"{prefix}/approx_kl"] = mean(r - 1.0 - log_ratio)
        return loss, metrics

    needed = {keys.ADVANTAGES, keys.LOSS_WEIGHTS, keys.COMPLETION_MASK, *reads}
    if ratio:
        needed.add(keys.OLD_LOGPROBS)
    optional = keys.PG_OPTIONAL | ({keys.CLIP_SCALE} if clip_scale else set())
    return declare_objective(objective, needed, optional, name or prefix)
