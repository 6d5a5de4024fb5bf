"""CUTS: constrained uniform top-k sampling, and the row rule of Mixed-CUTS.

CUTS (arXiv 2604.18493) samples the next token uniformly from a small set of high-confidence
candidates instead of following the policy's own probabilities, which flattens the model's
bias among plausible tokens while never leaving them. Mixed-CUTS decodes part of every GRPO
group with CUTS and the rest with standard sampling, to widen the reward spread (and so the
advantage signal) inside a group.

Interpretation (only the abstract and a summary were available):
- The candidate set is C_t = top-k(z) ∩ {i : p_i >= p_max / ratio}, with z the
  temperature-scaled logits, p = softmax(z) and ratio = e by default. In log space the second
  condition is z_i >= max(z) - log(ratio), so the temperature moves the threshold while the
  top-k part does not depend on it. Tokens tied with the k-th largest logit are all kept (as
  `SamplingParams.top_k` does). |C_t| = 1 is greedy decoding.
- Mixed-CUTS: in each group of n samples the FIRST round_half_up(n * fraction) rows use CUTS
  (fraction = 0.5 gives the paper's G/2).
- The training log-probs of CUTS rows come from the policy pi, not from the uniform
  distribution actually sampled from: `training_rollout_logprobs` puts pi's (temperature 1)
  log-probs on CUTS rows and the sampler's log-probs on the others.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp


def cuts_logprobs(scaled_logits: jax.Array, top_k: int, ratio: float = math.e) -> jax.Array:
    """Log-probabilities [..., V] of the uniform distribution over the CUTS candidate set.

    C_t = top-k(z) ∩ {p_i >= p_max / ratio} (arXiv 2604.18493; the exact rule is an
    interpretation, see the module docstring). Members get -log|C_t|, the rest -inf; the
    argmax is always a member, so C_t is never empty.

    Args:
      scaled_logits: [..., V] logits already divided by the temperature.
      top_k: size of the top-k part (>= 1); k >= V keeps every token.
      ratio: the probability floor is p_max / ratio (>= 1; inf disables the floor).

    Returns:
      [..., V] float32 log-probabilities.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1 for CUTS")
    if not ratio >= 1.0:
        raise ValueError(f"ratio={ratio} must be >= 1 (the floor is p_max / ratio)")
    z = scaled_logits.astype(jnp.float32)
    # log p_i - log p_max = z_i - max(z): the floor needs no softmax.
    keep = z - jnp.max(z, axis=-1, keepdims=True) >= -math.log(ratio)
    if top_k < z.shape[-1]:
        kth = jax.lax.top_k(z, top_k)[0][..., -1:]
        keep &= z >= kth
    size = jnp.sum(keep, axis=-1, keepdims=True).astype(jnp.float32)
    return jnp.where(keep, -jnp.log(size), -jnp.inf)


def num_cuts_samples(n_samples: int, fraction: float) -> int:
    """How many of a group's `n_samples` rows use CUTS: round_half_up(n_samples * fraction).

    Args:
      n_samples: group size G (>= 1).
      fraction: share of CUTS rows in [0, 1] (0.5 gives the paper's G/2).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples={n_samples} must be >= 1")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction={fraction} must be in [0, 1]")
    return math.floor(n_samples * fraction + 0.5)


def cuts_row_mask(n_prompts: int, n_samples: int, fraction: float) -> jax.Array:
    """Which rows of a rollout use CUTS: the first `num_cuts_samples` rows of every group.

    Rows are laid out as in `rljax.rollout.generate`: row r answers prompt r // n_samples and
    is sample r % n_samples of its group.

    Args:
      n_prompts: number of prompts B.
      n_samples: group size G.
      fraction: share of CUTS rows per group, in [0, 1].

    Returns:
      [B * G] bool.
    """
    n_cuts = num_cuts_samples(n_samples, fraction)
    return jnp.arange(n_prompts * n_samples) % n_samples < n_cuts


def training_rollout_logprobs(
    sampling_logprobs: jax.Array, policy_logprobs: jax.Array, cuts_rows: jax.Array | None
) -> jax.Array:
    """The rollout log-probs a trainer should use: pi's on CUTS rows, the sampler's elsewhere.

    The CUTS paper takes the training log-probs of CUTS rollouts from the policy pi, i.e.
    treats them as on-policy in the importance ratio; the uniform log-prob -log|C_t| they were
    actually drawn with would make rho = pi / mu meaningless. Standard rows keep the log-probs
    of the distribution they were sampled from.

    Args:
      sampling_logprobs: [N, T] log-probs under the distribution each row was sampled from.
      policy_logprobs: [N, T] log-probs under the unmodified policy (temperature 1).
      cuts_rows: [N] bool, True on CUTS rows; None means no CUTS rows.

    Returns:
      [N, T] float32.
    """
    chex.assert_equal_shape([sampling_logprobs, policy_logprobs])
    if cuts_rows is None:
        return jnp.asarray(sampling_logprobs, jnp.float32)
    cuts_rows = jnp.asarray(cuts_rows, bool)
    if cuts_rows.shape != sampling_logprobs.shape[:1]:
        raise ValueError(
            f"cuts_rows has shape {cuts_rows.shape}; expected ({sampling_logprobs.shape[0]},), "
            "one flag per rollout row"
        )
    return jnp.where(cuts_rows[:, None], policy_logprobs, sampling_logprobs).astype(jnp.float32)
