"""SAPO: a smooth, temperature-controlled gate on the importance ratio instead of a hard clip."""

import jax
import jax.numpy as jnp

from rljax.core.aggregation import check_aggregation_mode
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import policy_gradient_objective


def sapo_gate(ratio: jax.Array, tau: jax.Array) -> jax.Array:
    """SAPO's gate f(r) = sigmoid(tau (r - 1)) * 4 / tau.

    With s = sigmoid(tau (r - 1)), its slope in r is 4 s (1 - s): 1 at r = 1, falling smoothly
    to 0 as r leaves 1, faster for a larger tau. Its slope in log r, what a token's gradient
    is scaled by, is 4 s (1 - s) r: exactly 1 at r = 1 (REINFORCE on-policy).
    """
    return jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def sapo(
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    aggregation: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> Objective:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347).

    With r_t = exp(new_logprobs - batch.old_logprobs) (log-ratio clamped to [-20, 20]) and
    A_t = `batch.advantages`, per token:
      loss_t = -sapo_gate(r_t, tau_t) * A_t,  tau_t = tau_pos if A_t > 0 else tau_neg.
    Where PPO's clip cuts a token's gradient to zero at the clip boundary, the gate fades it
    with the distance of r from 1, so off-policy tokens keep a shrinking signal; a larger
    tau_neg damps the negative updates, which spread probability over the whole vocabulary,
    faster than the positive ones (the paper's and verl's defaults: 1.0 and 1.05).

    Aggregated with `batch.loss_weights`; the default "seq-mean-token-mean" is the paper's (and
    the only mode verl's `sapo` loss uses). Metrics ("sapo/..."): "loss", "gate_mean" (the
    token mean of f(r)), "ratio_mean", "ratio_max", "approx_kl".

    Args:
      tau_pos: gate temperature of tokens with a positive advantage; > 0.
      tau_neg: gate temperature of the others; > 0.
      aggregation: loss aggregation mode (`rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for a non-positive temperature or an invalid aggregation.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos={tau_pos} and tau_neg={tau_neg} must both be > 0")
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg):
        tau = jnp.where(pg.advantages > 0, tau_pos, tau_neg)
        gate = sapo_gate(pg.ratio, tau)
        return -gate * pg.advantages, {"sapo/gate_mean": pg.mean(gate)}

    return policy_gradient_objective("sapo", surrogate, aggregation, max_len)
