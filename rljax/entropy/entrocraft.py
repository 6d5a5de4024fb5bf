"""Entrocraft: advantage rejection that makes the batch entropy follow a schedule.

"Addressing Performance Saturation for LLM RL via Precise Entropy Curve Control" (Li et al.
2026, arXiv 2604.26326; the method is called Entrocraft) relates the per-step entropy change
to the advantage distribution: to first order a sample reinforced with A > 0 lowers the
policy's entropy when its log-prob is above a baseline (sampled responses usually are), and
one pushed down with A < 0 raises it. Entrocraft therefore measures the batch entropy H of
the pre-update policy and, when H leaves a scheduled band [lo(t), up(t)], keeps only the
samples whose sign pulls H back:

- H > up(t): positive samples only, A = max(base, 0) (RAFT++: "A Minimalist Approach to LLM
  Reasoning: from Rejection Sampling to Reinforce", Xiong et al. 2025, arXiv 2504.11343);
- H < lo(t): negative samples only, A = min(base, 0) (NSR: "The Surprising Effectiveness of
  Negative Reinforcement in LLM Reasoning", Zhu et al. 2025, arXiv 2506.01347);
- otherwise: the estimator's advantages unchanged (GRPO in the paper).

The rules follow the authors' code (lblaoke/entrocraft, `verl/trainer/ppo/core_algos.py`,
`compute_grpo_range*`, `compute_raftpp*`, `compute_nsr*`; H is the token-mean entropy of the
old-policy forward pass, `ray_trainer.py`). The module also holds the paper's ENTROPIC
baseline (`compute_entropic*`): positive and negative advantages reweighted by 1 +/- alpha,
alpha a PI controller of H - H*.

H is read from `batch.extras["old_entropy"]` ([B, T] per-token entropy of the pre-update
policy, 0 on invalid tokens), which the train step's prepare stage always provides.
"""

import math
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core import keys
from rljax.core.aggregation import masked_mean
from rljax.core.batch import Batch, check_sequence_rewards
from rljax.core.transform import (
    Context,
    Metrics,
    Transform,
    declare_wrapper,
    merge_metrics,
    stateless,
)

Band = Callable[[jax.Array], tuple[jax.Array, jax.Array]]

BAND_KINDS = ("constant", "linear", "cosine")
OUTSIDE_MODES = ("estimator", "reward")
SELECTIONS = ("sign", "covariance")
ENTROPY_KEY = "old_entropy"


def _check_pair(name: str, pair: tuple[float, float]) -> tuple[float, float]:
    values = tuple(float(x) for x in pair)
    if len(values) != 2:
        raise ValueError(f"{name}={pair} must be a pair (value at step 0, value at total_steps)")
    if not all(math.isfinite(x) for x in values):
        raise ValueError(f"{name}={pair} must be finite")
    return values


def entropy_band(
    kind: str,
    lower: tuple[float, float],
    upper: tuple[float, float],
    total_steps: int,
) -> Band:
    """The scheduled entropy band of Entrocraft (arXiv 2604.26326), as a function of the step.

    With p = clip(t / T, 0, 1) the progress (t the step, T = `total_steps`):
      "constant": lo = lower[0], up = upper[0] (the authors' `grpo_range`);
      "linear":   lo = lower[0] + (lower[1] - lower[0]) * p (`grpo_range_linear`);
      "cosine":   the same with p replaced by 0.5 * (1 - cos(pi * p)).
    up follows the same rule with `upper`. The paper's reference run anneals linearly from
    [0.6, 0.7] to [0.4, 0.5] nats per token. Because both edges share the progress, lo <= up
    at both ends implies lo <= up at every step.

    Args:
      kind: "constant", "linear" or "cosine".
      lower: (lo at step 0, lo at step T); "constant" uses lower[0] only.
      upper: (up at step 0, up at step T); "constant" uses upper[0] only.
      total_steps: T >= 1, the schedule's length (the run's number of steps).

    Returns:
      `band(step) -> (lo, up)`: f32 scalars; jittable with a traced int32 `step`.

    Raises:
      ValueError: for an unknown kind, total_steps < 1, non-finite values, or lower > upper at
        an end of the schedule the kind uses.
    """
    if kind not in BAND_KINDS:
        raise ValueError(f"unknown entropy band kind={kind!r}; valid kinds: {list(BAND_KINDS)}")
    if int(total_steps) != total_steps or total_steps < 1:
        raise ValueError(f"total_steps={total_steps} must be an int >= 1 (the schedule length)")
    lower = _check_pair("lower", lower)
    upper = _check_pair("upper", upper)
    ends = ((0, "start"),) if kind == "constant" else ((0, "start"), (1, "end"))
    for i, where in ends:
        if lower[i] > upper[i]:
            raise ValueError(
                f"lower={lower[i]} > upper={upper[i]} at the {where} of the schedule "
                f"(lower={lower}, upper={upper}): the band needs lower <= upper"
            )

    def band(step: jax.Array) -> tuple[jax.Array, jax.Array]:
        if kind == "constant":
            return jnp.float32(lower[0]), jnp.float32(upper[0])
        progress = jnp.clip(jnp.asarray(step, jnp.float32) / total_steps, 0.0, 1.0)
        if kind == "cosine":
            progress = 0.5 * (1.0 - jnp.cos(jnp.pi * progress))
        lo = lower[0] + (lower[1] - lower[0]) * progress
        up = upper[0] + (upper[1] - upper[0]) * progress
        return lo.astype(jnp.float32), up.astype(jnp.float32)

    return band


