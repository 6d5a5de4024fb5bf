"""Presets whose policy loss keeps the update near the sampling policy by other means than
PPO's ratio clip, as the peers adopted them in 2026: SAPO's smooth gate, GMPO's geometric
mean, DPPO's divergence mask, prime-rl's IPO mask. Each takes GRPO's group advantages and
`Regularizers`."""

from rljax.advantages.group import group_advantages
from rljax.algorithms.base import Algorithm, Regularizers, regularized_preset
from rljax.core.transform import chain
from rljax.objectives.dppo import dppo as dppo_objective
from rljax.objectives.gmpo import gmpo as gmpo_objective
from rljax.objectives.ipo import ipo as ipo_objective
from rljax.objectives.sapo import sapo as sapo_objective

SEQ_MEAN = Regularizers(aggregation="seq-mean-token-mean")


def sapo(
    group_size: int,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    regularizers: Regularizers = SEQ_MEAN,
) -> Algorithm:
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347; verl's and TRL's "sapo", not
    `segment_po`): group advantages + a sigmoid gate on the ratio instead of a clip, with
    temperatures `tau_pos` / `tau_neg` for positive / other advantages
    (`rljax.objectives.sapo`). Aggregated per sequence by default, as the paper does."""
    return regularized_preset(
        chain(group_advantages(group_size)),
        lambda agg, ml: sapo_objective(tau_pos, tau_neg, agg, ml),
        regularizers,
    )


def gmpo(
    group_size: int,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    regularizers: Regularizers = SEQ_MEAN,
) -> Algorithm:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673; verl's "geo_mean"): group
    advantages + the geometric mean of token ratios clipped in log space to
    [-eps_low, eps_high] (`rljax.objectives.gmpo`); the paper's range is 0.4 both ways."""
    return regularized_preset(
        chain(group_advantages(group_size)),
        lambda agg, ml: gmpo_objective(eps_low, eps_high, agg, ml),
        regularizers,
    )


def dppo(
    group_size: int,
    divergence: str = "tv",
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    ratio_cap: float = 20.0,
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """DPPO (Divergence Proximal Policy Optimization, arXiv 2602.04879; verl's "dppo_tv" and
    "dppo_kl"): group advantages + truncated-IS REINFORCE on the tokens inside a Binary-TV or
    Binary-KL trust region (`rljax.objectives.dppo`)."""
    return regularized_preset(
        chain(group_advantages(group_size)),
        lambda agg, ml: dppo_objective(divergence, delta_low, delta_high, ratio_cap, agg, ml),
        regularizers,
    )


def ipo(
    group_size: int,
    threshold: float = 0.1,
    kl_tau: float = 1e-3,
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """IPO (prime-rl's default RL loss): group advantages + the policy gradient through the
    ratio to the sampler, masked where a token's probability moved by more than `threshold`,
    + `kl_tau` x the squared log-ratio (`rljax.objectives.ipo`)."""
    return regularized_preset(
        chain(group_advantages(group_size)),
        lambda agg, ml: ipo_objective(threshold, kl_tau, 1.0, agg, ml),
        regularizers,
    )
