"""The 80/20 rule: train the policy-gradient term only on the batch's highest-entropy tokens.

Wang et al. 2025 ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", arXiv 2506.01939) find that the ~20% of tokens
where the policy is most uncertain ("forking" tokens) carry the useful RLVR gradient, and that
updating only them matches or beats updating all. TRL's `top_entropy_quantile` is the same
rule.
"""

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.batch import Batch
from rljax.core.keys import declare_objective
from rljax.core.objective import Objective
from rljax.quant.mismatch import IS_WEIGHT_KEY


def _threshold(entropy: jax.Array, mask: jax.Array, fraction: float) -> jax.Array:
    """The (1 - fraction) quantile of the valid tokens' entropies (linear interpolation, as
    torch.quantile in TRL); NaN when no token is valid."""
    return jnp.nanquantile(jnp.where(mask, entropy.astype(jnp.float32), jnp.nan), 1.0 - fraction)


def high_entropy_mask(entropy: jax.Array, mask: jax.Array, fraction: float) -> jax.Array:
    """[B, T] bool: the valid tokens whose entropy is at least the (1 - fraction) quantile of
    the valid tokens' entropies, so about `fraction` of them. No valid token: all False."""
    return mask & (entropy >= _threshold(entropy, mask, fraction))


def high_entropy_tokens(objective: Objective, fraction: float = 0.2) -> Objective:
    """`objective` with its policy-gradient term restricted to the top-`fraction` entropy tokens.

    Per call (each minibatch), the tokens are ranked by the current policy's entropy
    (`new_entropy`, stop-gradient) among `batch.completion_mask` tokens; the others get a
    per-token weight of 0 through `batch.extras["is_weight"]` (multiplied into an existing
    rollout-correction weight), which every policy-gradient objective applies before
    aggregation. They stay in the aggregation's count: the loss is the masked tokens' terms
    over all tokens, as TRL's `per_token_loss * entropy_mask`. The KL loss and the entropy
    bonus of a preset keep every token (TRL masks its KL term as well).

    Metrics: "entropy_mask/kept_frac" (of valid tokens) and "entropy_mask/threshold".

    Args:
      objective: an objective that applies `extras["is_weight"]` (declares it as an optional
        read: the policy-gradient objectives and their sums with regularisers).
      fraction: the share of tokens trained on, in (0, 1]; the paper's 0.2.

    Returns:
      An `Objective` with `objective`'s declared reads.

    Raises:
      ValueError: for a fraction outside (0, 1], or an objective that does not apply the
        per-token weight.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction} must be in (0, 1] (0.2: the top 20% of tokens)")
    if keys.IS_WEIGHT not in getattr(objective, "optional_reads", frozenset()):
        raise ValueError(
            f"{keys.describe(objective)} does not apply extras['is_weight'], so it cannot be "
            "restricted to high-entropy tokens; use a policy-gradient objective"
        )

    def masked(new_logprobs: jax.Array, new_entropy: jax.Array, batch: Batch):
        valid = batch.completion_mask
        entropy = jax.lax.stop_gradient(new_entropy)
        threshold = _threshold(entropy, valid, fraction)  # once: it sorts the batch
        keep = valid & (entropy >= threshold)
        weight = keep.astype(jnp.float32)
        previous = batch.extras.get(IS_WEIGHT_KEY)
        if previous is not None:
            weight = weight * previous
        batch = batch.replace(extras={**batch.extras, IS_WEIGHT_KEY: weight})
        loss, metrics = objective(new_logprobs, new_entropy, batch)
        n = jnp.maximum(valid.sum(), 1)
        metrics = {
            **metrics,
            "entropy_mask/kept_frac": keep.sum() / n,
            "entropy_mask/threshold": threshold,
        }
        return loss, metrics

    return declare_objective(
        masked, objective.reads, objective.optional_reads, keys.describe(objective)
    )