def batch_entropy(batch: Batch) -> jax.Array:
    """Token-mean entropy of the pre-update policy over the batch's valid tokens.

    H = sum_{b,t} mask * old_entropy / sum_{b,t} mask, over all valid (completion_mask)
    tokens of the batch together, as the authors' trainer aggregates the old-policy entropy
    before choosing the advantage rule. 0 when no token is valid.

    Args:
      batch: a `Batch` with `extras["old_entropy"]` [B, T].

    Returns:
      f32 scalar H (nats per token).

    Raises:
      ValueError: if `extras["old_entropy"]` is missing (the train step's prepare stage
        provides it; in tests set it yourself) or is not [B, T].
    """
    if ENTROPY_KEY not in batch.extras:
        raise ValueError(
            f"batch.extras[{ENTROPY_KEY!r}] is missing (extras has keys {sorted(batch.extras)}):"
            " the batch entropy needs the [B, T] per-token entropy of the pre-update policy, "
            "which the train step's prepare stage provides; outside it set it yourself"
        )
    entropy = jnp.asarray(batch.extras[ENTROPY_KEY], jnp.float32)
    mask = batch.completion_mask
    if entropy.shape != mask.shape:
        raise ValueError(
            f"batch.extras[{ENTROPY_KEY!r}] has shape {entropy.shape}, expected [B, T] = "
            f"{mask.shape}"
        )
    return masked_mean(entropy, mask)


def raw_reward_advantages() -> Transform:
    """Transform writing `batch.advantages = rewards[:, None] * completion_mask`.

    The raw sequence reward as the advantage, no baseline: the base of the authors' RAFT++,
    NSR, W-REINFORCE and ENTROPIC estimators (their math reward is +1 / -1, so the sign of the
    reward is the sign of the sample). Use it as the `inner` of `entropic_advantages` for the
    authors' exact form.

    Returns:
      A stateless `Transform`. Metrics: "raw_reward/advantages/{mean,std,min,max}" over valid
      (completion_mask) tokens.

    Raises:
      ValueError: at apply if rewards are not [B].
    """

    return sequence_advantages(
        "raw_reward_advantages", lambda r, _: r, prefix="raw_reward", zero_std=False
    )


