"""`Algorithm` and the shared pieces of the presets: regularisers and the PPO-clip preset."""

from collections.abc import Callable
from typing import NamedTuple

from rljax.core import keys
from rljax.core.objective import Objective, sum_objectives
from rljax.core.transform import Transform, chain
from rljax.entropy.uec import UECSettings
from rljax.objectives.entropy import entropy_bonus
from rljax.objectives.kl import kl_loss
from rljax.objectives.surrogate import ppo_clip
from rljax.objectives.value import ValueLoss


class Algorithm(NamedTuple):
    """An RL algorithm: `transform` prepares the batch, `objective` is the loss.

    What the steps compute for it follows from the keys its transforms and objective terms
    declare (`rljax.core.keys`): a reference policy when anything reads `ref_logprobs` (or a
    statistic that needs it), the prepare step's per-token statistics that are read, the
    driver's greedy decode when `extras.baseline_reward` is read.

    Attributes:
      transform: the transform chain run once per rollout batch (rewards -> advantages).
      objective: the policy loss.
      aggregation: the loss aggregation mode its terms share; the update step uses it to weigh
        micro-batches so gradient accumulation is exact.
      value_loss: the critic's loss for algorithms with a learned value function (PPO with
        GAE), or None; such an algorithm trains with a critic in the train state.
      collection: how the driver collects batches: None is one rollout per step
        (`rljax.train.collect`); `UECSettings` is UEC-RL's hard-prompt exploration, batch
        buffer and replay (`rljax.train.uec`).
    """

    transform: Transform
    objective: Objective
    aggregation: str = "token-mean"
    value_loss: ValueLoss | None = None
    collection: UECSettings | None = None

    @property
    def reads(self) -> frozenset[str]:
        """The keys it needs from outside its transforms (`rljax.core.keys.algorithm_reads`)."""
        return keys.algorithm_reads(self)

    @property
    def needs_reference(self) -> bool:
        """Whether the train state keeps a frozen reference policy (something reads
        `ref_logprobs` or a statistic computed from the reference)."""
        return keys.needs_reference(self)

    @property
    def batch_stats(self) -> tuple[str, ...]:
        """The per-token statistics of the pre-update policy that the prepare step puts in
        `batch.extras` because something reads them (registered with
        `rljax.train.statistics.register_token_statistic`; "old_entropy" is always there)."""
        reads = self.reads
        return tuple(
            sorted(
                k[len(keys.EXTRAS) :]
                for k in reads
                if k in keys.KEYS
                and keys.KEYS[k].producer == keys.PREPARE
                and k.startswith(keys.EXTRAS)
                and k != keys.OLD_ENTROPY
            )
        )

    @property
    def greedy_baseline(self) -> bool:
        """Whether the driver also decodes each prompt greedily and puts the greedy completion's
        reward in `batch.extras["baseline_reward"]` (ReMax): something reads it."""
        return keys.BASELINE_REWARD in self.reads


def with_regularizers(
    main: Objective,
    aggregation: str,
    max_len: int | None,
    kl_coef: float,
    kl_estimator: str,
    entropy_coef: float,
) -> Objective:
    """`main` plus the KL(pi || ref) loss and entropy bonus when their coefficients are non-zero."""
    terms = [main]
    if kl_coef:
        terms.append(kl_loss(kl_coef, kl_estimator, aggregation, max_len))
    if entropy_coef:
        terms.append(entropy_bonus(entropy_coef, aggregation, max_len))
    return sum_objectives(*terms)


def regularized_preset(
    advantages: Transform,
    main: Callable[[str, int | None], Objective],
    aggregation: str = "token-mean",
    max_len: int | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
) -> Algorithm:
    """A transform + a main policy loss built for the aggregation, plus the regularisers.

    `main(aggregation, max_len)` builds the policy loss; the KL(pi || ref) loss and the entropy
    bonus are added when their coefficients are non-zero (`with_regularizers`). Presets with
    their own surrogate take these keyword arguments as `**regularizers`.
    """
    objective = with_regularizers(
        main(aggregation, max_len), aggregation, max_len, kl_coef, kl_estimator, entropy_coef
    )
    return Algorithm(advantages, objective, aggregation)


def ppo_preset(
    advantages: Transform,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Algorithm:
    """An advantage transform + the PPO clipped surrogate (+ KL, entropy).

    The keyword arguments are the PPO settings that the presets below accept as
    `**ppo_settings`: clip ranges, KL(pi || ref) loss coefficient and estimator, entropy bonus,
    loss aggregation mode and its `max_len`.
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    return regularized_preset(
        chain(advantages),
        lambda agg, ml: ppo_clip(clip_eps, eps_high, aggregation=agg, max_len=ml),
        aggregation,
        max_len,
        kl_coef,
        kl_estimator,
        entropy_coef,
    )
