"""Rollout/trainer mismatch: diagnostics and importance-sampling corrections.

A sampler (vLLM, SGLang, a quantised or differently fused kernel) and the trainer compute
different log-probs for the same tokens, so "on-policy" samples come from the sampler's
policy mu while the gradient is taken for the trainer's policy pi. Per token the correction
ratio is

  rho_t = exp(old_logprobs - rollout_logprobs) = pi_old(a_t | s_t) / mu(a_t | s_t),

the trainer's pre-update probability over the sampler's, with the log clamped to [-20, 20]
before exp (the IS weights are bounded to [e^-20, e^20], as verl's `rollout_corr`). Every
weight here is a constant of the batch (stop-gradient). Invalid (completion_mask False)
tokens get log rho = 0, so garbage log-probs on padding never reach a weight or a metric.

- `mismatch_metrics`: how far apart the two policies are on this batch.
- `truncated_is` (TIS, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training", fengyao.notion.site/off-policy-rl): per-token weight
  min(rho, C) multiplying the PPO-clip term; written to `batch.extras["is_weight"]`, which
  every policy-gradient objective applies (`rljax.objectives.importance.apply_is_weight`).
  The weight is NOT put into `loss_weights`: "token-mean" aggregation divides by the sum of
  the loss weights, which would self-normalise the importance weights.
- `masked_is` (masked IS / rejection sampling, verl docs `algo/rollout_corr.md`): tokens or
  whole sequences whose ratio leaves [low, high] are removed through `loss_weights`
  (removing tokens should renormalise, so here the loss weights are the right place).
- `adaptive_is` (AIS, arXiv 2605.13907): mixes the uncorrected and the TIS weight with a
  per-batch coefficient lambda. Only the paper's abstract was available; the rule below is
  an interpretation (see the function's docstring).
"""

import chex
import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import masked_mean, safe_div
from rljax.core.batch import Batch
from rljax.core.transform import Context, Metrics, Transform, stateless

IS_WEIGHT_KEY = "is_weight"
LEVELS = ("token", "sequence")
SEQUENCE_RATIOS = ("product", "geometric")

# The log of every ratio (token or sequence) is clamped to [-20, 20] before exp.
_MAX_LOG_RATIO = 20.0


# The keys a sampler-vs-trainer ratio is computed from.
_RATIO_READS = frozenset({keys.OLD_LOGPROBS, keys.ROLLOUT_LOGPROBS, keys.COMPLETION_MASK})


def token_log_ratio(batch: Batch) -> jax.Array:
    """log rho_t = old_logprobs - rollout_logprobs, clamped to [-20, 20], 0 on invalid tokens.

    Args:
      batch: a `Batch` with `old_logprobs` (trainer) and `rollout_logprobs` (sampler).

    Returns:
      [B, T] f32, stop-gradient.
    """
    mask = batch.completion_mask
    chex.assert_equal_shape([batch.old_logprobs, batch.rollout_logprobs, mask])
    log_ratio = jnp.clip(
        batch.old_logprobs - batch.rollout_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO
    )
    return jax.lax.stop_gradient(jnp.where(mask, log_ratio, 0.0).astype(jnp.float32))


