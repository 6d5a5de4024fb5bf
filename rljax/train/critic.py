"""A value critic for GAE: a linear value head on the policy's hidden states or on its own trunk.

The critic's parameters are a plain pytree `{"head": {"kernel": [D], "bias": []}}`, plus
`"trunk"` (an `nnx.State` of a separate Transformer) when the critic has its own network. With no
trunk the head reads the policy's final hidden states, so the value loss also trains the policy's
shared layers (a value head on the policy); with a trunk, critic and policy share nothing (the
separate-critic layout of PPO for language models, as in verl).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.train.logprobs import PolicyStates, policy_states

Critic = dict[str, Any]


def init_critic(d_model: int, trunk: nnx.State | None = None) -> Critic:
    """A critic whose value head starts at zero (all values 0 at step 0).

    Args:
      d_model: width of the hidden states the head reads (the trunk's, when given).
      trunk: parameters of a separate Transformer, or None to read the policy's states.

    Returns:
      The critic parameter pytree.
    """
    if d_model < 1:
        raise ValueError(f"d_model={d_model} must be >= 1")
    critic: Critic = {
        "head": {"kernel": jnp.zeros((d_model,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}
    }
    if trunk is not None:
        critic["trunk"] = trunk
    return critic


def critic_values(
    critic: Critic,
    trunk_graphdef: nnx.GraphDef | None,
    policy: PolicyStates | None,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    completion_mask: jax.Array,
    context_mask: jax.Array | None = None,
) -> jax.Array:
    """V(s_t) [B, T] for the states that predict each completion token; 0 on masked tokens.

    Args:
      critic: parameters from `init_critic`.
      trunk_graphdef: graph of the critic's own Transformer, or None to use `policy`'s states.
      policy: the policy's teacher-forced pass (`policy_states`) over the same batch; None
        for a critic with its own trunk (it runs its own pass).
      prompt_tokens, prompt_mask, completion_tokens, completion_mask: the batch; values are
        0 where `completion_mask` is False.
      context_mask: [B, T] bool, the completion tokens the critic's own trunk attends to
        (policy and environment tokens, `rljax.core.batch.context_mask`); default
        `completion_mask`. A value head on the policy reads `policy`'s pass instead.

    Returns:
      float32 values.
    """
    if ("trunk" in critic) != (trunk_graphdef is not None):
        raise ValueError(
            "critic parameters and trunk_graphdef disagree: a critic with its own trunk needs "
            "the trunk's graphdef, a value head on the policy needs trunk_graphdef=None"
        )
    if trunk_graphdef is None:
        if policy is None:
            raise ValueError("a value head on the policy needs the policy's pass (policy=None)")
        hidden = policy.completion_hidden
    else:
        hidden = policy_states(
            trunk_graphdef,
            critic["trunk"],
            prompt_tokens,
            prompt_mask,
            completion_tokens,
            completion_mask if context_mask is None else context_mask,
        ).completion_hidden
    head = critic["head"]
    values = jnp.einsum("btd,d->bt", hidden.astype(jnp.float32), head["kernel"]) + head["bias"]
    return jnp.where(completion_mask, values, 0.0)
