"""PPO clipped surrogate objective, with asymmetric and dual clipping."""

from rljax.core.aggregation import check_aggregation_mode
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import (
    PGInputs,
    clipped_surrogate,
    dual_clip,
    policy_gradient_objective,
)


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

    def surrogate(pg: PGInputs):
        eps = (eps_low * pg.clip_scale, eps_high * pg.clip_scale)
        per_token, is_clipped = clipped_surrogate(pg.ratio, pg.advantages, *eps)
        metrics = {"pg/clip_frac": pg.mean(is_clipped)}
        if dual_clip_c is not None:
            per_token, active = dual_clip(per_token, pg.advantages, dual_clip_c)
            metrics["pg/dual_clip_frac"] = pg.mean(active)
        return per_token, metrics

    return policy_gradient_objective(
        "pg", surrogate, aggregation, max_len, clip_scale=True, name="ppo_clip"
    )