def sequence_log_ratio(batch: Batch, sequence_ratio: str = "product") -> jax.Array:
    """Log of the sequence ratio: sum_t log rho_t ("product") or its mean ("geometric").

    The sum/mean runs over the row's valid tokens (a row without any has log ratio 0). The
    result is clamped to [-20, 20].

    Args:
      batch: a `Batch`.
      sequence_ratio: "product" (rho_seq = prod_t rho_t) or "geometric"
        (rho_seq = exp(mean_t log rho_t)).

    Returns:
      [B] f32, stop-gradient.

    Raises:
      ValueError: for an unknown `sequence_ratio`.
    """
    _check_choice("sequence_ratio", sequence_ratio, SEQUENCE_RATIOS)
    log_ratio = token_log_ratio(batch)
    total = log_ratio.sum(axis=1)
    if sequence_ratio == "geometric":
        total = safe_div(total, batch.completion_mask.sum(axis=1).astype(jnp.float32))
    return jnp.clip(total, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {list(choices)}")


def _check_cap(cap: float) -> None:
    if not cap > 0.0:
        raise ValueError(f"cap={cap} must be > 0 (the TIS truncation C; 2.0 is the usual value)")


def _level_log_ratio(batch: Batch, level: str, sequence_ratio: str) -> jax.Array:
    """[B, T] log ratio: per token, or the row's sequence log ratio broadcast over the row."""
    if level == "token":
        return token_log_ratio(batch)
    seq = sequence_log_ratio(batch, sequence_ratio)
    return jnp.broadcast_to(seq[:, None], batch.completion_mask.shape)


def _set_is_weight(batch: Batch, weight: jax.Array) -> Batch:
    """Writes `extras["is_weight"]`, multiplying an existing one (corrections compose)."""
    weight = jnp.where(batch.completion_mask, weight, 1.0).astype(jnp.float32)
    previous = batch.extras.get(IS_WEIGHT_KEY)
    if previous is not None:
        chex.assert_equal_shape([previous, weight])
        weight = previous * weight
    return batch.replace(extras={**batch.extras, IS_WEIGHT_KEY: jax.lax.stop_gradient(weight)})


def effective_sample_size(rho: jax.Array, mask: jax.Array) -> jax.Array:
    """ESS/N = (sum rho)^2 / (N sum rho^2) over the True entries of `mask`; 1 if none.

    In (0, 1]; 1 exactly when all valid rho are equal (e.g. no mismatch).
    """
    rho = jnp.where(mask, rho, 0.0)
    n = mask.sum().astype(jnp.float32)
    ess = safe_div(jnp.square(rho.sum()), n * jnp.square(rho).sum())
    return jnp.where(n > 0, ess, 1.0)


def mismatch_metrics(batch: Batch, threshold: float = 0.5, prefix: str = "mismatch") -> Metrics:
    """Diagnostics of the sampler/trainer log-prob mismatch on a batch.

    With g_t = old_logprobs - rollout_logprobs = log rho_t (clamped to [-20, 20]) over valid
    (completion_mask) tokens:
      "{prefix}/abs_gap_mean": mean |g_t|;
      "{prefix}/abs_gap_max": max |g_t| (0 if no token is valid);
      "{prefix}/gap_frac": fraction of valid tokens with |g_t| > threshold;
      "{prefix}/token_kl": mean over tokens of the k3 estimator rho - 1 - log rho;
      "{prefix}/seq_kl": mean over sequences (with a valid token) of sum_t (rho_t - 1 - g_t):
        the k3 estimate of the sequence-level KL(mu || pi_old). The samples come from the
        sampler mu, and E_mu[rho - 1 - log rho] = KL(mu || pi) per token (E_mu[rho] = 1), so
        the per-sequence sum is an unbiased, non-negative estimate of the KL between the two
        policies' sequence distributions (Schulman 2020, "Approximating KL Divergence");
      "{prefix}/ess": ESS/N of rho (`effective_sample_size`).
    All are 0 (ESS/N 1) when the two log-probs agree.

    Args:
      batch: a `Batch`.
      threshold: gap in nats above which a token counts in "gap_frac"; >= 0.
      prefix: metric name prefix.

    Returns:
      A dict of f32 scalars.

    Raises:
      ValueError: if threshold < 0.
    """
    if threshold < 0:
        raise ValueError(f"threshold={threshold} must be >= 0 (a log-prob gap in nats)")
    mask = batch.completion_mask
    log_ratio = token_log_ratio(batch)
    gap = jnp.abs(log_ratio)
    rho = jnp.exp(log_ratio)
    k3 = jnp.where(mask, rho - 1.0 - log_ratio, 0.0)
    has_token = mask.any(axis=1)
    n_seq = has_token.sum().astype(jnp.float32)
    return {
        f"{prefix}/abs_gap_mean": masked_mean(gap, mask),
        f"{prefix}/abs_gap_max": jnp.where(mask, gap, 0.0).max(),
        f"{prefix}/gap_frac": masked_mean(gap > threshold, mask),
        f"{prefix}/token_kl": masked_mean(k3, mask),
        f"{prefix}/seq_kl": safe_div(jnp.where(has_token, k3.sum(axis=1), 0.0).sum(), n_seq),
        f"{prefix}/ess": effective_sample_size(rho, mask),
    }


def truncated_is(
    cap: float = 2.0, level: str = "token", sequence_ratio: str = "product"
) -> Transform:
    """Truncated importance sampling (TIS, Yao et al. 2025, fengyao.notion.site/off-policy-rl).

    Writes `batch.extras["is_weight"]` [B, T] = min(rho, C), stop-gradient, with rho the
    token ratio ("token", the blog's form) or the row's sequence ratio broadcast over the row
    ("sequence"; product or geometric mean, see `sequence_log_ratio`). The policy-gradient
    objectives multiply their per-token loss by it (`ppo_clip`: the clipped term), giving
    E_mu[min(rho, C) * grad(PPO-clip term)]. Invalid tokens get weight 1; an existing
    `is_weight` is multiplied, not replaced.

    Args:
      cap: the truncation C > 0 (2.0 in the blog and in verl).
      level: "token" or "sequence".
      sequence_ratio: "product" or "geometric" (only used with level="sequence").

    Returns:
      A stateless `Transform`. Metrics over valid tokens: "tis/weight_mean" and
      "tis/capped_frac" (fraction with rho > C).

    Raises:
      ValueError: for cap <= 0 or an unknown level / sequence_ratio.
    """
    _check_cap(cap)
    _check_choice("level", level, LEVELS)
    _check_choice("sequence_ratio", sequence_ratio, SEQUENCE_RATIOS)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        rho = jnp.exp(_level_log_ratio(batch, level, sequence_ratio))
        weight = jnp.minimum(rho, cap)
        metrics = {
            "tis/weight_mean": masked_mean(weight, mask),
            "tis/capped_frac": masked_mean(rho > cap, mask),
        }
        return _set_is_weight(batch, weight), metrics

    return stateless(fn, _RATIO_READS, {keys.IS_WEIGHT}, {keys.IS_WEIGHT})


def masked_is(
    low: float = 0.5,
    high: float = 2.0,
    level: str = "token",
    sequence_ratio: str = "product",
) -> Transform:
    """Masked importance sampling / rejection sampling (verl docs `algo/rollout_corr.md`).

    Multiplies `batch.loss_weights` by 0 where the ratio leaves [low, high]: per token
    ("token"), or for whole rows by the sequence ratio ("sequence"; product of the token
    ratios or their geometric mean). Unlike TIS the kept tokens are not reweighted, and the
    aggregation renormalises over what is left (through the loss weights).

    Args:
      low: lower bound of the kept band, >= 0.
      high: upper bound, > low.
      level: "token" or "sequence".
      sequence_ratio: "product" or "geometric" (only used with level="sequence").

    Returns:
      A stateless `Transform`. Metrics: "mis/masked_frac" (fraction of valid tokens masked)
      and "mis/masked_seq_frac" (fraction of sequences with a valid token that lost any).

    Raises:
      ValueError: for low < 0, high <= low, or an unknown level / sequence_ratio.
    """
    if not 0.0 <= low < high:
        raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
    _check_choice("level", level, LEVELS)
    _check_choice("sequence_ratio", sequence_ratio, SEQUENCE_RATIOS)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        rho = jnp.exp(_level_log_ratio(batch, level, sequence_ratio))
        out = mask & ((rho < low) | (rho > high))
        has_token = mask.any(axis=1)
        metrics = {
            "mis/masked_frac": masked_mean(out, mask),
            "mis/masked_seq_frac": masked_mean(out.any(axis=1), has_token),
        }
        loss_weights = jnp.where(out, 0.0, batch.loss_weights).astype(batch.loss_weights.dtype)
        return batch.replace(loss_weights=loss_weights), metrics

    return stateless(fn, _RATIO_READS | {keys.LOSS_WEIGHTS}, {keys.LOSS_WEIGHTS})


def ais_lambda(
    log_ratio: jax.Array, advantages: jax.Array, mask: jax.Array, d0: float
) -> tuple[jax.Array, Metrics]:
    """The AIS mixing coefficient lambda and its three diagnostics (interpretation).

    Over the valid tokens (N of them), with rho = exp(log_ratio) and A the advantages:
      ESS/N = (sum rho)^2 / (N sum rho^2)                (weight reliability);
      D = mean(rho - 1 - log rho),  s_D = 1 - exp(-D/D0) (divergence severity);
      V = Var(rho * A) / Var(A)                          (variance amplification; the
                                                          population variances; V = 0,
                                                          i.e. no penalty, if Var(A) = 0);
      lambda = clip(s_D * ESS/N / max(1, V), 0, 1), stop-gradient.

    Args:
      log_ratio: [B, T] log rho (e.g. `token_log_ratio`).
      advantages: [B, T] advantages.
      mask: [B, T] bool valid tokens.
      d0: D0 > 0, the divergence scale.

    Returns:
      (lambda, metrics) with f32 scalars; metrics "ais/lambda", "ais/ess", "ais/divergence"
      (D), "ais/variance_ratio" (V).
    """
    chex.assert_equal_shape([log_ratio, advantages, mask])
    log_ratio = jax.lax.stop_gradient(jnp.where(mask, log_ratio, 0.0).astype(jnp.float32))
    adv = jax.lax.stop_gradient(jnp.where(mask, advantages, 0.0).astype(jnp.float32))
    rho = jnp.exp(log_ratio)
    ess = effective_sample_size(rho, mask)
    divergence = masked_mean(rho - 1.0 - log_ratio, mask)
    severity = 1.0 - jnp.exp(-divergence / d0)

    def var(x):
        return masked_mean(jnp.square(x - masked_mean(x, mask)), mask)

    variance_ratio = safe_div(var(rho * adv), var(adv))
    lam = jnp.clip(severity * ess / jnp.maximum(1.0, variance_ratio), 0.0, 1.0)
    metrics = {
        "ais/lambda": lam,
        "ais/ess": ess,
        "ais/divergence": divergence,
        "ais/variance_ratio": variance_ratio,
    }
    return lam, metrics


def adaptive_is(cap: float = 2.0, d0: float = 0.01, fixed_lambda: float | None = None) -> Transform:
    """Adaptive importance sampling (AIS, arXiv 2605.13907; interpretation).

    Only the paper's abstract was available (three diagnostics, a mixing coefficient between
    the uncorrected and the truncated-IS gradient, computed per batch); the formulas are the
    interpretation of `ais_lambda`. Per token the weight is

      is_weight = (1 - lambda) + lambda * min(rho_t, C),

    written to `batch.extras["is_weight"]` (multiplying an existing one) for the objectives:
    lambda = 0 is the uncorrected gradient, lambda = 1 is token-level TIS. lambda uses
    `batch.advantages`, so put this transform after the advantage estimator.

    Default D0 = 0.01 nats per token (a judgment call): a BF16 sampler against an FP32/BF16
    trainer typically differs by a per-token KL around 1e-3 (s_D ~ 0.1, little correction),
    while FP8/FP4 rollouts or stale weights reach 1e-2 and more (s_D >= 0.63).

    Args:
      cap: the TIS truncation C > 0.
      d0: D0 > 0, the divergence scale of s_D.
      fixed_lambda: if given, use this lambda in [0, 1] instead of the adaptive one (for
        ablations); the diagnostics are still reported.

    Returns:
      A stateless `Transform`. Metrics: "ais/lambda" (the lambda used), "ais/ess",
      "ais/divergence", "ais/variance_ratio" (see `ais_lambda`).

    Raises:
      ValueError: for cap <= 0, d0 <= 0 or fixed_lambda outside [0, 1].
    """
    _check_cap(cap)
    if not d0 > 0.0:
        raise ValueError(f"d0={d0} must be > 0 (the divergence scale D0, in nats per token)")
    if fixed_lambda is not None and not 0.0 <= fixed_lambda <= 1.0:
        raise ValueError(f"fixed_lambda={fixed_lambda} must be in [0, 1], or None")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        log_ratio = token_log_ratio(batch)
        lam, metrics = ais_lambda(log_ratio, batch.advantages, mask, d0)
        if fixed_lambda is not None:
            lam = jnp.float32(fixed_lambda)
            metrics["ais/lambda"] = lam
        weight = (1.0 - lam) + lam * jnp.minimum(jnp.exp(log_ratio), cap)
        return _set_is_weight(batch, weight), metrics

    return stateless(fn, _RATIO_READS | {keys.ADVANTAGES}, {keys.IS_WEIGHT}, {keys.IS_WEIGHT})


def icepop(low: float = 0.5, high: float = 5.0) -> Transform:
    """IcePop (the Ring-1T report, inclusionAI 2025; verl's `rollout_is_threshold="low_high"`):
    two-sided token masking by the trainer/sampler ratio.

    Writes `batch.extras["is_weight"]` [B, T] = rho_t where low <= rho_t <= high and 0 outside
    (stop-gradient; an existing weight is multiplied). Unlike `masked_is`, the kept tokens are
    reweighted by rho and the masked ones stay in the aggregation's count (the weight, not the
    loss weight, is zeroed), as verl does: a token on which the two engines disagree beyond
    the band contributes nothing, and the others are importance-corrected.

    Args:
      low: lower bound of the kept band, >= 0 (the report's 0.5).
      high: upper bound, > low (the report's 5.0).

    Returns:
      A stateless `Transform`. Metrics over valid tokens: "icepop/masked_frac" and
      "icepop/weight_mean".

    Raises:
      ValueError: unless 0 <= low < high.
    """
    if not 0.0 <= low < high:
        raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        rho = jnp.exp(token_log_ratio(batch))
        kept = (rho >= low) & (rho <= high)
        weight = jnp.where(kept, rho, 0.0)
        metrics = {
            "icepop/masked_frac": masked_mean(~kept, mask),
            "icepop/weight_mean": masked_mean(weight, mask),
        }
        return _set_is_weight(batch, weight), metrics

    return stateless(fn, _RATIO_READS, {keys.IS_WEIGHT}, {keys.IS_WEIGHT})


DIVERGENCE_ESTIMATES = ("k2", "k3")
REJECTION_LEVELS = ("token", "sequence_sum", "sequence_mean", "sequence_max")


def divergence_rejection(
    threshold: float = 0.01, estimator: str = "k3", level: str = "sequence_mean"
) -> Transform:
    """Rejection by an estimated sampler/trainer divergence (verl's `rollout_rs` options
    token_k*, seq_sum_k*, seq_mean_k*, seq_max_k*): a hard trust region between the two
    engines.

    Per token, with l = log rho_t (`token_log_ratio`), the estimate is k2 = l^2 / 2 or
    k3 = rho - 1 - l (non-negative; its mean over the sampler's tokens estimates
    KL(mu || pi_old)). "token" rejects the tokens whose estimate exceeds `threshold`;
    "sequence_sum" / "sequence_mean" / "sequence_max" reject whole rows whose sum / mean /
    largest estimate over valid tokens does. Rejection multiplies `batch.loss_weights` by 0, as
    `masked_is` does. The ratio-band rejections (verl's *_k1) are `masked_is`: verl's
    token_k1 with bounds "a_b" keeps 1/b <= rho <= 1/a (its k1 is -log rho), which is
    `masked_is(low=1/b, high=1/a)`, and seq_mean_k1 is its `level="sequence",
    sequence_ratio="geometric"` form, the geometric-mean ratio of the row.

    Args:
      threshold: the largest estimate kept, > 0.
      estimator: "k2" or "k3".
      level: "token", "sequence_sum", "sequence_mean" or "sequence_max".

    Returns:
      A stateless `Transform`. Metrics: "rejection/masked_frac" (valid tokens rejected),
      "rejection/masked_seq_frac" (rows with a valid token that lost any) and
      "rejection/estimate_mean" (the token estimate's mean over valid tokens).

    Raises:
      ValueError: for a non-positive threshold or an unknown estimator / level.
    """
    if not threshold > 0.0:
        raise ValueError(f"threshold={threshold} must be > 0")
    _check_choice("estimator", estimator, DIVERGENCE_ESTIMATES)
    _check_choice("level", level, REJECTION_LEVELS)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        log_ratio = token_log_ratio(batch)
        if estimator == "k2":
            estimate = 0.5 * jnp.square(log_ratio)
        else:
            estimate = jnp.exp(log_ratio) - 1.0 - log_ratio
        estimate = jnp.where(mask, estimate, 0.0)
        if level == "token":
            out = estimate > threshold
        else:
            if level == "sequence_sum":
                row = estimate.sum(axis=1)
            elif level == "sequence_mean":
                row = safe_div(estimate.sum(axis=1), mask.sum(axis=1).astype(jnp.float32))
            else:
                row = estimate.max(axis=1)  # estimates are >= 0 and padding holds 0
            out = jnp.broadcast_to((row > threshold)[:, None], mask.shape)
        out = out & mask
        metrics = {
            "rejection/masked_frac": masked_mean(out, mask),
            "rejection/masked_seq_frac": masked_mean(out.any(axis=1), mask.any(axis=1)),
            "rejection/estimate_mean": masked_mean(estimate, mask),
        }
        loss_weights = jnp.where(out, 0.0, batch.loss_weights).astype(batch.loss_weights.dtype)
        return batch.replace(loss_weights=loss_weights), metrics

    return stateless(fn, _RATIO_READS | {keys.LOSS_WEIGHTS}, {keys.LOSS_WEIGHTS})
