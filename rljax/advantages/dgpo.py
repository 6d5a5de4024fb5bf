"""DGPO: entropy-gated, reference-deviation-weighted redistribution of a sequence advantage.

arXiv 2605.03327 ("DGPO"). Only the abstract and a summary ("softmax-based weighting to
preserve total credit mass") are available; the deviation, gate and weighting below are an
interpretation (spec section 5 [INTERP]).
"""

import math

import chex
import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.aggregation import masked_mean
from rljax.core.batch import Batch
from rljax.core.transform import Context, Metrics, Transform, stateless


def _check_settings(vocab_size: int, temperature: float) -> None:
    if vocab_size < 2:
        raise ValueError(
            f"vocab_size={vocab_size} must be >= 2: the entropy gate divides by log|V|"
        )
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (the softmax divides by it)")


def dgpo_token_weights(
    entropy: jax.Array,
    hellinger: jax.Array,
    mask: jax.Array,
    vocab_size: int,
    temperature: float = 1.0,
) -> jax.Array:
    """Per-token credit weights of DGPO, summing to the response length L in every row.

    With H_t the entropy of the pre-update policy at position t and d_t the squared
    Hellinger distance 1 - sum_v sqrt(pi_old(v|s_t) pi_ref(v|s_t)) to the reference, the gate
    is g_t = H_t / log|V| and the score s_t = sg(g_t d_t) (a constant: no gradient flows
    through the weights). The weights are w_t = L * softmax(s / temperature)_t, the softmax
    over the row's L valid tokens, and 0 on invalid tokens, so sum_t w_t = L: credit is only
    moved between tokens, never created (interpretation of arXiv 2605.03327, "DGPO"). Tokens
    where the policy is both uncertain and far from the reference get more credit; when
    pi_old = pi_ref every d_t = 0 and the weights are uniform (1). A zero-entropy token has the
    lowest possible score, so its weight is at most 1. A fully masked row gets all zeros.

    Args:
      entropy: [B, T] entropy H_t (nats) of the pre-update next-token distribution.
      hellinger: [B, T] squared Hellinger distance d_t in [0, 1] to the reference.
      mask: [B, T] bool, the valid (completion) tokens.
      vocab_size: |V|, for the gate's normaliser log|V| (>= 2).
      temperature: softmax temperature (> 0); large values flatten the weights to 1.

    Returns:
      [B, T] weights w_t >= 0 with sum_t w_t = L per row (over the valid tokens).

    Raises:
      ValueError: if vocab_size < 2 or temperature <= 0.
    """
    chex.assert_rank(entropy, 2)
    chex.assert_equal_shape([entropy, hellinger, mask])
    _check_settings(vocab_size, temperature)
    gate = entropy / math.log(vocab_size)
    score = jax.lax.stop_gradient(gate * hellinger) / temperature
    score = jnp.where(mask, score, 0.0)
    row_max = jnp.where(mask, score, -jnp.inf).max(axis=1, keepdims=True)  # over valid tokens
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)  # fully masked row
    e = jnp.where(mask, jnp.exp(score - row_max), 0.0)
    denom = e.sum(axis=1, keepdims=True)  # over the row's valid tokens
    length = mask.sum(axis=1, keepdims=True).astype(e.dtype)
    return jnp.where(mask, length * e / jnp.where(denom > 0, denom, 1.0), 0.0)


def deviation_gated_advantages(vocab_size: int, temperature: float = 1.0) -> Transform:
    """Transform redistributing each row's sequence advantage over its tokens (DGPO).

    arXiv 2605.03327 ("DGPO"), interpretation (spec section 5). Reads the pre-update
    statistics `batch.extras["old_entropy"]` and `batch.extras["old_ref_hellinger"]` ([B, T],
    written by the trainer's prepare step) and the sequence advantage A_seq of each row, read
    as the masked row mean of `batch.advantages`: put a GRPO advantage transform (e.g.
    `group_advantages`) before this one in the chain. Writes
    A_t = dgpo_token_weights(...)_t * A_seq, so sum_t A_t = L * A_seq and the loss should be
    PPO-clip with no KL term, as in the paper.

    Args:
      vocab_size: |V| of the policy (>= 2).
      temperature: softmax temperature of the weights (> 0).

    Returns:
      A stateless `Transform`. Metrics, over valid (completion_mask) tokens:
      "dgpo/hellinger_mean", "dgpo/gate_mean" (mean of H_t / log|V|) and "dgpo/weight_max"
      (0 when no token is valid).

    Raises:
      ValueError: at construction for vocab_size < 2 or temperature <= 0; at apply if the
        extras are missing or not [B, T].
    """
    _check_settings(vocab_size, temperature)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        mask = batch.completion_mask
        stats = {}
        for key in ("old_entropy", "old_ref_hellinger"):
            if key not in batch.extras:
                raise ValueError(
                    f"deviation_gated_advantages needs batch.extras[{key!r}] ([B, T], from the "
                    f"trainer's prepare step); extras has keys {sorted(batch.extras)}"
                )
            stats[key] = jnp.asarray(batch.extras[key], jnp.float32)
            if stats[key].shape != mask.shape:
                raise ValueError(
                    f"batch.extras[{key!r}] has shape {stats[key].shape}, expected [B, T] = "
                    f"{mask.shape}"
                )
        entropy, hellinger = stats["old_entropy"], stats["old_ref_hellinger"]
        weights = dgpo_token_weights(entropy, hellinger, mask, vocab_size, temperature)
        n = jnp.maximum(mask.sum(axis=1), 1).astype(jnp.float32)
        seq_adv = jnp.where(mask, batch.advantages, 0.0).sum(axis=1) / n  # over valid tokens
        token_adv = weights * seq_adv[:, None]
        metrics = {
            "dgpo/hellinger_mean": masked_mean(hellinger, mask),
            "dgpo/gate_mean": masked_mean(entropy / math.log(vocab_size), mask),
            "dgpo/weight_max": jnp.where(mask.any(), jnp.where(mask, weights, 0.0).max(), 0.0),
        }
        return batch.replace(advantages=token_adv), metrics

    reads = {keys.COMPLETION_MASK, keys.ADVANTAGES, keys.OLD_ENTROPY, keys.OLD_REF_HELLINGER}
    return stateless(fn, reads, {keys.ADVANTAGES})
