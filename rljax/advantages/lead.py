"""LEAD: a per-prompt target length from the group's own correct rollouts, and correctness /
efficiency advantages mixed by weights that follow the learning signal (Potential-Scaled
Instability, PSI).

"LEAD: Length-Efficient Adaptive and Dynamic reasoning" (arXiv 2605.09806). The rules follow
the authors' code (CrazyMint/LEAD, `verl/trainer/ppo/ray_trainer.py`, `compute_advantage`,
estimator "lead"; spec section 9):

1. Target length per prompt: L* = clip(mean length of the group's correct rollouts, l_min,
   l_max); L* = l_max when the group has no correct rollout (no efficiency pressure).
2. Efficiency reward R_eff of every rollout against its L* (`efficiency_rewards`).
3. A_corr and A_eff: GRPO advantages of the correctness reward and of R_eff, each normalised
   separately within groups (over all G rollouts of the group).
4. PSI weights from batch statistics (`pooled_group_stats`, `psi_target_weights`), smoothed by
   an EMA kept in the transform state, with a floor on the correctness weight.
5. A = whiten over the valid tokens of the batch of (w_corr A_corr + w_eff A_eff).

Why: the best correctness/efficiency trade-off moves during training, and reasoning budgets
differ across problems; a static weight or a global length cap cannot follow either.
"""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.group import grpo_advantages, masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_groups, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform

MODES = ("max_sym", "max_asym")


