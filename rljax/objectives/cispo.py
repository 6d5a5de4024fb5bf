"""CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio."""

from rljax.core.aggregation import check_aggregation_mode
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import (
    PGInputs,
    clipped_is_reinforce,
    policy_gradient_objective,
)


def cispo(
    eps_high: float = 0.2,
    eps_low: float | None = None,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio.

    MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", arXiv 2506.13585.

    With r_t = exp(new_logprobs - batch.old_logprobs) (log-ratio clamped to
    [-20, 20]) and A = `batch.advantages`, per token:
      loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi_new(y_t).
    Unlike PPO, clipping bounds the importance weight, never drops a token: every
    token keeps the gradient -clip(r_t) * A_t * grad log pi (times the
    aggregation's normaliser), including the rare low-probability "fork" tokens
    that PPO's clip zeroes after the first off-policy step. The paper puts no
    lower bound on the weight (a large eps_low) and tunes only eps_high:
    `eps_low=None` means no lower bound. Aggregated with `batch.loss_weights`;
    the paper uses the token mean over the batch ("token-mean").

    The reported "cispo/loss" is a surrogate whose gradient is the CISPO gradient;
    its value scales with the log-probs and is not comparable with PPO's loss.

    Metrics ("cispo/...", token means over valid `batch.completion_mask` tokens):
      "loss": the aggregated loss.
      "clip_frac": fraction of tokens whose weight is clipped (r outside the band).
      "weight_mean": of the clipped weight.
      "ratio_mean", "ratio_max": of r.
      "approx_kl": k3 estimate of KL(old || new), mean of r - 1 - log r.

    Args:
      eps_high: upper clip range, weight <= 1 + eps_high; >= 0.
      eps_low: lower clip range, weight >= 1 - eps_low, in [0, 1]; None for no lower
        bound.
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for out-of-range clip parameters or an invalid aggregation.
    """
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    if eps_low is not None and not 0.0 <= eps_low <= 1.0:
        raise ValueError(
            f"eps_low={eps_low} must be in [0, 1] (weight >= 1 - eps_low >= 0), or None for no "
            "lower bound"
        )
    check_aggregation_mode(aggregation, max_len)
    low = None if eps_low is None else 1.0 - eps_low
    high = 1.0 + eps_high

    def surrogate(pg: PGInputs):
        per_token, weight = clipped_is_reinforce(pg.logprobs, pg.ratio, pg.advantages, low, high)
        clipped = pg.ratio > high
        if low is not None:
            clipped = clipped | (pg.ratio < low)
        metrics = {"cispo/clip_frac": pg.mean(clipped), "cispo/weight_mean": pg.mean(weight)}
        return per_token, metrics

    return policy_gradient_objective("cispo", surrogate, aggregation, max_len)
