"""Generalised advantage estimation (GAE) over completion tokens, from a learned critic."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.group import masked_stats
from rljax.core import keys
from rljax.core.batch import Batch, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform, stateless
from rljax.objectives.kl import kl_penalty

VALUES_KEY = "old_values"
RETURNS_KEY = "returns"
# Optional [B, T] per-token rewards from the host (e.g. code execution outcomes mapped to the
# tokens that caused them, `rljax.rewards.code.token_level_rewards`); they replace the
# sequence reward on the last token.
TOKEN_REWARDS_KEY = "token_rewards"


def last_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """[B] sequence rewards placed on each row's last valid token, [B, T]; 0 for an empty row."""
    chex.assert_rank([rewards, mask], [1, 2])
    t = mask.shape[1]
    last = jnp.max(jnp.where(mask, jnp.arange(t)[None, :], -1), axis=1)
    return jnp.where(jnp.arange(t)[None, :] == last[:, None], rewards[:, None], 0.0)


def gae(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[jax.Array, jax.Array]:
    """GAE(gamma, lambda) advantages and returns over the valid tokens of each row.

    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lambda A_{t+1}, where t+1
    is the next valid token and the value after a row's last valid token is 0 (the episode
    ends with the completion). Returns R_t = A_t + V_t are the critic's regression targets
    ("High-Dimensional Continuous Control Using Generalized Advantage Estimation", Schulman
    et al. 2016, arXiv 1506.02438). Masked tokens are skipped (they neither receive nor pass
    on credit) and get A = R = 0.

    Args:
      token_rewards: [B, T] per-token rewards.
      values: [B, T] V(s_t) of the states that produce each token.
      mask: [B, T] bool valid tokens.
      gamma: discount in [0, 1].
      lam: GAE lambda in [0, 1].

    Returns:
      advantages [B, T] and returns [B, T], float32.
    """
    chex.assert_rank([token_rewards, values, mask], 2)
    chex.assert_equal_shape([token_rewards, values, mask])
    _check_coefficients(gamma, lam)
    mask_f = mask.astype(jnp.float32)
    r = token_rewards.astype(jnp.float32) * mask_f
    v = values.astype(jnp.float32) * mask_f

    def step(carry, x):
        next_value, next_adv = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * next_value - v_t
        adv = delta + gamma * lam * next_adv
        # A masked token passes the carry through unchanged.
        carry = (jnp.where(m_t, v_t, next_value), jnp.where(m_t, adv, next_adv))
        return carry, jnp.where(m_t, adv, 0.0)

    zeros = jnp.zeros(r.shape[0], jnp.float32)
    _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, mask.T), reverse=True)
    adv = adv.T
    return adv, (adv + v) * mask_f


def _check_coefficients(gamma: float, lam: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam} must be in [0, 1]")


def _whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    n = jnp.maximum(mask.sum(), 1)
    mean = jnp.where(mask, x, 0.0).sum() / n
    var = jnp.where(mask, (x - mean) ** 2, 0.0).sum() / n
    return jnp.where(mask, (x - mean) * jax.lax.rsqrt(var + 1e-8), 0.0)


def gae_advantages(
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
    kl_coef: float = 0.0,
    kl_estimator: str = "k1",
) -> Transform:
    """Transform: PPO's token advantages from the critic's values (`batch.extras["old_values"]`).

    Token rewards are `batch.extras["token_rewards"]` when the batch has them (a task's
    token-level reward, `reward.token_level`), else the sequence reward on the last valid
    token; minus, when `kl_coef > 0`,
    kl_coef * KL(pi_old || ref) per token (the KL-in-reward of "Training language models to
    follow instructions with human feedback", Ouyang et al. 2022). GAE gives the advantages and
    the value targets `batch.extras["returns"]`; the advantages are then whitened over the
    batch's valid tokens (as verl and OpenRLHF do), the returns are not.

    Args:
      gamma: discount.
      lam: GAE lambda.
      whiten: normalise advantages to zero mean, unit variance over valid tokens.
      kl_coef: per-token KL penalty coefficient in the reward.
      kl_estimator: estimator of that penalty (see `rljax.objectives.kl.kl_penalty`).

    Returns:
      A stateless `Transform`. Metrics: "gae/advantages/{mean,std,min,max}" (before
      whitening), "gae/returns_mean", "gae/values_mean" and "gae/explained_variance"
      (1 - Var(R - V)/Var(R) over valid tokens: how much of the return the critic predicts).

    Raises:
      ValueError: for gamma or lam outside [0, 1]; at apply if rewards are not [B] or the
        batch lacks the critic's values (the algorithm needs a critic: see `rljax.algorithms.ppo`).
    """
    _check_coefficients(gamma, lam)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "gae_advantages")
        if VALUES_KEY not in batch.extras:
            raise ValueError(
                f"gae_advantages needs the critic's values in batch.extras[{VALUES_KEY!r}]; "
                "train with a critic (an algorithm with a value_loss, e.g. rljax.algorithms.ppo)"
            )
        mask = batch.completion_mask
        values = batch.extras[VALUES_KEY]
        if TOKEN_REWARDS_KEY in batch.extras:
            rewards = jnp.where(mask, batch.extras[TOKEN_REWARDS_KEY], 0.0)
        else:
            rewards = last_token_rewards(batch.rewards, mask)
        if kl_coef:
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, kl_estimator)
            rewards = rewards - kl_coef * jnp.where(mask, kl, 0.0)
        adv, returns = gae(rewards, values, mask, gamma, lam)
        metrics = masked_stats(adv, mask, "gae/advantages")
        n = jnp.maximum(mask.sum(), 1)
        mean_r = jnp.where(mask, returns, 0.0).sum() / n
        var_r = jnp.where(mask, (returns - mean_r) ** 2, 0.0).sum() / n
        err = returns - values
        mean_e = jnp.where(mask, err, 0.0).sum() / n
        var_e = jnp.where(mask, (err - mean_e) ** 2, 0.0).sum() / n
        metrics.update(
            {
                "gae/returns_mean": mean_r,
                "gae/values_mean": jnp.where(mask, values, 0.0).sum() / n,
                "gae/explained_variance": jnp.where(var_r > 0, 1.0 - var_e / var_r, 0.0),
            }
        )
        if whiten:
            adv = _whiten(adv, mask)
        extras = {**batch.extras, RETURNS_KEY: returns}
        return batch.replace(advantages=adv, extras=extras), metrics

    reads = {keys.REWARDS, keys.COMPLETION_MASK, keys.extra(VALUES_KEY)}
    if kl_coef:
        reads |= {keys.OLD_LOGPROBS, keys.REF_LOGPROBS}
    writes = {keys.ADVANTAGES, keys.extra(RETURNS_KEY)}
    return stateless(fn, reads, writes, {keys.extra(TOKEN_REWARDS_KEY)})