def entrocraft_advantages(
    inner: Transform, band: Band, outside: str = "estimator", selection: str = "sign"
) -> Transform:
    """Entrocraft (arXiv 2604.26326): reject samples whose sign pushes H away from the band.

    Runs `inner` (any advantage transform, e.g. `rljax.advantages.group.group_advantages`)
    to get A, reads H = `batch_entropy(batch)` and (lo, up) = band(ctx.step), then per token:
      H > up:        A' = max(base, 0)  (positive samples only: lowers the entropy);
      H < lo:        A' = min(base, 0)  (negative samples only: raises the entropy);
      lo <= H <= up: A' = A             (the inner estimator unchanged).
    With `outside="reward"`, base is the raw sequence reward on valid tokens, exactly the
    authors' code (RAFT++ / NSR on +/-1 rewards, no normalization). With
    `outside="estimator"` (the default), base is inner's A: the estimator-agnostic form the
    paper describes; this is an interpretation (the authors' code only has the GRPO form).
    The branch is a `jnp.where` on the traced H, so the transform is jittable.

    `selection="covariance"` (an interpretation, not in the paper) picks the kept tokens by
    the covariance law the sign rule stands for (Cui et al., arXiv 2505.22617: a step changes
    H by about -eta Cov(log pi, A)). With l the old log-probs and l_bar their mean over the
    batch's valid tokens, token i contributes c_i = base_i * (l_i - l_bar) to that
    covariance; above the band only tokens with c_i > 0 keep base_i, below it only those with
    c_i < 0, so the batch covariance of the new advantages is >= 0 above and <= 0 below the
    band: the first-order prediction always points back to the band. Where every sampled
    token is likelier than average (l_i > l_bar, the paper's premise) this is the sign
    rule. Where it is not, e.g. a small model whose successes are its likeliest answers, the
    sign rule's negative-only branch lowers H as well (measured in the README), and this
    rule instead keeps the rare successes and the confident failures.

    Args:
      inner: the advantage transform whose output is filtered; its state is this one's.
      band: `step -> (lo, up)` f32 scalars, e.g. from `entropy_band`.
      outside: "estimator" or "reward", the base of the filtered branches.
      selection: "sign" (the paper's rule, above) or "covariance" (reads
        `batch.old_logprobs`, which the prepare stage fills before the transforms).

    Returns:
      A `Transform` with inner's state. Metrics (plus inner's): "entrocraft/entropy" (H),
      "entrocraft/lower", "entrocraft/upper", "entrocraft/mode" (-1 below the band, 0
      inside, +1 above) and "entrocraft/kept_frac" (fraction of valid tokens with nonzero
      advantage; 0 when none is valid).

    Raises:
      ValueError: at construction for an unknown `outside` or `selection`; at apply if
        "old_entropy" is missing, or with "reward" if rewards are not [B].
    """
    if outside not in OUTSIDE_MODES:
        raise ValueError(f"outside={outside!r} must be one of {list(OUTSIDE_MODES)}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection={selection!r} must be one of {list(SELECTIONS)}")

    def apply(batch: Batch, state, ctx: Context):
        batch, state, inner_metrics = inner.apply(batch, state, ctx)
        mask = batch.completion_mask
        adv = batch.advantages
        chex.assert_equal_shape([adv, mask])
        entropy = batch_entropy(batch)
        lo, up = band(ctx.step)
        chex.assert_rank([lo, up], 0)
        if outside == "reward":
            check_sequence_rewards(batch.rewards, "entrocraft_advantages(outside='reward')")
            base = batch.rewards[:, None] * mask.astype(jnp.float32)
        else:
            base = adv
        above = entropy > up
        below = entropy < lo
        if selection == "sign":
            filtered = jnp.where(above, jnp.maximum(base, 0.0), jnp.minimum(base, 0.0))
        else:
            chex.assert_equal_shape([batch.old_logprobs, mask])
            centred = batch.old_logprobs - masked_mean(batch.old_logprobs, mask)
            contribution = base * centred
            keep = jnp.where(above, contribution > 0, contribution < 0)
            filtered = jnp.where(keep, base, 0.0)
        filtered = jnp.where(mask, filtered, 0.0)
        new_adv = jnp.where(above | below, filtered, adv)
        n_valid = jnp.maximum(mask.sum(), 1).astype(jnp.float32)
        metrics = {
            "entrocraft/entropy": entropy,
            "entrocraft/lower": jnp.asarray(lo, jnp.float32),
            "entrocraft/upper": jnp.asarray(up, jnp.float32),
            "entrocraft/mode": above.astype(jnp.float32) - below.astype(jnp.float32),
            "entrocraft/kept_frac": (mask & (new_adv != 0)).sum() / n_valid,
        }
        return batch.replace(advantages=new_adv), state, merge_metrics(inner_metrics, metrics)

    reads = {keys.OLD_ENTROPY, keys.COMPLETION_MASK, keys.ADVANTAGES}
    reads |= {keys.REWARDS} if outside == "reward" else set()
    reads |= {keys.OLD_LOGPROBS} if selection == "covariance" else set()
    return declare_wrapper(Transform(inner.init, apply), inner, reads, {keys.ADVANTAGES})


