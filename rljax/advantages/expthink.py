"""ExpThink: tiered length rewards against each prompt's shortest correct answer so far, and
difficulty-adaptive group advantages.

"ExpThink" (arXiv 2605.07501). Only the abstract was available, so the rules here are an
interpretation (spec section 8, [INTERP]); every constant is a constructor argument.
"""

import chex
import jax
import jax.numpy as jnp

from rljax.advantages.sequence import sequence_advantages
from rljax.core import keys
from rljax.core.batch import Batch, check_sequence_rewards
from rljax.core.transform import Context, Metrics, Transform

PROMPT_ID_KEY = "prompt_id"
CORRECT_KEY = "correct"
# L*_q of a prompt that has no correct completion yet. The largest int32, so that the running
# `min` update needs no special case and every real length is <= it.
NO_LENGTH = jnp.iinfo(jnp.int32).max


def _check_reward_config(capacity: int, full_credit: float, discount: float) -> None:
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(
            f"capacity={capacity!r} must be a positive int: the number of distinct prompts "
            "(dataset size), one L* slot per prompt_id"
        )
    if not 0.0 <= discount <= full_credit:
        raise ValueError(
            f"discount={discount} and full_credit={full_credit} must satisfy 0 <= discount <= "
            "full_credit: a correct but longer-than-shortest answer earns at most full credit"
        )


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: difficulty-adaptive advantages compare the samples of a "
            "prompt and need at least 2 of them; sample G >= 2 completions per prompt"
        )


def _prompt_ids(batch: Batch, key: str) -> jax.Array:
    if key not in batch.extras:
        raise ValueError(
            f"expthink_rewards needs batch.extras[{key!r}]: the [B] int32 stable dataset index "
            f"of each sample's prompt, in [0, capacity); have the data pipeline put it there "
            f"(extras has keys {sorted(batch.extras)})"
        )
    ids = jnp.asarray(batch.extras[key])
    b = batch.rewards.shape[0]
    if ids.shape != (b,):
        raise ValueError(
            f"batch.extras[{key!r}] has shape {ids.shape}, expected [B] = ({b},): one prompt "
            "index per sample"
        )
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(
            f"batch.extras[{key!r}] has dtype {ids.dtype}, expected an integer dtype (int32 "
            "prompt indices)"
        )
    return ids.astype(jnp.int32)


def expthink_rewards(
    capacity: int,
    full_credit: float = 1.0,
    discount: float = 0.5,
    correct_threshold: float = 1.0,
) -> Transform:
    """Stateful transform replacing rewards by ExpThink's length tiers.

    Interpretation of "ExpThink" (arXiv 2605.07501, abstract only; spec section 8 [INTERP]).
    The state L* ([capacity] int32) holds, per prompt, the shortest correct completion length
    seen so far (`NO_LENGTH` = int32 max while none). For sample i of prompt q, with
    correct_i = (reward_i >= correct_threshold) and L_i = its completion_mask row sum:

      r_i = full_credit  if correct_i and L_i <= L*_q (or q has no L* yet),
            discount     if correct_i and L_i > L*_q,
            0            otherwise.

    The tiers use L* from before this batch; then L*_q <- min(L*_q, shortest correct L_i of
    this batch for q), so L* never increases. A correct row with no valid token (L_i = 0, a
    fully masked sample) is rewarded like any other but does not update L* (interpretation:
    an empty row is a dropped sample, not a zero-length answer).

    Prompt ids come from `batch.extras["prompt_id"]` ([B] int). Ids cannot be checked under
    `jit`: an id outside [0, capacity) reads as "no L* yet" (its correct samples get full
    credit) and is dropped from the update (`.at[].min(mode="drop")`); the metric
    "expthink/invalid_id_frac" counts them.

    Args:
      capacity: number of prompt slots (the dataset size), >= 1.
      full_credit: reward of a correct answer no longer than the shortest known one.
      discount: reward of a correct but longer answer (gamma), 0 <= discount <= full_credit.
      correct_threshold: a sample is correct when its reward is >= this.

    Returns:
      A `Transform` whose state is the [capacity] int32 L* array. It writes the tiered
      rewards to `batch.rewards` ([B] float32) and correctness to `batch.extras["correct"]`
      ([B] bool). Metrics (fractions over the B samples): "expthink/full_credit_frac",
      "expthink/discount_frac", "expthink/invalid_id_frac"; over the updated state:
      "expthink/known_prompts" (prompts with an L*) and "expthink/mean_shortest_len" (mean
      L* over them, 0 if none).

    Raises:
      ValueError: at construction if capacity < 1 or not 0 <= discount <= full_credit; at
        apply (trace time) if rewards are not [B] or extras["prompt_id"] is missing, not [B]
        or not integer.
    """
    _check_reward_config(capacity, full_credit, discount)

    def init() -> jax.Array:
        return jnp.full((capacity,), NO_LENGTH, jnp.int32)

    def apply(batch: Batch, state: jax.Array, ctx: Context) -> tuple[Batch, jax.Array, Metrics]:
        del ctx
        check_sequence_rewards(batch.rewards, "expthink_rewards")
        chex.assert_shape(state, (capacity,))
        ids = _prompt_ids(batch, PROMPT_ID_KEY)
        valid_id = (ids >= 0) & (ids < capacity)
        # An out-of-range id is sent to slot `capacity`: reads fill NO_LENGTH, writes drop.
        slot = jnp.where(valid_id, ids, capacity)
        shortest = state.at[slot].get(mode="fill", fill_value=NO_LENGTH)  # [B], L*_q before
        length = batch.completion_mask.sum(axis=1).astype(jnp.int32)  # [B], over tokens
        correct = batch.rewards >= correct_threshold
        full = correct & (length <= shortest)
        disc = correct & ~full
        rewards = jnp.where(full, full_credit, jnp.where(disc, discount, 0.0))
        candidate = jnp.where(correct & (length > 0), length, NO_LENGTH)
        new_state = state.at[slot].min(candidate, mode="drop")
        known = new_state != NO_LENGTH
        n_known = known.sum()
        mean_len = jnp.where(known, new_state, 0).astype(jnp.float32).sum() / jnp.maximum(
            n_known, 1
        )
        metrics = {
            "expthink/full_credit_frac": jnp.mean(full.astype(jnp.float32)),
            "expthink/discount_frac": jnp.mean(disc.astype(jnp.float32)),
            "expthink/invalid_id_frac": jnp.mean((~valid_id).astype(jnp.float32)),
            "expthink/known_prompts": n_known.astype(jnp.int32),
            "expthink/mean_shortest_len": mean_len,
        }
        batch = batch.replace(
            rewards=rewards.astype(jnp.float32),
            extras={**batch.extras, CORRECT_KEY: correct},
        )
        return batch, new_state, metrics

    reads = {keys.REWARDS, keys.COMPLETION_MASK, keys.extra(PROMPT_ID_KEY)}
    writes = {keys.REWARDS, keys.extra(CORRECT_KEY)}
    return Transform(init, apply, frozenset(reads), frozenset(writes))


