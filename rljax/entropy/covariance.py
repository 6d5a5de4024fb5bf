"""Cui et al.'s covariance law of policy entropy, and the Clip-Cov / KL-Cov objectives.

"The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (Cui et al.
2025, arXiv 2505.22617) shows that for a softmax policy one step changing the logits by
z' - z changes the entropy by about -Cov_{a~pi}(log pi(a), z'_a - z_a); for natural policy
gradient (z' - z = eta * A) that is -eta * Cov(log pi, A). Tokens with a large positive
covariance between log-prob and advantage are what collapses the entropy, so the paper
restrains the updates of a few of them:

- Clip-Cov (`clip_cov`): PPO clip, but a few tokens chosen at random among those with
  cov_lower < cov < cov_upper (and not already clipped by PPO) get zero loss and gradient;
- KL-Cov (`kl_cov`): no ratio clipping; the top-k tokens by covariance get an extra
  kl_coef * |log pi - log pi_old| penalty.

The rules follow the authors' code (PRIME-RL/Entropy-Mechanism-of-RL,
`verl/trainer/ppo/core_algos.py`, `compute_policy_loss_clip_cov` and
`compute_policy_loss_kl_cov`).

Not row-local: unlike the other rljax objectives, these two are not row-local. The covariance
means (of A and of log pi over the valid tokens) and the token count N that sets how many
tokens are selected are taken over all the rows the objective sees, i.e. over the micro-batch
when the train step splits a batch, exactly as in the authors' code, which runs per
micro-batch. The result therefore depends on how the batch is split.

Randomness: objectives get no PRNG key, so `clip_cov` reads uniform(0, 1) numbers from
`batch.extras["cov_noise"]` ([B, T]), written by the `covariance_noise` transform, and picks
the candidates with the smallest noise: a uniformly random subset without replacement, like
the authors' `torch.randperm`. Interpretation: the noise is drawn once per batch, so in a
multi-epoch update a token keeps its noise from one epoch to the next.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.core import keys
from rljax.core.aggregation import check_aggregation_mode, masked_mean
from rljax.core.batch import Batch
from rljax.core.objective import Objective
from rljax.core.transform import Context, Transform, stateless
from rljax.objectives.policy_gradient import PGInputs, clipped_surrogate, policy_gradient_objective

NOISE_KEY = "cov_noise"


def token_covariance(logprobs: jax.Array, advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-token covariance terms between log-prob and advantage (Cui et al., arXiv 2505.22617).

    cov_i = (A_i - mean A) * (log pi_i - mean log pi), both means over the valid (mask) tokens
    of the whole [B, T] array (all rows together, not per row). Differentiable in `logprobs`;
    the objectives pass stop-gradient log-probs, as the authors' code detaches them.

    Args:
      logprobs: [B, T] log-probs of the sampled tokens.
      advantages: [B, T] token advantages.
      mask: [B, T] bool, the valid tokens.

    Returns:
      [B, T] cov_i on valid tokens, 0 on invalid ones (all 0 for an empty mask).
    """
    chex.assert_rank(logprobs, 2)
    chex.assert_equal_shape([logprobs, advantages, mask])
    mask = mask.astype(bool)
    logprobs = logprobs.astype(jnp.float32)
    advantages = advantages.astype(jnp.float32)
    centred_adv = advantages - masked_mean(advantages, mask)
    centred_logp = logprobs - masked_mean(logprobs, mask)
    return jnp.where(mask, centred_adv * centred_logp, 0.0)


def logprob_advantage_covariance(
    logprobs: jax.Array, advantages: jax.Array, mask: jax.Array
) -> jax.Array:
    """Sample estimate of Cov(log pi, A): the token mean of `token_covariance` over valid tokens.

    Cui et al.'s first-order law ("The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models", arXiv 2505.22617): one natural-policy-gradient step of size
    eta changes the entropy by about -eta * Cov(log pi, A), so minus this value predicts the
    direction of the entropy change (positive covariance: entropy falls). This is the
    (biased, divide-by-N) sample covariance over the valid tokens of all rows.

    Args:
      logprobs: [B, T] log-probs of the sampled tokens.
      advantages: [B, T] token advantages.
      mask: [B, T] bool, the valid tokens.

    Returns:
      A float32 scalar; 0 for an empty mask.
    """
    cov = token_covariance(logprobs, advantages, mask)
    return masked_mean(cov, mask.astype(bool))


def covariance_noise() -> Transform:
    """Writes `batch.extras["cov_noise"]`: [B, T] uniform(0, 1) numbers for `clip_cov`.

    `clip_cov` selects its random subset of candidate tokens by the smallest noise, which
    stands in for the authors' `torch.randperm` (Cui et al., arXiv 2505.22617). Put this
    transform anywhere in the transform chain before the update.

    Returns:
      A stateless `Transform`; noise = jax.random.uniform(ctx.rng, completion shape). No metrics.
    """

    def fn(batch: Batch, ctx: Context):
        noise = jax.random.uniform(ctx.rng, batch.completion_mask.shape, jnp.float32)
        return batch.replace(extras={**batch.extras, NOISE_KEY: noise}), {}

    return stateless(fn, {keys.COMPLETION_MASK}, {keys.COV_NOISE})


