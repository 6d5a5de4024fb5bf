"""Numerical guard: a non-finite loss or gradient skips the update instead of poisoning the run.

Inside the jitted update every optimizer step checks its loss and gradients; when one is NaN or
infinite the parameters and optimizer state are kept as they were, and the step reports which
tensor was the first non-finite one in an order of causes before effects (`named_tensors`):
the sampled rewards and log-probs, the parameters, what the trainer derived from them (old
log-probs, advantages, ...), the policy's new log-probs and entropies, the loss, the gradients.
So a NaN reward is named as `batch.rewards`, not as the advantages or gradients it spoiled.
Finite gradients can still make a non-finite step (a learning rate that overflows, Adam's
second moment of a huge gradient), so the step's result (`update_tensors`: the new parameters
and optimizer states) is checked too before it is committed; a non-finite one is rolled back
and named after the inputs (`update.params[...]`, `update.opt_state[...]`). No non-finite
state is ever committed, so none reaches a checkpoint.
On the host, `SkipGuard` counts skipped steps and stops the run after too many in a row,
naming the step and that tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging

# The floating-point fields of a `Batch`: what the sampler and the rewards gave, then what the
# trainer derived from them and the parameters.
_SAMPLED = ("rewards", "rollout_logprobs")
_DERIVED = ("old_logprobs", "ref_logprobs", "extras", "advantages", "loss_weights")


def named_tensors(
    batch: Any, trainable: tuple[Any, Any], policy: Any, loss: Any, grads: tuple[Any, Any]
) -> list[tuple[str, Any]]:
    """The floating-point leaves that the guard checks, named, in the order it reports them.

    Args:
      batch: the (micro)batch being trained on.
      trainable: (policy params, critic params or None).
      policy: the new policy's per-token statistics, a dict (`logprobs`, `entropy`).
      loss: the scalar loss.
      grads: gradients of `trainable`, same structure.
    """
    # Causes before effects: NaN parameters spoil the old log-probs, NaN rewards the
    # advantages (chex would sort the batch fields by name).
    groups = (
        *((f"batch.{name}", getattr(batch, name)) for name in _SAMPLED),
        ("params", trainable[0]),
        ("critic", trainable[1]),
        *((f"batch.{name}", getattr(batch, name)) for name in _DERIVED),
        ("policy", policy),
        ("loss", loss),
        ("grads/params", grads[0]),
        ("grads/critic", grads[1]),
    )
    return _floating(groups)


def update_tensors(
    trainable: tuple[Any, Any], opt_states: tuple[Any, Any]
) -> list[tuple[str, Any]]:
    """The floating-point leaves of an optimizer step's result, named `update.*`: what the
    guard checks before it commits the step.

    Args:
      trainable: the new (policy params, critic params or None).
      opt_states: the new (policy optimizer state, critic optimizer state or None).
    """
    groups = (
        ("update.params", trainable[0]),
        ("update.critic", trainable[1]),
        ("update.opt_state", opt_states[0]),
        ("update.critic_opt_state", opt_states[1]),
    )
    return _floating(groups)


def _floating(groups: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """(prefix + key path, leaf) of every floating-point leaf of the (prefix, tree) groups."""
    out = []
    for prefix, tree in groups:
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
                out.append((prefix + jax.tree_util.keystr(path), leaf))
    return out


def input_names(batch: Any, params: Any, critic: Any) -> list[str]:
    """The names of `named_tensors` for an update of (params, critic) on `batch` (works on
    tracers too: only structures and dtypes are read)."""
    policy = {"logprobs": batch.old_logprobs, "entropy": batch.old_logprobs}
    trainable = (params, critic)
    return [name for name, _ in named_tensors(batch, trainable, policy, 0.0, trainable)]


def tensor_names(batch: Any, state: Any) -> list[str]:
    """Every name `guard/first_nonfinite` indexes for an update of `state` (a TrainState) on
    `batch`: `named_tensors`' then `update_tensors`' (host side)."""
    updated = update_tensors(
        (state.params, state.critic), (state.opt_state, state.critic_opt_state)
    )
    return input_names(batch, state.params, state.critic) + [name for name, _ in updated]


def check_warm_start(params: Any) -> None:
    """Stops a run whose SFT warm start left a non-finite parameter: every RL update would be
    skipped, and a checkpoint would save it.

    Raises:
      FloatingPointError: naming the first non-finite parameter.
    """
    tensors = _floating((("params", params),))
    index = int(first_nonfinite(tensors)) if tensors else -1
    if index >= 0:
        raise FloatingPointError(
            f"the SFT warm start made {tensors[index][0]} non-finite; lower sft.learning_rate "
            "(or set sft.steps=0)"
        )


def first_nonfinite(tensors: Sequence[tuple[str, jax.Array]]) -> jax.Array:
    """Index of the first tensor holding a NaN or infinity, or -1 (int32 scalar, jittable)."""
    bad = jnp.stack([~jnp.isfinite(x).all() for _, x in tensors])
    return jnp.where(bad.any(), jnp.argmax(bad), -1).astype(jnp.int32)


def all_finite(tree: Any) -> jax.Array:
    """True when every floating leaf of `tree` is finite (bool scalar, jittable)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.stack([jnp.isfinite(x).all() for x in leaves]).all() if leaves else jnp.True_