def entropic_advantages(
    inner: Transform,
    target_entropy: float | Callable[[jax.Array], jax.Array],
    proportional_gain: float = 1.0,
    integral_gain: float = 0.01,
) -> Transform:
    """The ENTROPIC baseline of Entrocraft (arXiv 2604.26326): sign-dependent reweighting.

    With H = `batch_entropy(batch)`, H* the target and e = H - H*:
      alpha = s + proportional_gain * e,
      A' = (1 + alpha) * A where A > 0,  (1 - alpha) * A where A < 0,  0 where A = 0,
      s' = alpha - (proportional_gain - integral_gain) * e = s + integral_gain * e.
    s accumulates integral_gain * e, so alpha is a PI controller of the entropy error; with
    the default gains (1, 0.01) this is the authors' `compute_entropic*` (alpha = last_alpha
    + (H - H*), returning alpha - 0.99 (H - H*)). With `inner=raw_reward_advantages()` and
    +/-1 rewards it is their exact estimator; with another inner it is the same reweighting
    of that estimator's signs.

    Why the sign: H > H* gives alpha > 0, so positive samples weigh more than negative ones;
    reinforcing sampled (mostly high-probability) responses sharpens the policy and the
    entropy falls back toward H*. H < H* does the opposite. alpha is not clipped (neither is
    the authors'): for |alpha| > 1 one side's weight changes sign.

    Args:
      inner: the advantage transform whose output is reweighted.
      target_entropy: H* in nats per token, a float or `step -> f32 scalar`.
      proportional_gain: alpha's gain on the current error (authors: 1), >= 0.
      integral_gain: the gain of the accumulated error (authors: 0.01), >= 0.

    Returns:
      A `Transform` with state (s, inner's state), s an f32 scalar starting at 0. Metrics
      (plus inner's): "entropic/alpha", "entropic/entropy" (H), "entropic/target" (H*) and
      "entropic/integral" (s').

    Raises:
      ValueError: at construction for negative or non-finite gains or a negative float
        target; at apply for a malformed state or a missing "old_entropy".
    """
    for name, gain in (("proportional_gain", proportional_gain), ("integral_gain", integral_gain)):
        if not math.isfinite(gain) or gain < 0:
            raise ValueError(
                f"{name}={gain} must be finite and >= 0 (a negative gain drives the entropy "
                "away from the target)"
            )
    if not callable(target_entropy):
        target_value = float(target_entropy)
        if not math.isfinite(target_value) or target_value < 0:
            raise ValueError(
                f"target_entropy={target_entropy} must be finite and >= 0 (nats per token)"
            )

        def target_fn(step: jax.Array) -> jax.Array:
            del step
            return jnp.float32(target_value)

    else:
        target_fn = target_entropy

    def init():
        return (jnp.zeros((), jnp.float32), inner.init())

    def apply(batch: Batch, state, ctx: Context):
        if not isinstance(state, tuple) or len(state) != 2:
            raise ValueError(
                "entropic_advantages expects the state (integral, inner_state) built by its "
                f"init(); got {type(state).__name__}"
            )
        integral, inner_state = state
        chex.assert_rank(integral, 0)
        batch, inner_state, inner_metrics = inner.apply(batch, inner_state, ctx)
        adv = batch.advantages
        entropy = batch_entropy(batch)
        target = jnp.asarray(target_fn(ctx.step), jnp.float32)
        chex.assert_rank(target, 0)
        error = entropy - target
        alpha = jnp.asarray(integral, jnp.float32) + proportional_gain * error
        weights = jnp.where(adv > 0, 1.0 + alpha, jnp.where(adv < 0, 1.0 - alpha, 0.0))
        new_adv = adv * weights
        new_integral = (integral + integral_gain * error).astype(jnp.float32)
        metrics = {
            "entropic/alpha": alpha,
            "entropic/entropy": entropy,
            "entropic/target": target,
            "entropic/integral": new_integral,
        }
        new_state = (new_integral, inner_state)
        return batch.replace(advantages=new_adv), new_state, merge_metrics(inner_metrics, metrics)

    reads = {keys.OLD_ENTROPY, keys.COMPLETION_MASK, keys.ADVANTAGES}
    return declare_wrapper(Transform(init, apply), inner, reads, {keys.ADVANTAGES})


def signed_rewards(threshold: float = 0.5) -> Transform:
    """Transform mapping rewards to the authors' ±1: +1 where r >= threshold, else -1.

    Entrocraft's code scores answers with a `math_reward` of +1 / -1, so its negative-only
    branch pushes down every failure; with 0 / 1 rewards the raw-reward branch would have no
    negatives at all. GRPO's normalised advantages are unchanged by this map.

    Args:
      threshold: the reward at which a sample counts as a success.

    Returns:
      A stateless `Transform` writing `batch.rewards` ([B]). Metric "signed_rewards/success_frac".
    """

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "signed_rewards")
        success = batch.rewards >= threshold
        signed = jnp.where(success, 1.0, -1.0).astype(jnp.float32)
        return batch.replace(rewards=signed), {"signed_rewards/success_frac": success.mean()}

    return stateless(fn, {keys.REWARDS}, {keys.REWARDS})
