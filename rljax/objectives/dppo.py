"""DPPO: a trust region on the sampled token's probability change (TV) or its binary KL,
instead of PPO's ratio clip."""

import jax
import jax.numpy as jnp

from rljax.core.aggregation import check_aggregation_mode
from rljax.core.objective import Objective
from rljax.objectives.policy_gradient import policy_gradient_objective

DIVERGENCES = ("tv", "kl")
# Keeps log(1 - p) finite at p = 1 in the binary KL (the value verl uses).
_EPS = 1e-8


def binary_kl(old_logprobs: jax.Array, new_logprobs: jax.Array) -> jax.Array:
    """KL(Bernoulli(p_old) || Bernoulli(p_new)) of the sampled token against the rest:
    p_old log(p_old / p_new) + (1 - p_old) log((1 - p_old) / (1 - p_new)), per token."""
    p_old, p_new = jnp.exp(old_logprobs), jnp.exp(new_logprobs)
    rest = jnp.log((1.0 - p_old + _EPS) / (1.0 - p_new + _EPS))
    return p_old * (old_logprobs - new_logprobs) + (1.0 - p_old) * rest


def dppo_trust_mask(
    old_logprobs: jax.Array,
    new_logprobs: jax.Array,
    advantages: jax.Array,
    divergence: str,
    delta_low: float,
    delta_high: float,
) -> jax.Array:
    """[B, T] bool: the tokens DPPO keeps (the "Binary" approximation of the divergence).

    "tv": a token with A > 0 is kept while p_new - p_old <= delta_high, one with A <= 0 while
    p_new - p_old >= -delta_low. "kl": a token is kept while its `binary_kl` is within the
    bound (delta_high for A > 0, delta_low otherwise), or while the update moves it back
    (p_new <= p_old for A > 0, p_new >= p_old otherwise).
    """
    p_old, p_new = jnp.exp(old_logprobs), jnp.exp(new_logprobs)
    if divergence == "tv":
        return jnp.where(advantages > 0, p_new - p_old <= delta_high, p_new - p_old >= -delta_low)
    kl = binary_kl(old_logprobs, new_logprobs)
    keep_pos = (kl <= delta_high) | (p_new <= p_old)
    keep_neg = (kl <= delta_low) | (p_new >= p_old)
    return jnp.where(advantages > 0, keep_pos, keep_neg)


def dppo(
    divergence: str = "tv",
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    ratio_cap: float = 20.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """DPPO, Divergence Proximal Policy Optimization (Qi et al. 2026, "Rethinking the Trust
    Region in LLM Reinforcement Learning", arXiv 2602.04879), Binary-TV and Binary-KL.

    PPO's clip reads the trust region off the sampled token's ratio, which over-constrains
    rare tokens (a tiny probability doubles easily) and under-constrains likely ones. DPPO
    bounds a divergence between the old and new distributions instead, approximated from the
    sampled token alone by collapsing the vocabulary into {that token, the rest}
    (`dppo_trust_mask`). A token outside the region that the update pushes further out gets
    no gradient; the others get the truncated-IS REINFORCE gradient. Per token:
      loss_t = -A_t * sg(min(r_t, ratio_cap)) * log pi_new(y_t) * sg(mask_t),
    with r_t = exp(new_logprobs - batch.old_logprobs) (log-ratio clamped to [-20, 20]). The
    paper recommends a large cap (its section 5.4): the truncation biases the gradient.

    The defaults (0.2 both ways, cap 20) are verl's `clip_ratio` and fallback `clip_ratio_c`;
    the paper tunes the bounds per divergence (TV bounds a probability difference, KL a
    divergence in nats), so set them for the run.

    Metrics ("dppo/..."): "loss", "masked_frac" (tokens outside the region), "capped_frac"
    (kept tokens whose ratio exceeds the cap), "ratio_mean", "ratio_max", "approx_kl".

    Args:
      divergence: "tv" or "kl".
      delta_low: the bound for tokens with A <= 0; >= 0.
      delta_high: the bound for tokens with A > 0; >= 0.
      ratio_cap: the truncation of the IS weight; > 0.
      aggregation: loss aggregation mode (`rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`.

    Raises:
      ValueError: for an unknown divergence, a negative bound, a non-positive cap or an
        invalid aggregation.
    """
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence={divergence!r} is not one of {DIVERGENCES}")
    if delta_low < 0 or delta_high < 0 or not ratio_cap > 0:
        raise ValueError(
            f"delta_low={delta_low}, delta_high={delta_high} must be >= 0 and "
            f"ratio_cap={ratio_cap} > 0"
        )
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg):
        old = pg.batch.old_logprobs
        keep = dppo_trust_mask(old, pg.logprobs, pg.advantages, divergence, delta_low, delta_high)
        # The mask is folded into the stop-gradient weight, so a masked token's gradient is
        # 0 * A, never 0 * a non-finite ratio.
        weight = jax.lax.stop_gradient(jnp.where(keep, jnp.minimum(pg.ratio, ratio_cap), 0.0))
        per_token = -pg.advantages * weight * pg.logprobs
        metrics = {
            "dppo/masked_frac": pg.mean(~keep),
            "dppo/capped_frac": pg.mean(keep & (pg.ratio > ratio_cap)),
        }
        return per_token, metrics

    return policy_gradient_objective("dppo", surrogate, aggregation, max_len)
