"""The `Batch` pytree: one rollout group-batch flowing through transforms and objectives."""

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np


@chex.dataclass
class Batch:
    """One rollout group-batch. Every field is a jax array with leading dim B.

    Samples answering the same prompt share a `group_id` and sit next to each
    other: the batch is laid out as B/G contiguous groups of G samples (see
    `check_groups`).

    Attributes:
      prompt_tokens: [B, P] int32, left- or right-padded prompt tokens.
      prompt_mask: [B, P] bool, True on real prompt tokens.
      completion_tokens: [B, T] int32, sampled completion tokens.
      completion_mask: [B, T] bool, True on real completion tokens (through EOS).
      group_id: [B] int32, which prompt each sample answers.
      rollout_logprobs: [B, T] f32, log-probs reported by the sampler.
      old_logprobs: [B, T] f32, trainer-side log-probs of the policy before the update.
      ref_logprobs: [B, T] f32, log-probs of the frozen reference policy.
      rewards: [B] or [B, K] f32, sequence rewards (K reward dimensions).
      advantages: [B, T] f32, token-level advantages.
      loss_weights: [B, T] f32, per-token loss weights; transforms may edit them.
      extras: dict of [B, ...] arrays (agent ids, ages, lengths, ...).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    completion_tokens: jax.Array
    completion_mask: jax.Array
    group_id: jax.Array
    rollout_logprobs: jax.Array
    old_logprobs: jax.Array
    ref_logprobs: jax.Array
    rewards: jax.Array
    advantages: jax.Array
    loss_weights: jax.Array
    extras: dict = dataclasses.field(default_factory=dict)


def _check_shape(name: str, x: jax.Array, expected: tuple[int, ...], what: str) -> None:
    if x.shape != expected:
        raise ValueError(f"{name} has shape {x.shape}, expected {what} = {expected}")


def make_batch(
    prompt_tokens: Any,
    prompt_mask: Any,
    completion_tokens: Any,
    completion_mask: Any,
    group_id: Any,
    rewards: Any,
    rollout_logprobs: Any | None = None,
    old_logprobs: Any | None = None,
    ref_logprobs: Any | None = None,
    advantages: Any | None = None,
    loss_weights: Any | None = None,
    extras: dict | None = None,
) -> Batch:
    """Builds a `Batch`, filling the fields a sampler does not produce.

    Missing log-probs and advantages are zeros; missing `loss_weights` are
    `completion_mask` as float. Inputs are cast to the field dtypes (tokens and
    group ids int32, masks bool, the rest float32). Works under `jit`.

    Args:
      prompt_tokens: [B, P] prompt tokens.
      prompt_mask: [B, P] prompt mask.
      completion_tokens: [B, T] completion tokens.
      completion_mask: [B, T] completion mask.
      group_id: [B] prompt index of each sample.
      rewards: [B] or [B, K] rewards.
      rollout_logprobs: optional [B, T] sampler log-probs.
      old_logprobs: optional [B, T] pre-update policy log-probs.
      ref_logprobs: optional [B, T] reference-policy log-probs.
      advantages: optional [B, T] advantages.
      loss_weights: optional [B, T] loss weights.
      extras: optional dict of arrays with leading dim B.

    Returns:
      A validated `Batch`.

    Raises:
      ValueError: if a field's shape disagrees with B, P or T.
    """
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    completion_tokens = jnp.asarray(completion_tokens, jnp.int32)
    if prompt_tokens.ndim != 2 or completion_tokens.ndim != 2:
        raise ValueError(
            f"prompt_tokens {prompt_tokens.shape} and completion_tokens "
            f"{completion_tokens.shape} must both be rank 2: [B, P] and [B, T]"
        )
    b, p = prompt_tokens.shape
    b_c, t = completion_tokens.shape
    if b_c != b:
        raise ValueError(f"completion_tokens has batch {b_c} but prompt_tokens has batch {b}")

    prompt_mask = jnp.asarray(prompt_mask, bool)
    completion_mask = jnp.asarray(completion_mask, bool)
    group_id = jnp.asarray(group_id, jnp.int32)
    rewards = jnp.asarray(rewards, jnp.float32)
    _check_shape("prompt_mask", prompt_mask, (b, p), "[B, P]")
    _check_shape("completion_mask", completion_mask, (b, t), "[B, T]")
    _check_shape("group_id", group_id, (b,), "[B]")
    if rewards.ndim not in (1, 2) or rewards.shape[0] != b:
        raise ValueError(f"rewards has shape {rewards.shape}, expected [B] or [B, K] with B = {b}")

    def token_field(name: str, value: Any | None, default: jax.Array) -> jax.Array:
        if value is None:
            return default
        value = jnp.asarray(value, jnp.float32)
        _check_shape(name, value, (b, t), "[B, T]")
        return value

    zeros = jnp.zeros((b, t), jnp.float32)
    extras = dict(extras or {})
    for key, value in extras.items():
        if jnp.shape(value)[:1] != (b,):
            raise ValueError(
                f"extras[{key!r}] has shape {jnp.shape(value)}, expected leading dim B = {b}"
            )
    return Batch(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        completion_tokens=completion_tokens,
        completion_mask=completion_mask,
        group_id=group_id,
        rollout_logprobs=token_field("rollout_logprobs", rollout_logprobs, zeros),
        old_logprobs=token_field("old_logprobs", old_logprobs, zeros),
        ref_logprobs=token_field("ref_logprobs", ref_logprobs, zeros),
        rewards=rewards,
        advantages=token_field("advantages", advantages, zeros),
        loss_weights=token_field("loss_weights", loss_weights, completion_mask.astype(jnp.float32)),
        extras=extras,
    )


def context_mask(batch: Batch) -> jax.Array:
    """[B, T] bool: the completion tokens a forward pass attends to and gives positions.

    Multi-turn episodes put environment (observation) tokens between the policy's turns
    inside the completion. They are context, not actions: `completion_mask` leaves them out,
    so every loss, aggregation and statistic over it ignores them, and
    `extras["env_mask"]` ([B, T], True or > 0 on them) marks them. A forward pass must still
    see them, at their real positions, or the policy tokens after them would be scored
    without the observations they answer. This is `completion_mask | env_mask`, or
    `completion_mask` when the batch has no "env_mask".

    Args:
      batch: the batch; `extras["env_mask"]`, when present, is [B, T] bool or float.

    Returns:
      [B, T] bool mask of policy and environment tokens.
    """
    mask = batch.completion_mask.astype(bool)
    env = batch.extras.get("env_mask")
    if env is None:
        return mask
    chex.assert_equal_shape([mask, env])
    return mask | (env > 0)


def check_groups(group_id: jax.Array, group_size: int) -> None:
    """Checks that `group_id` is B/G contiguous groups of `group_size` samples.

    The shape check always runs. The value check (each row of the [B/G, G] view
    holds one id, neighbouring rows differ) runs only on concrete arrays; under
    `jit` the ids are traced and only the shape is checked.

    Args:
      group_id: [B] int32 prompt index of each sample.
      group_size: G, samples per prompt.

    Raises:
      ValueError: if G < 1, G does not divide B, or the ids are not laid out as
        contiguous equal-size groups.
    """
    chex.assert_rank(group_id, 1)
    b = group_id.shape[0]
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be a positive int")
    if b % group_size:
        raise ValueError(f"group_size={group_size} does not divide batch {b}")
    if isinstance(group_id, jax.core.Tracer):
        return
    rows = np.asarray(group_id).reshape(b // group_size, group_size)
    mixed = np.flatnonzero((rows != rows[:, :1]).any(axis=1))
    if mixed.size:
        g = mixed[0]
        raise ValueError(
            f"group {g} (samples {g * group_size}..{(g + 1) * group_size - 1}) mixes group ids "
            f"{sorted(set(rows[g].tolist()))}: lay the batch out as contiguous groups of "
            f"group_size={group_size} samples of one prompt each"
        )
    repeated = np.flatnonzero(rows[1:, 0] == rows[:-1, 0])
    if repeated.size:
        g = repeated[0]
        raise ValueError(
            f"groups {g} and {g + 1} share group id {rows[g, 0]}: with group_size="
            f"{group_size} each prompt must fill exactly one contiguous group"
        )


def check_sequence_rewards(rewards: jax.Array, who: str) -> None:
    """Raises unless `rewards` is [B]: `who` (a transform) needs one reward per sequence."""
    if rewards.ndim != 1:
        raise ValueError(
            f"{who} needs [B] rewards, got {rewards.shape}; reduce [B, K] rewards to one "
            "dimension first"
        )


def equal_reward_fraction(rewards: jax.Array, group_size: int) -> jax.Array:
    """Fraction of the B/G groups of [B] `rewards` whose rewards are all equal (no signal)."""
    groups = rewards.reshape(-1, group_size)
    return jnp.mean(jnp.all(groups == groups[:, :1], axis=1).astype(jnp.float32))