class SkipGuard:
    """Counts updates skipped for non-finite values and stops the run after too many in a row.

    Args:
      max_consecutive: a run stops (FloatingPointError) when this many steps in a row skipped
        their update (`train.max_consecutive_skips`).
    """

    def __init__(self, max_consecutive: int):
        if max_consecutive < 1:
            raise ValueError(
                f"train.max_consecutive_skips={max_consecutive} must be >= 1 (the number of "
                "steps in a row with a skipped update after which the run stops)"
            )
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0
        self.first: tuple[int, str] = (0, "")  # (step, cause) of the current row's first skip

    def check(self, step: int, metrics: dict[str, Any], names: Callable[[], list[str]]) -> float:
        """Reads a step's `guard/*` metrics; logs a skip, raises after too many in a row.

        Args:
          step: the step just run (1-based, as logged).
          metrics: the step's metrics, with `guard/skipped` (share of the step's optimizer
            steps skipped) and `guard/first_nonfinite` (index into `names()`, -1 for none).
          names: the guard's tensor names for this step's batch (`tensor_names`).

        Returns:
          The share of the step's optimizer steps that were skipped.

        Raises:
          FloatingPointError: `max_consecutive` steps in a row skipped updates.
        """
        skipped = float(metrics["guard/skipped"])
        if skipped == 0.0:
            self.consecutive = 0
            return skipped
        self.consecutive += 1
        self.total += 1
        index = int(metrics["guard/first_nonfinite"])
        tensor = names()[index] if index >= 0 else "none (the update itself)"
        if tensor.startswith("update."):  # finite inputs, a non-finite step: rolled back
            cause = f"the update made {tensor} non-finite (learning rate too high?)"
        else:
            cause = f"first non-finite tensor: {tensor}"
        if self.consecutive == 1:
            self.first = (step, cause)
        message = (
            f"step {step}: update skipped for non-finite values ({self.consecutive} in a row, "
            f"{self.total} in all); {cause}"
        )
        if self.consecutive >= self.max_consecutive:
            if self.first[1] != cause:  # what went wrong first, not only its consequences
                message += f"; at step {self.first[0]}, the first of the row: {self.first[1]}"
            raise FloatingPointError(
                f"{message}; stopping after train.max_consecutive_skips={self.max_consecutive}"
                " skipped steps in a row (check the rewards and inputs, lower "
                "train.learning_rate, or resume from an earlier checkpoint)"
            )
        logging.warning("%s", message)
        return skipped
