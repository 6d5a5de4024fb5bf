"""`TrainState`: everything a run needs to continue, as one pytree (checkpointed and sharded)."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rljax.core.transform import Transform


@chex.dataclass
class FrozenBase:
    """The frozen base weights of a LoRA run (`rljax.models.lora`): the policy is the base with
    the adapters (`TrainState.params`) merged in, and the base alone is the KL reference.

    Attributes:
      params: the base policy's parameters (`nnx.State`); not in checkpoints (rebuilt from
        `model.checkpoint` at resume).
      scale: float32 scalar, lora.alpha / lora.rank.
      fingerprint: [8] int32 digest of the base (`rljax.models.lora.fingerprint`), saved with
        the adapters so a resume on another base is refused.
    """

    params: nnx.State
    scale: jax.Array
    fingerprint: jax.Array


@chex.dataclass
class TrainState:
    """The whole mutable state of an RL run.

    Attributes:
      step: int32 scalar, completed update steps.
      params: the trained parameters: the policy's (`nnx.State`), or under LoRA the adapters.
      opt_state: optimizer state of `params`.
      ref_params: frozen reference policy for KL terms, or None.
      transform_state: the states of the algorithm's transforms (schedules, statistics).
      rng: PRNG key; every step folds in `step`, so a resumed run draws the same numbers.
      critic: value critic parameters (`rljax.train.critic.init_critic`), or None.
      critic_opt_state: optimizer state of `critic`, or None.
      base: under LoRA the frozen base that `params` adapt, else None.
    """

    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState
    ref_params: nnx.State | None
    transform_state: Any
    rng: jax.Array
    critic: Any = None
    critic_opt_state: optax.OptState | None = None
    base: FrozenBase | None = None


def init_train_state(
    params: nnx.State,
    optimizer: optax.GradientTransformation,
    transform: Transform,
    rng: jax.Array,
    keep_reference: bool = False,
    critic: Any = None,
    base: FrozenBase | None = None,
) -> TrainState:
    """A fresh TrainState at step 0.

    Args:
      params: initial trained parameters (already placed on their devices, if sharded): the
        policy's, or with `base` the LoRA adapters.
      optimizer: the optax optimizer.
      transform: the algorithm's transform chain (its `init` gives the transform state).
      rng: PRNG key of the run.
      keep_reference: store a copy of `params` as the frozen reference policy.
      critic: value critic parameters for algorithms with a value loss (optimised by
        `optimizer` too, with its own state), or None.
      base: the frozen base of a LoRA run (`rljax.models.lora.frozen_base`), or None.
    """
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        ref_params=jax.tree.map(jnp.copy, params) if keep_reference else None,
        transform_state=transform.init(),
        rng=rng,
        critic=critic,
        critic_opt_state=None if critic is None else optimizer.init(critic),
        base=base,
    )
