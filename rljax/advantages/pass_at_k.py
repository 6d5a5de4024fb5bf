"""Pass@k group advantages for binary rewards, in closed form."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.sequence import sequence_advantages
from rljax.core.batch import Batch
from rljax.core.transform import Metrics, Transform


def _check_sizes(group_size: int, k: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: pass@k advantages compare the samples of a prompt and "
            "need at least 2 of them; sample G >= 2 completions per prompt"
        )
    if not 1 <= k <= group_size:
        raise ValueError(
            f"k={k} must satisfy 1 <= k <= group_size={group_size}: pass@k is estimated from "
            "k-subsets of the group"
        )


def _check_binary(rewards: jax.Array) -> None:
    if isinstance(rewards, jax.core.Tracer):
        return
    r = np.asarray(rewards)
    bad = np.flatnonzero((r != 0) & (r != 1))
    if bad.size:
        raise ValueError(
            f"pass@k advantages need binary rewards in {{0, 1}}; sample {bad[0]} has reward "
            f"{r[bad[0]]} ({bad.size} non-binary in all); threshold the verifier score first"
        )


def _ratio_of_binomials(top: jax.Array, bottom: int, k: int) -> jax.Array:
    """C(top, k) / C(bottom, k) = prod_{j<k} (top - j) / (bottom - j), for integer top.

    0 when top < k (also for negative top), 1 when k = 0.
    """
    j = jnp.arange(k, dtype=jnp.float32)
    factors = jnp.maximum(top[..., None] - j, 0.0) / (bottom - j)
    return jnp.prod(factors, axis=-1)


def _fail_probability(correct: jax.Array, k: int) -> jax.Array:
    """1 - R = C(n - c, k) / C(n, k) per group ([B/G, 1]), exactly 1 if c = 0 and 0 if n - c < k.

    The exact ends are set by integer conditions: under `jit` XLA may compute
    (n - j) / (n - j) as 1 - 1ulp, which would leave all-wrong groups a residue.
    """
    n = correct.shape[-1]
    c = correct.sum(axis=-1, keepdims=True)
    ratio = _ratio_of_binomials((n - c).astype(jnp.float32), n, k)
    return jnp.where(c == 0, 1.0, jnp.where(n - c < k, 0.0, ratio))


def pass_at_k_values(rewards: jax.Array, group_size: int, k: int) -> jax.Array:
    """Per-group pass@k: R = 1 - C(n - c, k) / C(n, k), c correct among the n = G samples.

    The mean over all k-subsets of the group of max(rewards in the subset), which
    is also the unbiased pass@k estimator of "Evaluating Large Language Models
    Trained on Code" (Chen et al. 2021, arXiv 2107.03374).

    Args:
      rewards: [B] binary rewards, laid out as B/G contiguous groups.
      group_size: n = G, samples per prompt (>= 2).
      k: subset size, 1 <= k <= G.

    Returns:
      [B/G] pass@k values.

    Raises:
      ValueError: as `pass_at_k_advantages`.
    """
    chex.assert_rank(rewards, 1)
    b = rewards.shape[0]
    _check_sizes(group_size, k)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    _check_binary(rewards)
    correct = rewards.reshape(b // group_size, group_size) == 1
    return 1.0 - _fail_probability(correct, k)[:, 0]


def pass_at_k_advantages(rewards: jax.Array, group_size: int, k: int) -> jax.Array:
    """Analytical pass@k advantages for binary rewards.

    From "Pass@k Training for Adaptively Balancing Exploration and Exploitation
    of Large Reasoning Models" (Chen et al. 2025). Split the group of n = G samples
    (c correct) into all C(n, k) subsets of size k, each rewarded 1 if it holds a
    correct sample. The group value is R = 1 - C(n-c, k)/C(n, k), the subset
    rewards have std sigma = sqrt(R (1 - R)), and a sample's advantage is the mean
    reward of the subsets containing it, minus R, over sigma:

      correct:   A = (1 - R) / sigma
      incorrect: A = (1 - R - C(n-c-1, k-1) / C(n-1, k-1)) / sigma

    Since C(n-c, k)/C(n, k) = (n-c)/n * C(n-c-1, k-1)/C(n-1, k-1), the incorrect
    advantage equals -c/(n-c) times the correct one: the advantages sum to 0 in
    the group. k = 1 gives GRPO with the population std. A group where sigma = 0
    gets exactly 0: all wrong (c = 0), all right, or more generally fewer than k
    wrong samples (n - c < k: every k-subset passes, so there is nothing to
    prefer). 1 - R is computed directly as the binomial ratio, not as 1 - (1 - x).

    A sample counts as correct iff its reward is exactly 1. The check that rewards
    are binary runs only on concrete arrays; under `jit` non-binary rewards are
    not detected here (the transform reports "pass_at_k/nonbinary_frac").

    Args:
      rewards: [B] binary rewards in {0, 1}, laid out as B/G contiguous groups.
      group_size: n = G, samples per prompt (>= 2).
      k: subset size, 1 <= k <= G.

    Returns:
      [B] advantages.

    Raises:
      ValueError: if G < 2, k is not in [1, G], G does not divide B, or (on
        concrete inputs) a reward is not 0 or 1.
    """
    chex.assert_rank(rewards, 1)
    b = rewards.shape[0]
    _check_sizes(group_size, k)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    _check_binary(rewards)
    n = group_size
    correct = rewards.reshape(b // n, n) == 1
    c = correct.sum(axis=1, keepdims=True)
    fail_all = _fail_probability(correct, k)  # 1 - R
    # Probability that a k-subset containing incorrect sample i holds no correct sample.
    fail_with_i = _ratio_of_binomials((n - c - 1).astype(jnp.float32), n - 1, k - 1)
    sigma = jnp.sqrt(fail_all * (1.0 - fail_all))
    ok = (c > 0) & (n - c >= k) & (sigma > 0)
    safe_sigma = jnp.where(ok, sigma, 1.0)
    adv = jnp.where(correct, fail_all, fail_all - fail_with_i) / safe_sigma
    return jnp.where(ok, adv, 0.0).reshape(b)


def pass_at_k_group_advantages(group_size: int, k: int) -> Transform:
    """Transform writing `batch.advantages = pass_at_k_advantages(r)[:, None] * completion_mask`.

    Pass@k training ("Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", Chen et al. 2025), analytical form.

    Args:
      group_size: n = G, samples per prompt (>= 2).
      k: subset size, 1 <= k <= G.

    Returns:
      A stateless `Transform`. Metrics: "pass_at_k/advantages/{mean,std,min,max}"
      over valid (completion_mask) tokens, "pass_at_k/pass_at_k" (mean over
      groups of R), "pass_at_k/zero_signal_frac" (fraction of groups with
      sigma = 0) and "pass_at_k/nonbinary_frac" (fraction of rewards not in
      {0, 1}; they count as incorrect unless exactly 1).

    Raises:
      ValueError: at construction if G < 2 or k is not in [1, G]; at apply if
        rewards are not [B] or not binary (concrete only), or `batch.group_id`
        is not contiguous groups of G (see `check_groups`).
    """
    _check_sizes(group_size, k)

    def fn(rewards: jax.Array, batch: Batch) -> tuple[jax.Array, Metrics]:
        del batch
        adv = pass_at_k_advantages(rewards, group_size, k)
        values = pass_at_k_values(rewards, group_size, k)
        zero_signal = jnp.all(adv.reshape(-1, group_size) == 0, axis=1).astype(jnp.float32)
        nonbinary = ((rewards != 0) & (rewards != 1)).astype(jnp.float32)
        return adv, {
            "pass_at_k/pass_at_k": values.mean(),
            "pass_at_k/zero_signal_frac": jnp.mean(zero_signal),
            "pass_at_k/nonbinary_frac": jnp.mean(nonbinary),
        }

    return sequence_advantages(
        "pass_at_k_group_advantages", fn, group_size, prefix="pass_at_k", zero_std=False
    )
