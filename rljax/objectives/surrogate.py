"""PPO clipped surrogate objective, with asymmetric and dual clipping."""

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective
from rljax.objectives.importance import apply_is_weight

# |log ratio| is clamped here before exp so padded or stale tokens cannot overflow (as verl does).
_MAX_LOG_RATIO = 20.0


def ppo_clip(
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347).

    With r = exp(new_logprobs - batch.old_logprobs) and A = batch.advantages,
    per token:
      loss = -min(r*A, clip(r, 1 - eps_low, 1 + eps_high)*A).
    `eps_high > eps_low` is DAPO's clip-higher (Yu et al. 2025, arXiv 2503.14476).
    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with
    Deep Reinforcement Learning", arXiv 1912.09729) also bounds the loss of
    A < 0 tokens: loss = min(loss, -c*A). The log-ratio is clamped to
    [-20, 20] before exp. The loss is aggregated with `batch.loss_weights`.
    A transform may tighten the trust region per row by writing
    `batch.extras["clip_scale"]` ([B], e.g. GPRL's drift monitor): both clip
    ranges are multiplied by it. A mismatch correction (`rljax.quant.mismatch.truncated_is`,
    `adaptive_is`) may write `batch.extras["is_weight"]` ([B, T]): the per-token loss is then
    multiplied by stop_gradient(is_weight) before aggregation (truncated IS, Yao et al. 2025:
    the weight multiplies the PPO-clip term, not the aggregation's normaliser).

    Metrics, token means over valid (`batch.completion_mask`) tokens:
      "pg/loss": the aggregated loss.
      "pg/clip_frac": fraction of tokens where the clipped term is taken (zero gradient).
      "pg/dual_clip_frac": fraction where the dual bound is taken (only with dual clip).
      "pg/ratio_mean", "pg/ratio_max": of r.
      "pg/approx_kl": k3 estimate of KL(old || new), mean of r - 1 - log r.

    Args:
      eps_low: lower clip range, r >= 1 - eps_low; in [0, 1).
      eps_high: upper clip range, r <= 1 + eps_high; >= 0.
      dual_clip_c: dual-clip constant c > 1, or None for no dual clip.
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for out-of-range clip parameters or an invalid aggregation.
    """
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1) so that 1 - eps_low > 0")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c={dual_clip_c} must be > 1 (Ye et al. 2020), or None")
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_entropy
        adv = batch.advantages
        log_ratio = jnp.clip(new_logprobs - batch.old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        ratio = jnp.exp(log_ratio)
        scale = batch.extras.get("clip_scale")
        scale = 1.0 if scale is None else scale[:, None]
        unclipped = -adv * ratio
        clipped = -adv * jnp.clip(ratio, 1.0 - eps_low * scale, 1.0 + eps_high * scale)
        per_token = jnp.maximum(unclipped, clipped)
        valid = batch.completion_mask.astype(jnp.float32)

        def mean(x):
            return aggregate(x.astype(jnp.float32), valid, "token-mean")

        metrics = {"pg/clip_frac": mean(clipped > unclipped)}
        if dual_clip_c is not None:
            bound = -dual_clip_c * adv
            dual_active = (adv < 0) & (per_token > bound)
            per_token = jnp.where(dual_active, bound, per_token)
            metrics["pg/dual_clip_frac"] = mean(dual_active)
        per_token = apply_is_weight(per_token, batch)
        loss = aggregate(per_token, batch.loss_weights, aggregation, max_len)
        metrics["pg/loss"] = loss
        metrics["pg/ratio_mean"] = mean(ratio)
        metrics["pg/ratio_max"] = jnp.where(
            batch.completion_mask.any(),
            jnp.where(batch.completion_mask, ratio, -jnp.inf).max(),
            0.0,
        )
        metrics["pg/approx_kl"] = mean(ratio - 1.0 - log_ratio)
        return loss, metrics

    return declare_objective(objective, keys.PG_READS, keys.PG_OPTIONAL | {keys.CLIP_SCALE})