def target_lengths(
    lengths: jax.Array,
    correct: jax.Array,
    group_size: int,
    l_min: float = 1000.0,
    l_max: float = 8000.0,
) -> jax.Array:
    """LEAD's target length L* of each sample's prompt.

    L*_g = clip(mean_{i in g, correct} l_i, l_min, l_max) over the correct samples of group g,
    and L*_g = l_max when g has no correct sample (LEAD, arXiv 2605.09806, authors' code,
    aggregator "mean_correct"; the paper's run uses l_min = 1000, l_max = 8000).

    Args:
      lengths: [B] completion lengths (valid tokens), laid out as B/G contiguous groups.
      correct: [B] bool, which samples are correct.
      group_size: G, samples per prompt.
      l_min: lower clip of L*, > 0.
      l_max: upper clip of L* and the target of groups with no correct sample, >= l_min.

    Returns:
      [B] float32, L* of each sample's group (equal within a group).

    Raises:
      ValueError: if G does not divide B, or not 0 < l_min <= l_max.
    """
    chex.assert_rank(lengths, 1)
    chex.assert_equal_shape([lengths, correct])
    _check_lengths(l_min, l_max)
    b = lengths.shape[0]
    if group_size < 1 or b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    length = lengths.astype(jnp.float32).reshape(b // group_size, group_size)
    ok = correct.astype(bool).reshape(b // group_size, group_size)
    n_correct = ok.sum(axis=1)
    mean_correct = jnp.where(ok, length, 0.0).sum(axis=1) / jnp.maximum(n_correct, 1)
    target = jnp.where(n_correct > 0, jnp.clip(mean_correct, l_min, l_max), l_max)
    return jnp.repeat(target, group_size).astype(jnp.float32)


def efficiency_rewards(
    lengths: jax.Array,
    targets: jax.Array,
    correct: jax.Array,
    mode: str = "max_sym",
    asym_min_length: float = 500.0,
) -> jax.Array:
    """LEAD's efficiency reward of each rollout against its prompt's target length.

    With l the completion length and L* the target (LEAD, arXiv 2605.09806, authors' code):

    - "max_sym" (the paper's run): R_eff = max(-1, 1 - |l - L*| / L*), for every rollout,
      correct or not. It is 1 exactly at l = L* and penalises both over- and under-length.
    - "max_asym" (the code's default): with raw = 1 - l / L*, a correct rollout gets
      max(0, raw), or 0 when l < asym_min_length (too short to trust); an incorrect one gets
      clip(raw, -1, 0).

    Args:
      lengths: [B] completion lengths.
      targets: [B] target length L* of each sample's prompt (> 0).
      correct: [B] bool, which samples are correct (used by "max_asym" only).
      mode: "max_sym" or "max_asym".
      asym_min_length: "max_asym" only: correct rollouts shorter than this get 0 (the
        authors' code uses 500 tokens).

    Returns:
      [B] float32 rewards in [-1, 1].

    Raises:
      ValueError: if `mode` is unknown.
    """
    chex.assert_rank(lengths, 1)
    chex.assert_equal_shape([lengths, targets, correct])
    _check_mode(mode)
    length = lengths.astype(jnp.float32)
    target = targets.astype(jnp.float32)
    if mode == "max_sym":
        return jnp.maximum(-1.0, 1.0 - jnp.abs(length - target) / target)
    raw = 1.0 - length / target
    when_correct = jnp.where(length < asym_min_length, 0.0, jnp.maximum(0.0, raw))
    return jnp.where(correct.astype(bool), when_correct, jnp.clip(raw, -1.0, 0.0))


def pooled_group_stats(
    scores: jax.Array,
    include: jax.Array,
    group_size: int,
    eps: float = 1e-8,
) -> tuple[jax.Array, jax.Array]:
    """Batch mean and std of scores by the law of total variance over groups.

    Over the groups with at least one included sample (LEAD, arXiv 2605.09806, authors'
    code): with m_g and v_g the mean and population variance of the included scores of
    group g, mu = mean_g m_g and sigma = sqrt(mean_g v_g + Var_g(m_g) + eps), Var_g the
    population variance over those groups. Groups with no included sample are skipped;
    with none at all, mu = sigma = 0 (no eps: the code's "no signal" case).

    LEAD uses it for the correctness rewards with every sample included, and for R_eff with
    only the correct samples included.

    Args:
      scores: [B] per-sample scores, laid out as B/G contiguous groups.
      include: [B] bool, which samples enter the statistics.
      group_size: G, samples per prompt.
      eps: added under the square root.

    Returns:
      (mu, sigma), float32 scalars.

    Raises:
      ValueError: if G does not divide B.
    """
    chex.assert_rank(scores, 1)
    chex.assert_equal_shape([scores, include])
    b = scores.shape[0]
    if group_size < 1 or b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    x = scores.astype(jnp.float32).reshape(b // group_size, group_size)
    inc = include.astype(bool).reshape(b // group_size, group_size)
    count = inc.sum(axis=1)
    present = count > 0  # [B/G] groups that enter the statistics
    n = jnp.maximum(count, 1)
    group_mean = jnp.where(inc, x, 0.0).sum(axis=1) / n
    group_var = jnp.where(inc, (x - group_mean[:, None]) ** 2, 0.0).sum(axis=1) / n
    n_groups = present.sum()
    k = jnp.maximum(n_groups, 1)
    mu = jnp.where(present, group_mean, 0.0).sum() / k
    var_of_means = jnp.where(present, (group_mean - mu) ** 2, 0.0).sum() / k
    mean_var = jnp.where(present, group_var, 0.0).sum() / k
    sigma = jnp.sqrt(mean_var + var_of_means + eps)
    return mu, jnp.where(n_groups > 0, sigma, 0.0)


def psi_target_weights(
    mu_corr: jax.Array,
    sigma_corr: jax.Array,
    mu_eff: jax.Array,
    sigma_eff: jax.Array,
    alpha: float = 1.0,
    eps: float = 1e-8,
) -> jax.Array:
    """LEAD's Potential-Scaled Instability target weights of (correctness, efficiency).

    From the authors' code (LEAD, arXiv 2605.09806):

      cv_k = sigma_k / (|mu_k| + eps),   cv_norm_k = cv_k / (cv_corr + cv_eff + eps),
      P_corr = (1 - clip(mu_corr, 0, 1))^alpha,
      P_eff = (1 - (clip(mu_eff, -1, 1) + 1) / 2)^alpha,
      D_k = cv_norm_k P_k,   target_k = D_k / (D_corr + D_eff + eps).

    The coefficient of variation measures how unstable (informative) a reward still is; the
    potential how much room it has left to improve (correctness in [0, 1], R_eff in [-1, 1]).
    The two targets sum to 1 up to eps, or are both ~0 when neither reward has room left.

    Args:
      mu_corr: scalar batch mean of the correctness rewards.
      sigma_corr: scalar batch std of the correctness rewards.
      mu_eff: scalar batch mean of R_eff (correct samples).
      sigma_eff: scalar batch std of R_eff (correct samples).
      alpha: exponent of the potentials (1 in the paper).
      eps: stabiliser of the three divisions.

    Returns:
      [2] float32, the target weights (w_corr, w_eff).
    """
    cv_corr = sigma_corr / (jnp.abs(mu_corr) + eps)
    cv_eff = sigma_eff / (jnp.abs(mu_eff) + eps)
    cv_sum = cv_corr + cv_eff + eps
    potential_corr = (1.0 - jnp.clip(mu_corr, 0.0, 1.0)) ** alpha
    potential_eff = (1.0 - (jnp.clip(mu_eff, -1.0, 1.0) + 1.0) / 2.0) ** alpha
    d = jnp.stack([cv_corr / cv_sum * potential_corr, cv_eff / cv_sum * potential_eff])
    return (d / (d.sum() + eps)).astype(jnp.float32)


def _whiten_unbiased(x: jax.Array, mask: jax.Array) -> jax.Array:
    """(x - mean) * rsqrt(var + 1e-8) over mask, var with Bessel's correction (verl's
    `masked_whiten`); 0 off the mask."""
    n = mask.sum()
    mean = jnp.where(mask, x, 0.0).sum() / jnp.maximum(n, 1)
    var = jnp.where(mask, (x - mean) ** 2, 0.0).sum() / jnp.maximum(n - 1, 1)
    return jnp.where(mask, (x - mean) * jax.lax.rsqrt(var + 1e-8), 0.0)


def _check_lengths(l_min: float, l_max: float) -> None:
    if not 0.0 < l_min <= l_max:
        raise ValueError(
            f"l_min={l_min}, l_max={l_max} must satisfy 0 < l_min <= l_max: they clip the "
            "target length L*, which divides R_eff"
        )


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; use one of {MODES}")


def _check_config(group_size: int, alpha: float, beta: float, w_min: float) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: LEAD's GRPO advantages and target lengths compare the "
            "samples of a prompt; sample G >= 2 completions per prompt"
        )
    if alpha < 0:
        raise ValueError(f"alpha={alpha} must be >= 0 (the exponent of the potentials)")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta={beta} must be in [0, 1): the EMA keeps beta of the old weights")
    if not 0.0 <= w_min <= 1.0:
        raise ValueError(f"w_min={w_min} must be in [0, 1]: it is the floor of w_corr")


def lead_advantages(
    group_size: int,
    l_min: float = 1000.0,
    l_max: float = 8000.0,
    mode: str = "max_sym",
    alpha: float = 1.0,
    beta: float = 0.95,
    w_min: float = 0.3,
    correct_threshold: float = 1.0,
    asym_min_length: float = 500.0,
    eps: float = 1e-8,
) -> Transform:
    """Stateful transform writing LEAD's advantages to `batch.advantages`.

    LEAD (arXiv 2605.09806), as in the authors' code (module docstring). With R_corr =
    `batch.rewards` and correct = (R_corr >= correct_threshold), l = completion_mask row sums:

      L* = target_lengths(l, correct),  R_eff = efficiency_rewards(l, L*, correct, mode),
      A_corr = GRPO(R_corr),  A_eff = GRPO(R_eff)      (within groups, ddof=1 std, eps 1e-6),
      (mu_c, s_c) = pooled_group_stats(R_corr, all samples),
      (mu_e, s_e) = pooled_group_stats(R_eff, correct samples only),
      w <- beta w + (1 - beta) psi_target_weights(mu_c, s_c, mu_e, s_e)   (state, from 0.5/0.5),
      w_corr = max(w[0], w_min),  w_eff = 1 - w_corr,
      A = whiten over valid tokens of (w_corr A_corr + w_eff A_eff) broadcast over tokens.

    Reading of the spec's "efficiency statistics use correct rollouts only": only the PSI
    statistics (mu_e, s_e) are restricted to correct rollouts; R_eff itself and its GRPO
    normalisation A_eff cover every rollout, as in the authors' code. The state holds the EMA
    before the floor (the floor is applied to the weights used, not stored), so the stored
    pair need not sum to 1; the weights used always do. The whitening uses the ddof=1
    token variance and rsqrt(var + 1e-8), like verl's `masked_whiten`; every valid token
    counts, so a long completion weighs more in the batch statistics.

    Args:
      group_size: G, samples per prompt (>= 2).
      l_min: lower clip of the target length (1000 in the paper's run).
      l_max: upper clip of the target length, and the target with no correct rollout (8000).
      mode: efficiency reward, "max_sym" (the paper's run) or "max_asym".
      alpha: exponent of the PSI potentials.
      beta: EMA coefficient of the weights, in [0, 1).
      w_min: floor of the correctness weight, in [0, 1].
      correct_threshold: a sample is correct when its reward is >= this.
      asym_min_length: "max_asym" only, see `efficiency_rewards`.
      eps: stabiliser of the PSI statistics and weights.

    Returns:
      A `Transform` whose state is the [2] float32 EMA weights (w_corr, w_eff), initially
      (0.5, 0.5). Metrics: "lead/advantages/{mean,std,min,max}" over valid tokens,
      "lead/target_len_mean" (mean L* over groups), "lead/r_eff_mean", "lead/accuracy",
      "lead/mu_corr", "lead/sigma_corr", "lead/mu_eff", "lead/sigma_eff",
      "lead/target_w_corr", "lead/target_w_eff", "lead/w_corr", "lead/w_eff" (the weights
      used, after the floor).

    Raises:
      ValueError: at construction on a bad setting (G < 2, l_min/l_max, mode, alpha, beta,
        w_min); at apply if rewards are not [B] or `batch.group_id` is not contiguous groups
        of G.
    """
    _check_config(group_size, alpha, beta, w_min)
    _check_lengths(l_min, l_max)
    _check_mode(mode)

    def init() -> jax.Array:
        return jnp.full((2,), 0.5, jnp.float32)

    def apply(batch: Batch, state: jax.Array, ctx: Context) -> tuple[Batch, jax.Array, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "lead_advantages")
        check_groups(batch.group_id, group_size)
        chex.assert_shape(state, (2,))
        mask = batch.completion_mask
        rewards = batch.rewards.astype(jnp.float32)
        lengths = mask.sum(axis=1).astype(jnp.float32)  # [B], over tokens
        correct = rewards >= correct_threshold
        targets = target_lengths(lengths, correct, group_size, l_min, l_max)
        r_eff = efficiency_rewards(lengths, targets, correct, mode, asym_min_length)
        adv_corr = grpo_advantages(rewards, group_size)
        adv_eff = grpo_advantages(r_eff, group_size)
        everyone = jnp.ones_like(correct)
        mu_corr, sigma_corr = pooled_group_stats(rewards, everyone, group_size, eps)
        mu_eff, sigma_eff = pooled_group_stats(r_eff, correct, group_size, eps)
        target = psi_target_weights(mu_corr, sigma_corr, mu_eff, sigma_eff, alpha, eps)
        new_state = (beta * state + (1.0 - beta) * target).astype(jnp.float32)
        w_corr = jnp.maximum(new_state[0], w_min)
        w_eff = 1.0 - w_corr
        combined = (w_corr * adv_corr + w_eff * adv_eff)[:, None] * mask.astype(jnp.float32)
        token_adv = _whiten_unbiased(combined, mask)
        metrics = masked_stats(token_adv, mask, "lead/advantages")
        metrics.update(
            {
                "lead/target_len_mean": targets.reshape(-1, group_size)[:, 0].mean(),
                "lead/r_eff_mean": r_eff.mean(),
                "lead/accuracy": correct.astype(jnp.float32).mean(),
                "lead/mu_corr": mu_corr,
                "lead/sigma_corr": sigma_corr,
                "lead/mu_eff": mu_eff,
                "lead/sigma_eff": sigma_eff,
                "lead/target_w_corr": target[0],
                "lead/target_w_eff": target[1],
                "lead/w_corr": w_corr,
                "lead/w_eff": w_eff,
            }
        )
        return batch.replace(advantages=token_adv), new_state, metrics

    reads = frozenset({keys.REWARDS, keys.GROUP_ID, keys.COMPLETION_MASK})
    return Transform(init, apply, reads, frozenset({keys.ADVANTAGES}))
