"""`Algorithm` and the shared pieces of the presets: their typed settings (`Regularizers`,
`PPOSettings`), the regularisers and the PPO-clip preset."""

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

from rljax.core import keys
from rljax.core.aggregation import check_aggregation_mode
from rljax.core.objective import Objective, sum_objectives
from rljax.core.transform import Transform, chain
from rljax.entropy.uec import UECSettings
from rljax.objectives.entropy import entropy_bonus
from rljax.objectives.kl import KL_ESTIMATORS, kl_loss
from rljax.objectives.surrogate import ppo_clip
from rljax.objectives.value import ValueLoss


class Algorithm(NamedTuple):
    """An RL algorithm: `transform` prepares the batch, `objective` is the loss.

    What the steps compute for it follows from the keys its transforms and objective terms
    declare (`rljax.core.keys`): a reference policy when anything reads `ref_logprobs` (or a
    statistic that needs it), the prepare step's per-token statistics that are read, the
    driver's greedy decode when `extras.baseline_reward` is read, its teacher scoring when
    `extras.teacher_logprobs` (or the teacher's top-k tokens) is.

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

    @property
    def needs_teacher(self) -> bool:
        """Whether the driver scores each batch's tokens with a teacher policy and puts the
        log-probs in `batch.extras["teacher_logprobs"]` (on-policy distillation), or the
        teacher's top-k tokens (GKD)."""
        return bool(({keys.TEACHER_LOGPROBS} | keys.TEACHER_TOPK) & self.reads)

    @property
    def needs_reward_components(self) -> bool:
        """Whether it reads the K components of each reward (`extras["reward_components"]`),
        which the driver collects from a task with `reward_components`."""
        return keys.REWARD_COMPONENTS in self.reads

    @property
    def needs_teacher_top_k(self) -> bool:
        """Whether it reads the teacher's top-k tokens and their log-probs (GKD), so the
        driver needs `teacher.top_k` > 0."""
        return bool(keys.TEACHER_TOPK & self.reads)


@dataclasses.dataclass(frozen=True)
class Regularizers:
    """The loss aggregation and the regularisers every policy loss of a preset shares.

    A preset that takes `regularizers: Regularizers` has each field as an `algorithm.*` config
    key (`--config.algorithm.kl_coef=0.01`; `rljax.train.builders.preset_settings`); a field
    the config leaves out keeps the value of the preset's default instance.

    Attributes:
      aggregation: the loss aggregation mode of every loss term, one of
        `rljax.core.aggregation.AGGREGATION_MODES` ("token-mean", "seq-mean-token-sum",
        "seq-mean-token-mean", "seq-mean-token-sum-norm").
      max_len: the constant normaliser of "seq-mean-token-sum-norm" (the generation budget,
        Dr. GRPO); None for every other mode.
      kl_coef: coefficient beta >= 0 of the KL(pi || ref) loss term (`rljax.objectives.kl`);
        0 adds no term (and, unless something else reads it, keeps no reference policy).
      kl_estimator: the per-token KL estimator, one of `rljax.objectives.kl.KL_ESTIMATORS`:
        "k1" (the log-ratio), "k2" (its square / 2), "k3" (Schulman's unbiased, non-negative
        estimator, unclamped, as in the GRPO paper) or "low_var_kl" (k3 clamped to [-10, 10],
        verl's default KL loss; verl's "k3" is this one too, so a ported verl config sets
        "low_var_kl"). The clamp zeroes the gradient of the tokens farthest from the reference.
      entropy_coef: coefficient of the entropy bonus (-coef * aggregated entropy); > 0 raises
        the policy's entropy, 0 adds no term.
    """

    aggregation: str = "token-mean"
    max_len: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0

    def __post_init__(self):
        _check_regularizers(
            self.aggregation, self.max_len, self.kl_coef, self.kl_estimator, self.entropy_coef
        )


