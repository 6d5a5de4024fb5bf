"""The prepare step's per-token statistics: an open registry, computed when something reads them.

A statistic is a function of the pre-update policy's forward pass (and the reference's, for one
that `needs_reference`) that the prepare step writes to `batch.extras[name]`. It is computed
only for an algorithm that reads `"extras.<name>"` (`Algorithm.batch_stats`), so registering
one costs nothing to algorithms that do not use it:

    register_token_statistic("old_max_prob", lambda s: jnp.exp(...), doc="[B, T] max_v pi_old")

"old_entropy" is always computed (the prepare step reports it) and is not in the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.core import keys
from rljax.core.batch import Batch
from rljax.train.logprobs import PolicyStates, TokenStats, token_hellinger


class StatisticInputs(NamedTuple):
    """What a statistic is computed from.

    Attributes:
      batch: the batch before the transforms (old/ref log-probs not yet filled in).
      old: the pre-update policy's forward pass (hidden states and output matrix).
      old_stats: its per-token log-probs, entropy and sum of squared probabilities [B, T]
        (0 on masked tokens).
      ref: the reference policy's forward pass, or None without a reference.
      vocab_chunk: vocabulary columns per chunk for anything over the vocabulary.
    """

    batch: Batch
    old: PolicyStates
    old_stats: TokenStats
    ref: PolicyStates | None
    vocab_chunk: int


class TokenStatistic(NamedTuple):
    """A registered statistic: `fn(StatisticInputs) -> array` with leading dim B."""

    fn: Callable[[StatisticInputs], jax.Array]
    needs_reference: bool
    doc: str


TOKEN_STATISTICS: dict[str, TokenStatistic] = {}


def register_token_statistic(
    name: str,
    fn: Callable[[StatisticInputs], jax.Array],
    needs_reference: bool = False,
    doc: str = "",
    shape: str = "[B, T] f32",
    replace: bool = False,
) -> None:
    """Registers a per-token statistic that the prepare step writes to `batch.extras[name]`.

    Also declares the key `"extras.<name>"` (produced by the prepare step), so a transform
    that reads it passes `rljax.core.keys.check_algorithm`.

    Args:
      name: the extras key.
      fn: `(StatisticInputs) -> array` with leading dim B, jittable.
      needs_reference: it reads `inputs.ref`; an algorithm reading it keeps a reference policy.
      doc: one line.
      shape: its shape, for the key's declaration.
      replace: allow replacing a registered statistic.

    Raises:
      ValueError: if `name` is registered and `replace` is False, or its key is declared
        with another producer.
    """
    if name in TOKEN_STATISTICS and not replace:
        raise ValueError(f"token statistic {name!r} is already registered; pass replace=True")
    key = keys.extra(name)
    if key in keys.KEYS and keys.KEYS[key].producer != keys.PREPARE:
        raise ValueError(
            f"{key!r} is already declared as produced by {keys.KEYS[key].producer}; "
            "name the statistic differently"
        )
    keys.register_key(key, shape, doc, keys.PREPARE, needs_reference, replace=True)
    TOKEN_STATISTICS[name] = TokenStatistic(fn, needs_reference, doc)


def compute_statistics(names, inputs: StatisticInputs) -> dict[str, jax.Array]:
    """`{name: fn(inputs)}` for the registered statistics `names`.

    Raises:
      ValueError: for an unregistered name, or one that needs the reference when
        `inputs.ref` is None.
    """
    unknown = sorted(set(names) - set(TOKEN_STATISTICS))
    if unknown:
        raise ValueError(
            f"algorithm reads unknown batch statistics {unknown}; known: "
            f"{sorted(TOKEN_STATISTICS)} (register_token_statistic adds one)"
        )
    out = {}
    for name in names:
        stat = TOKEN_STATISTICS[name]
        if stat.needs_reference and inputs.ref is None:
            raise ValueError(
                f"the algorithm needs {name} but the train state has no reference policy; "
                "build it with init_train_state(..., keep_reference=True)"
            )
        out[name] = stat.fn(inputs)
    return out


def _old_ref_hellinger(s: StatisticInputs) -> jax.Array:
    d = token_hellinger(
        s.old.completion_hidden, s.old.head, s.ref.completion_hidden, s.ref.head, s.vocab_chunk
    )
    return jnp.where(s.batch.completion_mask, d, 0.0)


def _prompt_embedding(s: StatisticInputs) -> jax.Array:
    pm = s.batch.prompt_mask.astype(jnp.float32)[..., None]
    hidden = s.old.prompt_hidden.astype(jnp.float32)
    return (hidden * pm).sum(1) / jnp.maximum(pm.sum(1), 1.0)


register_token_statistic(
    "old_sum_sq_prob",
    lambda s: s.old_stats.sum_sq_prob,
    doc="sum_v pi_old(v | s_t)^2 (optimal token baseline)",
)
register_token_statistic(
    "old_ref_hellinger",
    _old_ref_hellinger,
    needs_reference=True,
    doc="1 - sum_v sqrt(pi_old pi_ref) (DGPO)",
)
register_token_statistic(
    "prompt_embedding",
    _prompt_embedding,
    doc="mean final hidden state over the prompt tokens (kernel baseline)",
    shape="[B, D] f32",
)
