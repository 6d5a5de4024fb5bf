"""GPRL: per-dimension General Preference Model advantages, aggregated, with a drift monitor.

"General Preference RL" (GPRL, arXiv 2605.18721) on top of the General Preference Model
(GPM) of "Beyond Bradley-Terry Models: A General Preference Model for Language Model
Alignment" (Zhang et al. 2024, arXiv 2410.02197). Only the abstract of GPRL is available;
the per-dimension reward, the normalisation, the aggregation and the drift monitor below are
an interpretation (spec section 11 [INTERP]) and every constant is a constructor argument.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.group import grpo_advantages, masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups
from rljax.core.transform import Context, Metrics, Transform


def _check_group_size(group_size: int, b: int | None = None) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: GPRL compares each response with the others of its "
            "group and needs at least 2 samples per prompt; sample G >= 2 completions per prompt"
        )
    if b is not None and b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")


def gpm_dimension_rewards(embeddings: jax.Array, group_size: int) -> jax.Array:
    """Per-dimension GPM rewards: each response's mean preference score against its group.

    With v_i^(l) the 2-d embedding of response i in skew-symmetric subspace l and
    J = [[0, -1], [1, 0]], the GPM score of i over j in subspace l is
    s_ij^l = v_i^(l)T J v_j^(l) = v_i1 v_j0 - v_i0 v_j1 (the GPM's preference score is
    sum_l lambda_l(x) s_ij^l, "Beyond Bradley-Terry Models: A General Preference Model for
    Language Model Alignment", arXiv 2410.02197). The reward of i in dimension l is the mean
    over the G - 1 other samples j of i's group of s_ij^l (interpretation of "General
    Preference RL", arXiv 2605.18721). Since s^l is skew-symmetric (s_ij = -s_ji, s_ii = 0),
    the rewards of a group sum to 0 in every dimension. The scores are computed pairwise, so
    identical embeddings give exactly 0.

    Args:
      embeddings: [B, K, 2] GPM embeddings, K subspaces, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).

    Returns:
      [B, K] rewards r_i^l.

    Raises:
      ValueError: if the last axis is not 2, G < 2, or G does not divide B.
    """
    chex.assert_rank(embeddings, 3)
    b, k, two = embeddings.shape
    if two != 2:
        raise ValueError(
            f"embeddings have shape {embeddings.shape}, expected [B, K, 2]: one 2-d vector per "
            "skew-symmetric subspace"
        )
    _check_group_size(group_size, b)
    v = embeddings.reshape(b // group_size, group_size, k, 2)
    vi, vj = v[:, :, None], v[:, None, :]  # [n, G, 1, K, 2] and [n, 1, G, K, 2]
    scores = vi[..., 1] * vj[..., 0] - vi[..., 0] * vj[..., 1]  # [n, G, G, K]: s_ij^l
    # Sum over j of i's group; s_ii = 0 exactly, so this is the sum over j != i.
    return (scores.sum(axis=2) / (group_size - 1)).reshape(b, k)


def _normalised_weights(weights: jax.Array, b: int, k: int) -> jax.Array:
    """[K] or [B, K] non-negative weights -> [B, K] rows summing to 1 (0 for an all-zero row)."""
    if weights.ndim == 1:
        if weights.shape != (k,):
            raise ValueError(
                f"weights have shape {weights.shape}, expected [K] = ({k},) or [B, K] = "
                f"({b}, {k}): one weight per reward dimension"
            )
        weights = jnp.broadcast_to(weights[None, :], (b, k))
    elif weights.shape != (b, k):
        raise ValueError(
            f"weights have shape {weights.shape}, expected [K] = ({k},) or [B, K] = ({b}, {k})"
        )
    if not isinstance(weights, jax.core.Tracer) and np.any(np.asarray(weights) < 0):
        raise ValueError(
            f"weights must be >= 0 (GPM eigenvalues lambda_l(x)), got {np.asarray(weights)}"
        )
    total = weights.sum(axis=1, keepdims=True)  # over the K dimensions
    return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)


def gprl_advantages(
    rewards: jax.Array,
    group_size: int,
    weights: jax.Array | None = None,
    unbiased_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """Aggregated per-dimension group-relative advantages (GPRL).

    For each dimension l, A_i^l = (r_i^l - mean_g r^l) / (std_g r^l + eps) over the G
    samples of i's group, so each dimension is normalised on its own scale; then
    A_i = sum_l (lambda_l / sum_l' lambda_l') A_i^l ("General Preference RL",
    arXiv 2605.18721; interpretation, spec section 11). The std is unbiased (ddof=1) by
    default, as in `grpo_advantages`. A dimension whose rewards are all equal within a group
    contributes exactly 0 there. Rescaling one dimension's rewards by c > 0 leaves A
    unchanged up to the eps term (eps guards against z-scoring rounding noise).

    Args:
      rewards: [B, K] per-dimension rewards, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).
      weights: [K] or [B, K] non-negative dimension weights lambda (context-dependent when
        [B, K]); None means uniform. A row whose weights are all 0 gets A = 0.
      unbiased_std: use the ddof=1 std; False uses the population std.
      eps: added to each dimension's group std.

    Returns:
      [B] advantages.

    Raises:
      ValueError: if G < 2, G does not divide B, the weights have the wrong shape, or (on
        concrete inputs) a weight is negative.
    """
    chex.assert_rank(rewards, 2)
    b, k = rewards.shape
    _check_group_size(group_size, b)
    weights = jnp.ones((k,), rewards.dtype) if weights is None else jnp.asarray(weights)
    lam = _normalised_weights(weights.astype(rewards.dtype), b, k)  # [B, K]
    # Each dimension z-scored in its group on its own scale: GDPO's decoupled normalisation.
    z = grpo_advantages(rewards, group_size, unbiased_std=unbiased_std, eps=eps)
    return (lam * z).sum(axis=1)  # over the K dimensions


class DriftMonitorState(NamedTuple):
    """State of `preference_advantages`' drift monitor.

    Attributes:
      history: [W, K] ring buffer of the last W per-dimension batch-mean rewards.
      next_index: int32, where the next batch mean is written.
      filled: int32, how many entries of `history` are valid (<= W).
      multipliers: [K] current dimension multipliers (start at 1, mean 1).
    """

    history: jax.Array
    next_index: jax.Array
    filled: jax.Array
    multipliers: jax.Array


def _drift_update(
    state: DriftMonitorState,
    batch_mean: jax.Array,
    threshold: float,
    decay: float,
    min_gain: float,
) -> tuple[DriftMonitorState, jax.Array]:
    """Pushes one [K] batch mean; decays a dimension that dominates the windowed gain."""
    window, k = state.history.shape
    history = state.history.at[state.next_index].set(batch_mean)
    next_index = (state.next_index + 1) % window
    filled = jnp.minimum(state.filled + 1, window)
    # With a full window the oldest entry is the one the next write will overwrite.
    gain = batch_mean - history[next_index]  # [K]: newest minus oldest mean in the window
    positive = jnp.maximum(gain, 0.0)
    total = positive.sum()  # over the K dimensions
    share = positive / jnp.where(total > 0, total, 1.0)
    alarm = (filled >= window) & (total > min_gain) & (share.max() > threshold)
    decayed = state.multipliers.at[jnp.argmax(share)].multiply(decay)
    decayed = decayed * (k / decayed.sum())  # renormalise to mean 1
    multipliers = jnp.where(alarm, decayed, state.multipliers)
    # After an alarm the window restarts from the newest mean, so the next verdict only
    # measures gains made under the new weights (interpretation).
    restart = jnp.zeros_like(history).at[0].set(batch_mean)
    new_state = DriftMonitorState(
        history=jnp.where(alarm, restart, history),
        next_index=jnp.where(alarm, 1 % window, next_index).astype(jnp.int32),
        filled=jnp.where(alarm, 1, filled).astype(jnp.int32),
        multipliers=multipliers,
    )
    return new_state, alarm


def preference_advantages(
    group_size: int,
    weights: jax.Array | None = None,
    weights_key: str = "dimension_weights",
    drift_window: int = 8,
    drift_threshold: float = 0.6,
    drift_decay: float = 0.5,
    clip_shrink: float = 0.5,
    num_dimensions: int | None = None,
    min_gain: float = 0.0,
) -> Transform:
    """Stateful GPRL transform: `gprl_advantages` of [B, K] rewards with a drift monitor.

    "General Preference RL" (arXiv 2605.18721); the monitor is an interpretation of the
    abstract's "drift monitor that reweights dimensions and tightens the trust region".

    Weights lambda: `batch.extras[weights_key]` ([B, K], >= 0, context-dependent) if
    present, else the constructor's [K] `weights`, else uniform; each is multiplied by the
    monitor's per-dimension multipliers before `gprl_advantages` normalises them.

    Drift monitor, once per apply: the per-dimension mean reward over the B samples is
    pushed into a ring buffer of the last `drift_window` means. With a full window, the gain
    of dimension l is newest minus oldest mean (raw reward units); if the positive gain of
    the window exceeds `min_gain` and one dimension's share of it exceeds `drift_threshold`
    (that dimension alone is climbing: reward hacking along one axis), its multiplier is
    multiplied by `drift_decay`, the multipliers are renormalised to mean 1, the window
    restarts from the newest mean, and `batch.extras["clip_scale"]` is set to
    `clip_shrink` ([B] float; 1.0 on steps without an alarm, overwriting any earlier value)
    for a surrogate that scales its clip range by it. The multipliers updated this step are
    the ones used for this step's advantages.

    Args:
      group_size: G, samples per prompt (>= 2).
      weights: optional [K] non-negative dimension weights.
      weights_key: `batch.extras` key of optional [B, K] context-dependent weights.
      drift_window: W >= 2, batch means in the gain window.
      drift_threshold: share of the positive windowed gain in (0, 1] above which a single
        dimension is said to drift.
      drift_decay: factor in (0, 1] applied to a drifting dimension's multiplier.
      clip_shrink: clip_scale in (0, 1] written on an alarm step.
      num_dimensions: K; needed when `weights` is None (the monitor state is [W, K]).
      min_gain: the monitor stays quiet unless the total positive gain exceeds this.

    Returns:
      A `Transform` with a `DriftMonitorState`. Writes `batch.advantages =
      A[:, None] * completion_mask` and `batch.extras["clip_scale"]`. Metrics:
      "gprl/dim{l}_weight" (batch mean of the normalised effective weight of dimension l),
      "gprl/drift_alarm" (1.0 on an alarm step) and "gprl/advantages/{mean,std,min,max}"
      over valid tokens.

    Raises:
      ValueError: at construction for out-of-range settings or an unknown K; at apply if
        rewards are not [B, K], the extras weights are not [B, K], or `batch.group_id` is
        not contiguous groups of G.
    """
    _check_group_size(group_size)
    if weights is not None:
        weights = np.asarray(weights, np.float32)
        if weights.ndim != 1 or np.any(weights < 0):
            raise ValueError(
                f"weights={weights.tolist()} must be a [K] vector of non-negative dimension weights"
            )
        if num_dimensions is not None and num_dimensions != weights.shape[0]:
            raise ValueError(
                f"num_dimensions={num_dimensions} disagrees with the {weights.shape[0]} weights; "
                "pass one or make them agree"
            )
        num_dimensions = weights.shape[0]
    if num_dimensions is None or num_dimensions < 1:
        raise ValueError(
            f"num_dimensions={num_dimensions}: the drift monitor's state is [drift_window, K]; "
            "pass num_dimensions=K or weights of shape [K]"
        )
    if drift_window < 2:
        raise ValueError(f"drift_window={drift_window} must be >= 2 (a gain needs two means)")
    if not 0.0 < drift_threshold <= 1.0:
        raise ValueError(f"drift_threshold={drift_threshold} must be in (0, 1] (a share)")
    if not 0.0 < drift_decay <= 1.0:
        raise ValueError(f"drift_decay={drift_decay} must be in (0, 1] (1 disables reweighting)")
    if not 0.0 < clip_shrink <= 1.0:
        raise ValueError(f"clip_shrink={clip_shrink} must be in (0, 1] (1 keeps the clip range)")
    k = num_dimensions

    def init() -> DriftMonitorState:
        return DriftMonitorState(
            history=jnp.zeros((drift_window, k), jnp.float32),
            next_index=jnp.int32(0),
            filled=jnp.int32(0),
            multipliers=jnp.ones((k,), jnp.float32),
        )

    def apply(
        batch: Batch, state: DriftMonitorState, ctx: Context
    ) -> tuple[Batch, DriftMonitorState, Metrics]:
        del ctx
        rewards = batch.rewards
        if rewards.ndim != 2 or rewards.shape[1] != k:
            raise ValueError(
                f"preference_advantages needs [B, K] rewards with K = {k} dimensions, got "
                f"{rewards.shape}; score each response per GPM dimension (see "
                "gpm_dimension_rewards)"
            )
        b = rewards.shape[0]
        check_groups(batch.group_id, group_size)
        if weights_key in batch.extras:
            lam = jnp.asarray(batch.extras[weights_key], jnp.float32)
            if lam.shape != (b, k):
                raise ValueError(
                    f"batch.extras[{weights_key!r}] has shape {lam.shape}, expected [B, K] = "
                    f"({b}, {k})"
                )
        elif weights is not None:
            lam = jnp.broadcast_to(jnp.asarray(weights)[None, :], (b, k))
        else:
            lam = jnp.ones((b, k), jnp.float32)
        batch_mean = rewards.astype(jnp.float32).mean(axis=0)  # [K]: over the B samples
        state, alarm = _drift_update(state, batch_mean, drift_threshold, drift_decay, min_gain)
        effective = lam * state.multipliers[None, :]
        adv = gprl_advantages(rewards.astype(jnp.float32), group_size, effective)
        mask = batch.completion_mask
        token_adv = adv[:, None] * mask.astype(adv.dtype)
        clip_scale = jnp.full((b,), jnp.where(alarm, clip_shrink, 1.0), jnp.float32)
        norm = _normalised_weights(effective, b, k).mean(axis=0)  # [K]: over the B samples
        metrics = {f"gprl/dim{d}_weight": norm[d] for d in range(k)}
        metrics["gprl/drift_alarm"] = alarm.astype(jnp.float32)
        metrics.update(masked_stats(token_adv, mask, "gprl/advantages"))
        extras = {**batch.extras, "clip_scale": clip_scale}
        return batch.replace(advantages=token_adv, extras=extras), state, metrics

    reads = frozenset({keys.REWARDS, keys.GROUP_ID, keys.COMPLETION_MASK})
    writes = frozenset({keys.ADVANTAGES, keys.CLIP_SCALE})
    return Transform(init, apply, reads, writes, frozenset({keys.extra(weights_key)}))