@dataclasses.dataclass(frozen=True)
class PPOSettings:
    """The PPO clipped surrogate's settings, with the loss aggregation and the regularisers.

    A preset that takes `ppo: PPOSettings` (GRPO, RLOO, REINFORCE++, ...; `ppo_preset`) has
    each field as an `algorithm.*` config key (`--config.algorithm.clip_eps=0.3`;
    `rljax.train.builders.preset_settings`); a field the config leaves out keeps the value of
    the preset's default instance (UEC-RL's: kl_coef=0.01, kl_estimator="low_var_kl").

    Attributes:
      clip_eps: the lower clip range, ratio r >= 1 - clip_eps, in [0, 1); also the upper one
        when `clip_eps_high` is None.
      clip_eps_high: the upper clip range, r <= 1 + clip_eps_high, >= 0; None means
        `clip_eps`. clip_eps_high > clip_eps is DAPO's clip-higher.
      kl_coef, kl_estimator, entropy_coef, aggregation, max_len: as in `Regularizers`.
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    aggregation: str = "token-mean"
    max_len: int | None = None

    def __post_init__(self):
        if not 0.0 <= self.clip_eps < 1.0:
            raise ValueError(f"clip_eps={self.clip_eps} must be in [0, 1) so that 1 - clip_eps > 0")
        if self.clip_eps_high is not None and self.clip_eps_high < 0.0:
            raise ValueError(f"clip_eps_high={self.clip_eps_high} must be >= 0 (or None: clip_eps)")
        _check_regularizers(
            self.aggregation, self.max_len, self.kl_coef, self.kl_estimator, self.entropy_coef
        )

    @property
    def eps_high(self) -> float:
        """The upper clip range in effect: `clip_eps_high`, or `clip_eps` when that is None."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def regularizers(self) -> Regularizers:
        """The aggregation and regularisers, without the clip ranges."""
        return Regularizers(
            self.aggregation, self.max_len, self.kl_coef, self.kl_estimator, self.entropy_coef
        )


def _check_regularizers(
    aggregation: str, max_len: int | None, kl_coef: float, kl_estimator: str, entropy_coef: float
) -> None:
    """The checks `Regularizers` and `PPOSettings` share; the messages name the field."""
    check_aggregation_mode(aggregation, max_len)
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef={kl_coef} must be >= 0")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={kl_estimator!r} is unknown; use one of {KL_ESTIMATORS}")
    if not abs(entropy_coef) < float("inf"):
        raise ValueError(f"entropy_coef={entropy_coef} must be finite")


def with_regularizers(main: Objective, regularizers: Regularizers) -> Objective:
    """`main` plus the KL(pi || ref) loss and the entropy bonus of `regularizers`, each only
    when its coefficient is non-zero, aggregated as `regularizers` says."""
    r = regularizers
    terms = [main]
    if r.kl_coef:
        terms.append(kl_loss(r.kl_coef, r.kl_estimator, r.aggregation, r.max_len))
    if r.entropy_coef:
        terms.append(entropy_bonus(r.entropy_coef, r.aggregation, r.max_len))
    return sum_objectives(*terms)


def regularized_preset(
    advantages: Transform,
    main: Callable[[str, int | None], Objective],
    regularizers: Regularizers = Regularizers(),
) -> Algorithm:
    """A transform + a main policy loss built for the aggregation, plus the regularisers.

    `main(aggregation, max_len)` builds the policy loss; the KL(pi || ref) loss and the entropy
    bonus are added when their coefficients are non-zero (`with_regularizers`). Presets with
    their own surrogate take `regularizers: Regularizers` and pass it here.
    """
    r = regularizers
    objective = with_regularizers(main(r.aggregation, r.max_len), r)
    return Algorithm(advantages, objective, r.aggregation)


def ppo_preset(advantages: Transform, ppo: PPOSettings = PPOSettings()) -> Algorithm:
    """An advantage transform + the PPO clipped surrogate (+ KL, entropy) as `ppo` says.

    The presets built on it take `ppo: PPOSettings` and pass it here.
    """
    return regularized_preset(
        chain(advantages),
        lambda agg, ml: ppo_clip(ppo.clip_eps, ppo.eps_high, aggregation=agg, max_len=ml),
        ppo.regularizers,
    )
