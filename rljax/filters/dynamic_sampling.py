"""DAPO dynamic sampling: drop the groups whose rewards are all equal (no learning signal)."""

import chex
import jax.numpy as jnp
import numpy as np

from rljax.core import keys
from rljax.core.batch import Batch, check_groups
from rljax.core.transform import Context, Metrics, Transform, stateless


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: dynamic sampling needs at least 2 samples per prompt "
            "(a group of one always has equal rewards and would always be dropped)"
        )


def select_informative_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """Host-side: which groups have rewards that are not all equal.

    The driver uses it to refill a batch with informative groups, as DAPO does
    (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale", arXiv 2503.14476): over-sample prompts, keep the groups this returns
    True for, and sample more until the batch holds B/G of them. The refill loop
    itself is later work in `rljax.train.loop`; until then `dynamic_sampling`
    zeroes the loss weights of the dropped groups on device.

    Args:
      rewards: [B] (or [B, K]) numpy rewards, laid out as B/G contiguous groups; a
        [B, K] group is informative if any of its K dimensions varies. Pass the
        rewards the filter should look at (DAPO filters on accuracy, before any
        length shaping).
      group_size: G, samples per prompt (>= 2).

    Returns:
      [B/G] bool numpy array, True for groups whose rewards are not all equal
      (exact comparison, as `rljax.advantages.group.grpo_advantages`' zero-std test).

    Raises:
      ValueError: if G < 2, G does not divide B, or rewards are not [B] / [B, K].
    """
    rewards = np.asarray(rewards)
    _check_group_size(group_size)
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards has shape {rewards.shape}, expected [B] or [B, K]")
    b = rewards.shape[0]
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    groups = rewards.reshape(b // group_size, group_size, -1)
    return np.any(groups != groups[:, :1], axis=(1, 2))


def dynamic_sampling(group_size: int, reward_key: str | None = None) -> Transform:
    """Zeroes `loss_weights` of every group whose rewards are all equal (DAPO).

    DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM
    Reinforcement Learning System at Scale", arXiv 2503.14476) keeps only
    prompts with 0 < #correct < G: a group of all-equal rewards has zero
    group-relative advantage, so it adds nothing to the gradient but still dilutes
    a token-mean. This transform removes those groups from the loss on device (the
    batch keeps its static shape); refilling the batch with fresh informative groups
    is the driver's job (`select_informative_groups`, later work).

    Order in a chain: it only reads rewards and edits `loss_weights`, so it can sit
    before or after the advantage transform. DAPO (and verl's recipe, which filters
    on "acc") tests the correctness reward before length shaping: put it before
    `overlong_punishment`, or point `reward_key` at an unshaped copy in
    `batch.extras`.

    Args:
      group_size: G, samples per prompt (>= 2).
      reward_key: read `batch.extras[reward_key]` ([B] or [B, K]) instead of
        `batch.rewards`; None reads `batch.rewards`.

    Returns:
      A stateless `Transform`. Metrics: "dynamic_sampling/kept_frac", the fraction
      of groups kept (rewards not all equal).

    Raises:
      ValueError: at construction if G < 2; at apply if the rewards are not [B] or
        [B, K], `reward_key` is missing, or `batch.group_id` is not contiguous groups
        of G (see `check_groups`).
    """
    _check_group_size(group_size)

    def fn(batch: Batch, ctx: Context) -> tuple[Batch, Metrics]:
        del ctx
        if reward_key is None:
            rewards = batch.rewards
        elif reward_key in batch.extras:
            rewards = batch.extras[reward_key]
        else:
            raise ValueError(
                f"dynamic_sampling: reward_key={reward_key!r} is not in batch.extras "
                f"(keys: {sorted(batch.extras)})"
            )
        if rewards.ndim not in (1, 2):
            raise ValueError(f"dynamic_sampling needs [B] or [B, K] rewards, got {rewards.shape}")
        check_groups(batch.group_id, group_size)
        b = rewards.shape[0]
        chex.assert_shape(batch.loss_weights, (b, None))
        groups = rewards.reshape(b // group_size, group_size, -1)
        kept = jnp.any(groups != groups[:, :1], axis=(1, 2))  # [B/G]
        keep_row = jnp.repeat(kept, group_size)  # [B]
        weights = batch.loss_weights * keep_row[:, None].astype(batch.loss_weights.dtype)
        metrics = {"dynamic_sampling/kept_frac": kept.astype(jnp.float32).mean()}
        return batch.replace(loss_weights=weights), metrics

    source = keys.REWARDS if reward_key is None else keys.extra(reward_key)
    reads = {source, keys.GROUP_ID, keys.LOSS_WEIGHTS}
    return stateless(fn, reads, {keys.LOSS_WEIGHTS})