def _count_table(ratio: float, n_max: int) -> jax.Array:
    """[n_max + 1] int32: max(int(ratio * n), 1) for n = 0..n_max, in float64 on the host.

    The count is looked up by the traced number of valid tokens, so it matches the authors'
    Python arithmetic exactly (a float32 product would be off by one where ratio * n falls
    next to an integer). The table has B*T + 1 entries, far smaller than the logits.
    """
    n = np.arange(n_max + 1, dtype=np.float64)
    return jnp.asarray(np.maximum(np.floor(ratio * n), 1).astype(np.int32))


def _rank(key: jax.Array) -> jax.Array:
    """[B, T] -> [B, T] int32: the rank of each entry of key in ascending order over all entries.

    Stable: ties are ranked by flat (row-major) index.
    """
    flat = key.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    ranks = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    return ranks.reshape(key.shape)


def _valid_tokens(batch: Batch, exclude_zero_weight: bool) -> jax.Array:
    valid = batch.completion_mask.astype(bool)
    if exclude_zero_weight:
        valid = valid & (batch.loss_weights > 0)
    return valid


def _check_ratio(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name}={value} must be in (0, 1]: it is a fraction of the valid tokens")


def clip_cov(
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    cov_lower: float = 1.0,
    cov_upper: float = 5.0,
    aggregation: str = "token-mean",
    max_len: int | None = None,
    exclude_zero_weight: bool = True,
) -> Objective:
    """Clip-Cov: PPO clip with a few random high-covariance tokens detached.

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617; rules from the authors' `compute_policy_loss_clip_cov`.

    Per token, with r = exp(clip(new_logprobs - old_logprobs, -20, 20)) and A the advantage,
    the loss is PPO's -min(r*A, clip(r, 1 - eps_low, 1 + eps_high)*A) (as
    `rljax.objectives.surrogate.ppo_clip`), except for the detached tokens, whose loss (and
    gradient) is 0. With cov = `token_covariance` of the stop-gradient new log-probs and A:
    - candidates: valid tokens not already clipped by PPO (clipped term strictly larger than
      the unclipped one) with cov_lower < cov < cov_upper;
    - count: max(int(clip_ratio * N), 1), N the number of valid tokens;
    - detached: the count candidates with the smallest `batch.extras["cov_noise"]` (all of
      them if there are fewer candidates), a uniform random subset.
    Covariance means and N are over all rows the objective sees (the micro-batch), so this
    objective is not row-local (see the module docstring). Detached tokens keep their weight
    in the aggregation, as in the authors' code (their loss is 0, not removed).

    Valid tokens (interpretation): `completion_mask` tokens with `loss_weights > 0` when
    `exclude_zero_weight` (a row a filter zeroed is treated as absent from the batch, as in
    verl where filtered rows are dropped); all `completion_mask` tokens otherwise.

    Metrics ("clip_cov/..."), token means over valid tokens: "loss" (the aggregated loss);
    "clip_frac" (PPO clip fraction); "detached_frac" (fraction detached by the covariance
    rule); "cov_mean" (`logprob_advantage_covariance`, the sample Cov(log pi, A)).

    Args:
      eps_low: lower clip range, r >= 1 - eps_low; in [0, 1).
      eps_high: upper clip range, r <= 1 + eps_high; >= 0.
      clip_ratio: fraction of valid tokens to detach, in (0, 1] (paper: 2e-4).
      cov_lower: candidates have cov > cov_lower (paper: 1.0).
      cov_upper: candidates have cov < cov_upper (paper: 5.0); > cov_lower.
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".
      exclude_zero_weight: leave zero-weight tokens out of the valid tokens (see above).

    Returns:
      An `Objective`; it reads `batch.extras["cov_noise"]` (add `covariance_noise()` to the
      transform chain).

    Raises:
      ValueError: for out-of-range parameters or an invalid aggregation (at construction),
        or a missing / mis-shaped `cov_noise` (at trace time).
    """
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1) so that 1 - eps_low > 0")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    _check_ratio("clip_ratio", clip_ratio)
    if not cov_lower < cov_upper:
        raise ValueError(
            f"cov_lower={cov_lower} must be < cov_upper={cov_upper}: candidates have "
            "cov_lower < cov < cov_upper"
        )
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg: PGInputs):
        batch, new_logprobs = pg.batch, pg.logprobs
        chex.assert_equal_shape([new_logprobs, batch.old_logprobs, batch.advantages])
        noise = batch.extras.get(NOISE_KEY)
        if noise is None:
            raise ValueError(
                f"clip_cov reads batch.extras[{NOISE_KEY!r}] ([B, T] uniform noise) to pick its "
                "random tokens; add rljax.entropy.covariance.covariance_noise() to the "
                "transform chain"
            )
        if noise.shape != new_logprobs.shape:
            raise ValueError(
                f"batch.extras[{NOISE_KEY!r}] has shape {noise.shape}, expected the completion "
                f"shape {new_logprobs.shape}"
            )
        adv = pg.advantages
        per_token, is_clipped = clipped_surrogate(pg.ratio, adv, eps_low, eps_high)
        valid = _valid_tokens(batch, exclude_zero_weight)
        ppo_clipped = is_clipped & valid
        cov = token_covariance(jax.lax.stop_gradient(new_logprobs), adv, valid)
        candidate = valid & ~ppo_clipped & (cov > cov_lower) & (cov < cov_upper)
        count = _count_table(clip_ratio, valid.size)[valid.sum()]
        key = jnp.where(candidate, jax.lax.stop_gradient(noise), jnp.inf)
        detached = candidate & (_rank(key) < count)

        def mean(x):
            return masked_mean(x.astype(jnp.float32), valid)

        metrics = {
            "clip_cov/clip_frac": mean(ppo_clipped),
            "clip_cov/detached_frac": mean(detached),
            "clip_cov/cov_mean": mean(cov),
        }
        return jnp.where(detached, 0.0, per_token), metrics

    return policy_gradient_objective(
        "clip_cov",
        surrogate,
        aggregation,
        max_len,
        ratio_metrics=(),
        reads={keys.COV_NOISE},
        name="clip_cov",
    )


