"""IPO (INTELLECT Policy Optimization), prime-rl's default RL loss: a symmetric trust region
on the change of each token's probability, with a squared-log-ratio KL term."""

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import check_aggregation_mode
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import MAX_LOG_RATIO, policy_gradient_objective


def ipo(
    threshold: float = 0.1,
    kl_tau: float = 1e-3,
    adv_tau: float = 1.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """prime-rl's IPO loss (`ipo_loss_fn` in `prime_rl/trainer/rl/loss.py`; its docs' "IPO").

    With r_t = pi(y_t) / mu(y_t) the ratio of the policy being trained to the sampler's
    (`batch.rollout_logprobs`; log-ratio clamped to [-20, 20]) and A_t = `batch.advantages`:
      loss_t = -adv_tau * A_t * r_t * keep_t + kl_tau * (log r_t)^2,
      keep_t = [|pi(y_t) - mu(y_t)| <= threshold]  (stop-gradient).
    The mask is on the absolute change of the token's probability, both ways and whatever the
    advantage's sign, where DPPO's depends on the sign and PPO's clip reads the ratio: a rare
    token may double its probability, a likely one may not move by more than `threshold`. The
    ratio is not clipped (inside the mask it cannot run away). The KL term covers every token,
    masked or not, and pulls the policy back toward the sampler. prime-rl's default threshold is
    0.1 in its config (its IPO docs page ablates 0.3).

    Metrics ("ipo/..."): "loss", "masked_frac" (tokens outside the region), "mismatch_kl"
    (the token mean of r - 1 - log r).

    Args:
      threshold: the largest |pi - mu| kept, >= 0.
      kl_tau: weight of the squared-log-ratio term, >= 0.
      adv_tau: weight of the policy-gradient term, >= 0 (0: only the KL term).
      aggregation: loss aggregation mode (prime-rl sums and divides by the token count:
        "token-mean").
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for a negative threshold or weight, or an invalid aggregation.
    """
    if threshold < 0 or kl_tau < 0 or adv_tau < 0:
        raise ValueError(
            f"threshold={threshold}, kl_tau={kl_tau} and adv_tau={adv_tau} must be >= 0"
        )
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg):
        sampler = pg.batch.rollout_logprobs
        log_ratio = jnp.clip(pg.logprobs - sampler, -MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = jnp.exp(log_ratio)
        moved = jnp.abs(jnp.exp(pg.logprobs) - jnp.exp(sampler))
        keep = jax.lax.stop_gradient(moved <= threshold)
        per_token = -adv_tau * pg.advantages * ratio * keep + kl_tau * jnp.square(log_ratio)
        metrics = {
            "ipo/masked_frac": pg.mean(~keep),
            "ipo/mismatch_kl": pg.mean(jax.lax.stop_gradient(ratio - 1.0 - log_ratio)),
        }
        return per_token, metrics

    return policy_gradient_objective(
        "ipo",
        surrogate,
        aggregation,
        max_len,
        ratio=False,
        ratio_metrics=(),
        reads=(keys.ROLLOUT_LOGPROBS,),
    )
