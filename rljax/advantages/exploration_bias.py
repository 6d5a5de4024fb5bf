"""EDO: exploration-driven reward biasing toward responses the policy finds unlikely (ED-GRPO).

"Exploration-Driven Optimization" (EDO; the ED-GRPO variant). Only the abstract is available
("extends reward-biasing style exploration objectives to iterative post-training"); the bonus
below, -coef times the response's log-probability, is an interpretation.
"""

import chex
import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.batch import Batch, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform, stateless

_SOURCES = ("old", "ref")


def sequence_logprob(
    logprobs: jax.Array, mask: jax.Array, length_normalize: bool = True
) -> jax.Array:
    """[B, T] token log-probs -> [B] response log-prob over the valid tokens.

    Args:
      logprobs: [B, T] log-probs of the sampled tokens.
      mask: [B, T] bool, the valid (completion) tokens.
      length_normalize: mean over the valid tokens (a per-token log-prob, comparable across
        lengths); False gives the sum, log pi(y).

    Returns:
      [B] sequence log-probs; 0 for a row with no valid token.
    """
    chex.assert_rank(logprobs, 2)
    chex.assert_equal_shape([logprobs, mask])
    total = jnp.where(mask, logprobs, 0.0).sum(axis=1)  # over the row's valid tokens
    if not length_normalize:
        return total
    return total / jnp.maximum(mask.sum(axis=1), 1).astype(total.dtype)


def exploration_biased_rewards(
    rewards: jax.Array, seq_logprob: jax.Array, coef: float | jax.Array
) -> jax.Array:
    """Reward biased toward under-explored responses: r_tilde = r - coef * log pi(y).

    Since log pi(y) <= 0, the bonus -coef * log pi(y) >= 0 grows as the policy finds the
    response less likely, a reward-biasing exploration objective ("Exploration-Driven
    Optimization", EDO / ED-GRPO; the exact form is an interpretation of the abstract). Fed
    to group-relative advantages it ranks solutions of equal reward by novelty.

    Args:
      rewards: [B] sequence rewards.
      seq_logprob: [B] sequence log-probs (length-normalised by default in
        `exploration_bias`, see `sequence_logprob`).
      coef: bonus coefficient (>= 0 for exploration).

    Returns:
      [B] biased rewards.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, seq_logprob])
    return rewards - coef * seq_logprob


def exploration_bias(
    coef: float,
    source: str = "old",
    length_normalize: bool = True,
    only_correct: bool = False,
    correct_threshold: float = 1.0,
) -> Transform:
    """Transform adding EDO's exploration bonus to `batch.rewards` (ED-GRPO).

    "Exploration-Driven Optimization" (EDO), interpretation. The sequence log-prob comes
    from `batch.old_logprobs` (source="old", the pre-update policy: novelty to the current
    policy) or `batch.ref_logprobs` (source="ref": novelty to the reference), over
    `batch.completion_mask`. With `only_correct`, the bonus is paid only to responses with
    reward >= `correct_threshold`, so it ranks correct solutions by novelty without
    rewarding wrong ones. Put it before a GRPO advantage transform (e.g. `group_advantages`)
    in a chain; it writes rewards, not advantages. A fully masked row gets no bonus.

    Args:
      coef: bonus coefficient (>= 0).
      source: "old" or "ref", which log-probs measure novelty.
      length_normalize: use the per-token mean log-prob (default) rather than the sum.
      only_correct: pay the bonus only to correct responses.
      correct_threshold: reward at or above which a response is correct.

    Returns:
      A stateless `Transform`. Metrics: "edo/bonus_mean" (mean bonus over the B samples)
      and "edo/seq_logprob_mean" (mean sequence log-prob over rows with a valid token).

    Raises:
      ValueError: at construction for coef < 0 or an unknown source; at apply if rewards
        are not [B].
    """
    if not coef >= 0:
        raise ValueError(
            f"coef={coef} must be >= 0: a negative coef rewards likely responses, the "
            "opposite of exploration"
        )
    if source not in _SOURCES:
        raise ValueError(f"source={source!r} must be one of {list(_SOURCES)}")

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "exploration_bias")
        mask = batch.completion_mask
        logprobs = batch.old_logprobs if source == "old" else batch.ref_logprobs
        seq_lp = sequence_logprob(logprobs, mask, length_normalize)
        rewards = batch.rewards
        biased = exploration_biased_rewards(rewards, seq_lp, coef)
        if only_correct:
            biased = jnp.where(rewards >= correct_threshold, biased, rewards)
        has_token = mask.any(axis=1)
        n = jnp.maximum(has_token.sum(), 1).astype(seq_lp.dtype)
        metrics = {
            "edo/bonus_mean": (biased - rewards).mean(),  # over the B samples
            "edo/seq_logprob_mean": jnp.where(has_token, seq_lp, 0.0).sum() / n,
        }
        return batch.replace(rewards=biased.astype(rewards.dtype)), metrics

    logprobs_key = keys.OLD_LOGPROBS if source == "old" else keys.REF_LOGPROBS
    reads = {keys.REWARDS, keys.COMPLETION_MASK, logprobs_key}
    return stateless(fn, reads, {keys.REWARDS})