def kl_cov(
    kl_coef: float = 1.0,
    k_ratio: float = 2e-3,
    aggregation: str = "token-mean",
    max_len: int | None = None,
    exclude_zero_weight: bool = True,
) -> Objective:
    """KL-Cov: unclipped policy gradient with a |log-ratio| penalty on the top-covariance tokens.

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617; rules from the authors' `compute_policy_loss_kl_cov`.

    No ratio clipping at all. Per valid token, with r = exp(clip(log_ratio, -20, 20)) and
    log_ratio = new_logprobs - old_logprobs:
      loss_i = -A_i * r_i                                  for most tokens,
      loss_i = -A_i * r_i + kl_coef * |log_ratio_i|        for the selected ones,
    the selected tokens being the top max(1, int(k_ratio * N)) valid tokens by
    cov = `token_covariance` of the stop-gradient new log-probs and A (N valid tokens; ties
    go to the lower flat index). The |log_ratio| term is not clamped. Covariance means and N
    are over all the rows the objective sees (the micro-batch), so this objective is not
    row-local (see the module docstring).

    Units: the authors' `k_percent` is a percentage (their code divides by 100): their
    default k_percent=0.2 means 0.2% = k_ratio 2e-3 (their 32B run: 0.02% = 2e-4).

    Valid tokens (interpretation): as `clip_cov` (`exclude_zero_weight`).

    Metrics ("kl_cov/..."): "loss"; "selected_frac" (fraction of valid tokens selected);
    "cov_mean" (`logprob_advantage_covariance` over valid tokens); "abs_log_ratio" (mean
    |log_ratio| over the selected tokens, 0 if none).

    Args:
      kl_coef: weight of the |log-ratio| penalty, >= 0 (the authors' ppo_kl_coef = 1).
      k_ratio: fraction of valid tokens penalised, in (0, 1] (paper: 2e-3).
      aggregation: loss aggregation mode (see `rljax.core.aggregation.aggregate`).
      max_len: normaliser for "seq-mean-token-sum-norm".
      exclude_zero_weight: leave zero-weight tokens out of the valid tokens.

    Returns:
      An `Objective`.

    Raises:
      ValueError: for out-of-range parameters or an invalid aggregation.
    """
    if kl_coef < 0.0:
        raise ValueError(f"kl_coef={kl_coef} must be >= 0 (it weighs a penalty)")
    _check_ratio("k_ratio", k_ratio)
    check_aggregation_mode(aggregation, max_len)

    def surrogate(pg: PGInputs):
        batch, new_logprobs, adv = pg.batch, pg.logprobs, pg.advantages
        chex.assert_equal_shape([new_logprobs, batch.old_logprobs, adv])
        # The penalty is on the raw |log ratio|; the policy-gradient term on the clamped ratio.
        abs_log_ratio = jnp.abs(new_logprobs - batch.old_logprobs)
        pg_term = -adv * pg.ratio
        valid = _valid_tokens(batch, exclude_zero_weight)
        cov = token_covariance(jax.lax.stop_gradient(new_logprobs), adv, valid)
        count = _count_table(k_ratio, valid.size)[valid.sum()]
        key = jnp.where(valid, -cov, jnp.inf)
        selected = valid & (_rank(key) < count)
        per_token = jnp.where(selected, pg_term + kl_coef * abs_log_ratio, pg_term)
        metrics = {
            "kl_cov/selected_frac": masked_mean(selected.astype(jnp.float32), valid),
            "kl_cov/cov_mean": masked_mean(cov, valid),
            "kl_cov/abs_log_ratio": masked_mean(jax.lax.stop_gradient(abs_log_ratio), selected),
        }
        return per_token, metrics

    return policy_gradient_objective("kl_cov", surrogate, aggregation, max_len, ratio_metrics=())
