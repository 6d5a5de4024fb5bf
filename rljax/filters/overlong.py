"""DAPO's overlong handling: filter truncated samples, or punish length softly in the reward."""

from typing import Sequence

import chex
import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.batch import Batch, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform, stateless


def _eos_ids(eos_id: int | Sequence[int]) -> tuple[int, ...]:
    ids = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
    if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(
            f"eos_id={eos_id!r} must be a non-negative token id or a non-empty sequence of them"
        )
    return ids


def truncated_mask(
    completion_tokens: jax.Array, completion_mask: jax.Array, eos_id: int | Sequence[int]
) -> jax.Array:
    """Which completions were cut off by the generation budget.

    A row is truncated when its completion fills the whole budget (the last
    position is a valid token) and that last token is not an EOS token. A row
    that ends in EOS exactly at the budget is not truncated.

    Args:
      completion_tokens: [B, T] int completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens (through EOS).
      eos_id: the EOS token id, or a sequence of stop-token ids.

    Returns:
      [B] bool, True for truncated rows.
    """
    chex.assert_rank(completion_tokens, 2)
    chex.assert_equal_shape([completion_tokens, completion_mask])
    ids = jnp.asarray(_eos_ids(eos_id), completion_tokens.dtype)
    last = completion_tokens[:, -1]
    return completion_mask[:, -1] & ~jnp.isin(last, ids)


def overlong_filter(eos_id: int | Sequence[int]) -> Transform:
    """Zeroes `loss_weights` of truncated samples (DAPO's overlong filtering).

    DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale", arXiv 2503.14476) masks the loss of truncated samples: a sound
    reasoning cut off by the budget would otherwise be punished as wrong, which adds
    reward noise. Truncated rows are found by `truncated_mask`. The rows stay in the
    batch (static shape) with zero weight, so they drop out of every aggregation.

    Args:
      eos_id: the EOS token id, or a sequence of stop-token ids (e.g. a chat model's
        end-of-turn and end-of-text tokens).

    Returns:
      A stateless `Transform` editing `batch.loss_weights`. Metrics:
      "overlong_filter/truncated_frac", the fraction of rows filtered.

    Raises:
      ValueError: for an invalid `eos_id`.
    """
    ids = _eos_ids(eos_id)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        truncated = truncated_mask(batch.completion_tokens, batch.completion_mask, ids)
        keep = (~truncated)[:, None].astype(batch.loss_weights.dtype)
        metrics = {"overlong_filter/truncated_frac": truncated.astype(jnp.float32).mean()}
        return batch.replace(loss_weights=batch.loss_weights * keep), metrics

    reads = {keys.COMPLETION_TOKENS, keys.COMPLETION_MASK, keys.LOSS_WEIGHTS}
    return stateless(fn, reads, {keys.LOSS_WEIGHTS})


def soft_overlong_penalty(
    lengths: jax.Array, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> jax.Array:
    """DAPO's soft overlong punishment R_length(y) for response lengths L = |y|.

    From Yu et al. 2025 ("DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale", arXiv 2503.14476), with L_max = `max_len` and L_cache = `cache_len`:
      R_length =  0                              if L <= L_max - L_cache,
                  ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max,
                  -1                             if L > L_max;
    a linear ramp from 0 to -1 over the last L_cache tokens of the budget, times
    `penalty_factor` (verl's overlong_buffer.penalty_factor; 1 in the paper).

    Args:
      lengths: [B] response lengths (int or float).
      max_len: L_max, the length budget (> 0).
      cache_len: L_cache, the punishment buffer, 0 < L_cache <= L_max.
      penalty_factor: scale of the penalty (>= 0).

    Returns:
      [B] float32 penalties in [-penalty_factor, 0].
    """
    chex.assert_rank(lengths, 1)
    _check_lengths(max_len, cache_len, penalty_factor)
    length = lengths.astype(jnp.float32)
    expected = float(max_len - cache_len)
    ramp = (expected - length) / cache_len
    penalty = jnp.where(length <= expected, 0.0, jnp.where(length <= max_len, ramp, -1.0))
    return penalty_factor * penalty


def _check_lengths(max_len: int | None, cache_len: int, penalty_factor: float) -> None:
    if max_len is not None and max_len <= 0:
        raise ValueError(f"max_len={max_len} must be positive (the generation budget L_max)")
    if cache_len <= 0 or (max_len is not None and cache_len > max_len):
        raise ValueError(
            f"cache_len={cache_len} must be in (0, max_len={max_len}]: the punishment buffer "
            "L_cache is the last part of the budget"
        )
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor={penalty_factor} must be >= 0")


def overlong_punishment(
    cache_len: int, max_len: int | None = None, penalty_factor: float = 1.0
) -> Transform:
    """Adds DAPO's soft overlong punishment to `batch.rewards` (reward shaping).

    r_i += `soft_overlong_penalty`(L_i, L_max, L_cache), with L_i the response length
    `completion_mask[i].sum()` (EOS included) and L_max = `max_len`, by default the
    budget T of `completion_tokens` (DAPO: L_max = 20480 with L_cache = 4096, i.e.
    no penalty up to 16384 tokens). A truncated response has L = T, so with the
    default L_max it gets the full -1.

    Order in a chain: this changes rewards, so it must run before the advantage
    transform (e.g. `group_advantages`), whose advantages would otherwise ignore it;
    put `dynamic_sampling` before it to filter on the unshaped correctness reward,
    as DAPO does.

    Args:
      cache_len: L_cache, the punishment buffer (0 < L_cache <= L_max).
      max_len: L_max; None means T, the generation budget of the batch.
      penalty_factor: scale of the penalty (>= 0).

    Returns:
      A stateless `Transform` editing `batch.rewards` ([B] only). Metrics:
      "overlong_punishment/penalty_mean" (mean penalty added, <= 0) and
      "overlong_punishment/penalized_frac" (fraction of rows with a penalty).

    Raises:
      ValueError: at construction for out-of-range lengths; at apply for [B, K]
        rewards or a `cache_len` above T when `max_len` is None.
    """
    _check_lengths(max_len, cache_len, penalty_factor)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "overlong_punishment")
        l_max = batch.completion_mask.shape[1] if max_len is None else max_len
        lengths = batch.completion_mask.sum(axis=1)
        penalty = soft_overlong_penalty(lengths, l_max, cache_len, penalty_factor)
        metrics = {
            "overlong_punishment/penalty_mean": penalty.mean(),
            "overlong_punishment/penalized_frac": (penalty < 0).astype(jnp.float32).mean(),
        }
        rewards = batch.rewards + penalty.astype(batch.rewards.dtype)
        return batch.replace(rewards=rewards), metrics

    return stateless(fn, {keys.REWARDS, keys.COMPLETION_MASK}, {keys.REWARDS})
