"""KL(pi || ref) estimators, as a loss term and as a reward penalty."""

import jax
import jax.numpy as jnp

from rljax.core.aggregation import aggregate, check_aggregation_mode
from rljax.core.batch import Batch, check_sequence_rewards
from rljax.core.objective import Objective
from rljax.core.transform import Context, Metrics, Transform, stateless

KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")

# |log ratio| is clamped here before exp so padded or stale tokens cannot overflow (as verl does).
_MAX_LOG_RATIO = 20.0
# "low_var_kl" clamps its k3 value to [-_MAX_LOW_VAR_KL, _MAX_LOW_VAR_KL] (verl's kl_penalty).
_MAX_LOW_VAR_KL = 10.0


def _check_estimator(estimator: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown KL estimator {estimator!r}; valid estimators: {list(KL_ESTIMATORS)}"
        )


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: str) -> jax.Array:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi.

    With x = log pi(a) - log ref(a) (Schulman 2020, "Approximating KL
    Divergence", joschu.net/blog/kl-approx.html):
      "k1": x                          unbiased, can be negative.
      "k2": x**2 / 2                   biased, >= 0, low variance.
      "k3": exp(-x) - 1 + x            i.e. ref/pi - 1 - log(ref/pi); unbiased, >= 0.
      "low_var_kl": clip(k3, -10, 10)  verl's "low_var_kl": k3 with its value clamped, so
                                       one token far off the reference (x < about -2.5 or
                                       x > 11) cannot dominate the loss; the clamped
                                       tokens get zero gradient. k3 >= 0, so only the
                                       upper bound is ever active.
    For k3 and low_var_kl, x is clamped to [-20, 20] before exp.

    Porting a verl config: verl's `kl_loss_type="low_var_kl"` (its default) and its alias
    "k3" are both "low_var_kl" here, not "k3": rljax's "k3" is Schulman's unclamped
    estimator, verl's clamps it to [-10, 10]. verl's "kl"/"k1" and "mse"/"k2" are "k1", "k2".

    Args:
      logprobs: [B, T] log-probs of the sampled tokens under pi.
      ref_logprobs: [B, T] log-probs of the same tokens under ref.
      estimator: one of `KL_ESTIMATORS`.

    Returns:
      [B, T] per-token KL estimates (unmasked).

    Raises:
      ValueError: for an unknown estimator or mismatched shapes.
    """
    _check_estimator(estimator)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {logprobs.shape} and ref_logprobs {ref_logprobs.shape} differ in shape"
        )
    x = logprobs - ref_logprobs
    if estimator == "k1":
        return x
    if estimator == "k2":
        return 0.5 * x**2
    x = jnp.clip(x, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    k3 = jnp.exp(-x) - 1.0 + x
    if estimator == "low_var_kl":
        return jnp.clip(k3, -_MAX_LOW_VAR_KL, _MAX_LOW_VAR_KL)
    return k3


def kl_loss(
    coef: float,
    estimator: str = "k3",
    aggregation: str = "token-mean",
    max_len: int | None = None,
) -> Objective:
    """KL(pi_new || ref) as a loss term: coef * aggregate(kl_penalty(new, ref)).

    As in GRPO (Shao et al. 2024, arXiv 2402.03300), which uses k3 (unclamped; the default
    here). verl's default KL loss, `kl_loss_type="low_var_kl"` (alias "k3" in verl), is k3
    clamped to [-10, 10]: a verl config ports as `estimator="low_var_kl"`, not "k3" (see
    `kl_penalty`). The tokens
    are sampled from the rollout policy, not pi_new, so the estimate is exact
    only on-policy. Aggregated with `batch.loss_weights`.

    Args:
      coef: KL coefficient beta (>= 0).
      estimator: one of `KL_ESTIMATORS` ("low_var_kl" is verl's default for the KL loss;
        "k3" is the unclamped estimator of the GRPO paper).
      aggregation: loss aggregation mode.
      max_len: normaliser for "seq-mean-token-sum-norm".

    Returns:
      An `Objective`. Metrics: "kl/loss" (coef times the aggregated KL) and
      "kl/mean" (token mean of the estimate over valid tokens).
    """
    if coef < 0:
        raise ValueError(f"kl coef={coef} must be >= 0")
    _check_estimator(estimator)
    check_aggregation_mode(aggregation, max_len)

    def objective(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        del new_entropy
        kl = kl_penalty(new_logprobs, batch.ref_logprobs, estimator)
        loss = coef * aggregate(kl, batch.loss_weights, aggregation, max_len)
        kl_mean = aggregate(kl, batch.completion_mask.astype(jnp.float32), "token-mean")
        return loss, {"kl/loss": loss, "kl/mean": kl_mean}

    return objective


def kl_reward_penalty(coef: float, estimator: str = "k1") -> Transform:
    """Subtracts coef * KL(pi_old || ref), summed over each completion, from the rewards.

    The in-reward KL penalty of RLHF-PPO (Ziegler et al. 2019, arXiv 1909.08593;
    Ouyang et al. 2022). KL per token is `kl_penalty(batch.old_logprobs,
    batch.ref_logprobs)`, summed over `completion_mask` tokens: a sequence-level
    penalty r_b -= coef * sum_t KL_bt (place it before the advantage transform).

    Args:
      coef: penalty coefficient (>= 0).
      estimator: one of `KL_ESTIMATORS`; k1 (the log-ratio) is the classic choice.

    Returns:
      A stateless `Transform` that edits `batch.rewards` ([B] only). Metrics:
      "kl_reward/kl" (mean over sequences of the summed KL) and
      "kl_reward/penalty" (mean penalty subtracted).
    """
    if coef < 0:
        raise ValueError(f"kl_reward_penalty coef={coef} must be >= 0")
    _check_estimator(estimator)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "kl_reward_penalty")
        kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator)
        seq_kl = jnp.where(batch.completion_mask, kl, 0.0).sum(axis=1)
        penalty = coef * seq_kl
        metrics = {"kl_reward/kl": seq_kl.mean(), "kl_reward/penalty": penalty.mean()}
        return batch.replace(rewards=batch.rewards - penalty), metrics

    return stateless(fn)
