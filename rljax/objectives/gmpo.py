"""GMPO: the geometric mean of token ratios (clipped token by token) as a sequence's ratio."""

import jax.numpy as jnp

from rljax.core.aggregation import check_aggregation_mode, masked_row_mean
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import policy_gradient_objective


def gmpo(
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    aggregation: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> Objective:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673).

    GRPO maximises the arithmetic mean of a sequence's token terms r_t A, which one outlier
    ratio can dominate; GMPO maximises their geometric mean. With log r_t = new_logprobs -
    batch.old_logprobs (clamped to [-20, 20]), the sequence advantage A_i (the masked mean of
    `batch.advantages` over row i) and s = sign(A_i), each token's log-ratio is clipped in log
    space, on the side the advantage pushes it, and the sequence's loss is
      c_t = s * min(s log r_t, s clip(log r_t, -eps_low, eps_high)),
      l_i = -A_i * exp(mean_t c_t)   (the mean over the row's `completion_mask` tokens).
    A clipped token has no gradient; the others get -A_i exp(mean c) / |y_i| each. The paper's
    range is (e^-0.4, e^0.4), wider than PPO's because the geometric mean is steadier.

    Aggregation: l_i is written on every token of row i and aggregated with
    `batch.loss_weights`; the default "seq-mean-token-mean" is the mean over the sequences
    with any weight. verl's `geo_mean` loss takes the mean over all rows, empty ones
    included (0 each): the same on a batch without empty rows.

    Metrics ("gmpo/..."): "loss", "clip_frac" (tokens whose log-ratio was clipped),
    "seq_ratio_mean" (of exp(mean c) over sequences with tokens), "ratio_mean", "ratio_max",
    "approx_kl" (token level).

    Args:
      eps_low: the lower clip of log r (log r >= -eps_low where A < 0); >= 0.
      eps_high: the upper clip of log r (log r <= eps_high where A > 0); >= 0.
      aggregation: loss aggregation mode (`rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for a negative clip range or an invalid aggregation.
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low={eps_low} and eps_high={eps_high} must be >= 0")
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg):
        mask = pg.batch.completion_mask
        seq_adv = masked_row_mean(pg.advantages, mask)  # [B]
        sign = jnp.sign(seq_adv)[:, None]
        log_ratio = pg.log_ratio
        clipped = jnp.clip(log_ratio, -eps_low, eps_high)
        kept = sign * jnp.minimum(sign * log_ratio, sign * clipped)
        seq_ratio = jnp.exp(masked_row_mean(kept, mask))  # [B]
        loss = -seq_adv * seq_ratio
        has_token = mask.any(axis=1)
        n_seq = jnp.maximum(has_token.sum(), 1).astype(jnp.float32)
        metrics = {
            "gmpo/clip_frac": pg.mean((kept != log_ratio) & (sign != 0)),
            "gmpo/seq_ratio_mean": jnp.where(has_token, seq_ratio, 0.0).sum() / n_seq,
        }
        return jnp.broadcast_to(loss[:, None], mask.shape), metrics

    return policy_gradient_objective("gmpo", surrogate, aggregation, max_len)