def difficulty_adaptive_advantages(
    rewards: jax.Array, correct: jax.Array, group_size: int
) -> jax.Array:
    """ExpThink's difficulty-adaptive group advantages.

    A_i = (r_i - mean_g r) / max(c_g, 1), where mean_g and c_g (the number of correct samples)
    are taken over the G samples of i's group (interpretation of "ExpThink", arXiv
    2605.07501, spec section 8 [INTERP]). The step shrinks as more samples are correct, so
    hard prompts get larger updates. A group with c_g = 0 or with all-equal rewards gets
    exactly 0.

    Args:
      rewards: [B] sequence rewards, laid out as B/G contiguous groups.
      correct: [B] bool, which samples are correct.
      group_size: G, samples per prompt (>= 2).

    Returns:
      [B] float advantages.

    Raises:
      ValueError: if G < 2 or G does not divide B.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, correct])
    b = rewards.shape[0]
    _check_group_size(group_size)
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    r = rewards.reshape(b // group_size, group_size).astype(jnp.float32)
    c = correct.reshape(b // group_size, group_size).astype(jnp.float32).sum(axis=1, keepdims=True)
    constant = jnp.all(r == r[:, :1], axis=1, keepdims=True)
    centered = r - r.mean(axis=1, keepdims=True)
    adv = jnp.where(constant | (c == 0), 0.0, centered / jnp.maximum(c, 1.0))
    return adv.reshape(b)


def expthink_advantages(group_size: int) -> Transform:
    """Transform writing ExpThink's difficulty-adaptive advantages to `batch.advantages`.

    `batch.advantages = difficulty_adaptive_advantages(r, correct)[:, None] * completion_mask`
    ("ExpThink", arXiv 2605.07501, interpretation). Correctness is read from
    `batch.extras["correct"]` ([B] bool, written by `expthink_rewards`); without it a sample
    is correct when its reward is > 0 (for `expthink_rewards`' tiers both agree whenever
    discount > 0).

    Args:
      group_size: G, samples per prompt (>= 2).

    Returns:
      A stateless `Transform`. Metrics: "expthink/advantages/{mean,std,min,max}" over valid
      (completion_mask) tokens, "expthink/no_correct_frac" (fraction of groups with no
      correct sample, whose advantages are 0), "expthink/mean_correct" (mean c over groups)
      and "expthink/zero_std_frac" (fraction of groups with all-equal rewards).

    Raises:
      ValueError: at construction if G < 2; at apply if rewards are not [B], extras["correct"]
        is not [B], or `batch.group_id` is not contiguous groups of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(rewards: jax.Array, batch: Batch) -> tuple[jax.Array, Metrics]:
        if CORRECT_KEY in batch.extras:
            correct = jnp.asarray(batch.extras[CORRECT_KEY])
            if correct.shape != rewards.shape:
                raise ValueError(
                    f"batch.extras[{CORRECT_KEY!r}] has shape {correct.shape}, expected [B] = "
                    f"{rewards.shape}: one correctness flag per sample"
                )
            correct = correct.astype(bool)
        else:
            correct = rewards > 0
        adv = difficulty_adaptive_advantages(rewards, correct, group_size)
        c = correct.reshape(-1, group_size).sum(axis=1).astype(jnp.float32)
        return adv, {
            "expthink/no_correct_frac": jnp.mean((c == 0).astype(jnp.float32)),
            "expthink/mean_correct": jnp.mean(c),
        }

    return sequence_advantages(
        "expthink_advantages",
        fn,
        group_size,
        prefix="expthink",
        optional_reads={keys.extra(CORRECT_KEY)},
    )
