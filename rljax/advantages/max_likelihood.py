"""MaxRL: group advantages normalised by the group's mean reward, not its std."""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core.batch import Batch
from rljax.core.transform import Transform


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: MaxRL compares samples within groups of >= 2")


def max_likelihood_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """MaxRL sequence advantages (Maximum-Likelihood RL, Tajwar et al. 2026, arXiv
    2602.02710): A_i = (r_i - mean_g) / mean_g over the G samples of i's group, and 0 for a
    group whose mean reward is <= 0.

    With binary rewards and pass rate p, the gradient of log p (the likelihood of success)
    is E[(r - p) / p * grad log pi]: dividing by the mean, not the std, optimises the
    log-likelihood of a correct answer instead of the pass rate, so a prompt solved once in
    G weighs about G times one solved always (k successes give G/k - 1 to each success and
    -1 to each failure). prime-rl's `max_rl` computes the same; the rewards should be
    non-negative (canonically binary).

    Args:
      rewards: [B] rewards, laid out as B/G contiguous groups.
      group_size: G, samples per prompt (>= 2).

    Returns:
      [B] advantages.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank(rewards, 1)
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    r = rewards.astype(jnp.float32).reshape(b // group_size, group_size)
    mean = r.mean(axis=1, keepdims=True)
    signal = mean > 0
    adv = jnp.where(signal, (r - mean) / jnp.where(signal, mean, 1.0), 0.0)
    return adv.reshape(b)


def mean_normalized_advantages(group_size: int) -> Transform:
    """Transform writing `batch.advantages = max_likelihood_advantages(rewards)[:, None] *
    completion_mask`. Metrics: "maxrl/advantages/{mean,std,min,max}" over valid tokens and
    "maxrl/zero_std_frac".

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B] or
        `batch.group_id` is not contiguous groups of G.
    """
    _check_group_size(group_size)

    def fn(rewards: jax.Array, batch: Batch) -> jax.Array:
        del batch
        return max_likelihood_advantages(rewards, group_size)

    return sequence_advantages("mean_normalized_advantages", fn, group_size, prefix="maxrl")
