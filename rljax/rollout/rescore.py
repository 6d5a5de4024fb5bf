"""The current policy's log-probs of stored rollouts, in fixed-size chunks (host side).

DARE re-estimates prompt difficulty from old rollouts scored under the current policy, and
LoPE re-scores rescued completions under their original prompt. Both call the jitted
`Steps.logprobs` on host arrays; chunking to a fixed row count keeps it to one compilation
whatever the number of stored rollouts.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

# (prompt_tokens [N, P], prompt_mask [N, P], completion_tokens [N, T], completion_mask [N, T])
# -> [N, T] log-probs of the completion tokens, 0 where masked (`Steps.logprobs` bound to a
# train state).
LogprobsFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]

ROLLOUT_KEYS = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask")


def rescore(logprobs: LogprobsFn, rows: dict[str, np.ndarray], chunk_rows: int) -> np.ndarray:
    """[N, T] float64 log-probs of `rows`' completions, computed `chunk_rows` rows at a time.

    The last chunk is padded with copies of the last row (their results are dropped), so every
    call has the same shape.

    Args:
      logprobs: the policy's log-prob function (`LogprobsFn`).
      rows: arrays with a leading dim N, holding at least `ROLLOUT_KEYS`.
      chunk_rows: rows per call (a multiple of the devices the batch is split over).
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
    n, t = np.shape(rows["completion_tokens"])
    parts = []
    for start in range(0, n, chunk_rows):
        ids = np.minimum(np.arange(start, start + chunk_rows), n - 1)
        out = logprobs(*(jnp.asarray(np.asarray(rows[k])[ids]) for k in ROLLOUT_KEYS))
        parts.append(np.asarray(out, np.float64)[: min(chunk_rows, n - start)])
    return np.concatenate(parts) if parts else np.zeros((0, t), np.float64)
