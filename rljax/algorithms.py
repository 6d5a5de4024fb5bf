"""Named algorithms: a transform chain plus an objective."""

from typing import NamedTuple

from rljax.advantages.group import group_advantages
from rljax.core.objective import Objective, sum_objectives
from rljax.core.transform import Transform, chain
from rljax.objectives.entropy import entropy_bonus
from rljax.objectives.kl import kl_loss
from rljax.objectives.surrogate import ppo_clip


class Algorithm(NamedTuple):
    """An RL algorithm: `transform` prepares the batch, `objective` is the loss.

    `aggregation` is the loss aggregation mode its terms share; the update step uses it to weigh
    micro-batches so gradient accumulation is exact.
    """

    transform: Transform
    objective: Objective
    aggregation: str = "token-mean"


def grpo(
    group_size: int,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
    normalize_std: bool = True,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Algorithm:
    """GRPO (Shao et al. 2024, arXiv 2402.03300): group advantages + PPO clip (+ KL, entropy).

    `normalize_std=False, aggregation="seq-mean-token-sum-norm"` gives Dr. GRPO;
    `clip_eps_high > clip_eps` gives DAPO's clip-higher. The KL and entropy terms
    are added only when their coefficient is non-zero.

    Args:
      group_size: samples per prompt.
      clip_eps: lower (and, by default, upper) clip range.
      clip_eps_high: upper clip range; None means clip_eps.
      kl_coef: coefficient of the KL(pi || ref) loss.
      kl_estimator: KL estimator ("k1", "k2", "k3").
      entropy_coef: entropy bonus coefficient.
      normalize_std: divide group-centred rewards by the group std.
      aggregation: loss aggregation mode, shared by all loss terms.
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Algorithm`.
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    terms = [ppo_clip(clip_eps, eps_high, aggregation=aggregation, max_len=max_len)]
    if kl_coef:
        terms.append(kl_loss(kl_coef, kl_estimator, aggregation, max_len))
    if entropy_coef:
        terms.append(entropy_bonus(entropy_coef, aggregation, max_len))
    transform = chain(group_advantages(group_size, normalize_std=normalize_std))
    return Algorithm(transform, sum_objectives(*terms), aggregation)
