"""`RowBuffer`: a FIFO of sample rows (dicts of arrays sharing the leading dimension).

The host-side buffers of collectors and prompt selectors (UEC-RL's batch and replay buffers,
FreshPER's stored groups, DARE's rollout records) keep their rows here; `state`/`load` put
them in a checkpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Rows = dict[str, np.ndarray]  # sample rows: arrays sharing the leading dimension


class RowBuffer:
    """A FIFO buffer of sample rows; beyond `capacity` rows the oldest are dropped.

    Args:
      capacity: the most rows it holds (>= 1).
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"RowBuffer capacity={capacity} must be >= 1")
        self.capacity = int(capacity)
        self.rows: Rows | None = None

    def __len__(self) -> int:
        return 0 if self.rows is None else len(next(iter(self.rows.values())))

    def add(self, rows: Rows) -> None:
        """Appends rows (a dict of arrays with one leading dimension), dropping the oldest."""
        if not rows or len(next(iter(rows.values()))) == 0:
            return
        if self.rows is not None and rows.keys() != self.rows.keys():
            raise ValueError(
                f"rows with fields {sorted(rows)} do not match the buffer's {sorted(self.rows)}"
            )
        merged = (
            dict(rows)
            if self.rows is None
            else {k: np.concatenate([self.rows[k], rows[k]]) for k in self.rows}
        )
        self.rows = {k: v[-self.capacity :] for k, v in merged.items()}

    def pop(self, n: int) -> Rows:
        """Removes and returns the `n` oldest rows."""
        if n > len(self):
            raise ValueError(f"cannot pop {n} rows from a buffer of {len(self)}")
        out = {k: v[:n] for k, v in self.rows.items()}
        rest = {k: v[n:] for k, v in self.rows.items()}
        self.rows = rest if len(next(iter(rest.values()))) else None
        return out

    def sample(self, n: int, rng: np.random.Generator) -> Rows:
        """`n` rows drawn uniformly without replacement, oldest first; the buffer is unchanged."""
        if n > len(self):
            raise ValueError(f"cannot sample {n} rows from a buffer of {len(self)}")
        ids = np.sort(rng.choice(len(self), size=n, replace=False))
        return {k: v[ids] for k, v in self.rows.items()}

    def state(self) -> dict[str, Any]:
        """The rows, for a checkpoint (an empty dict when the buffer is empty)."""
        return {} if self.rows is None else dict(self.rows)

    def load(self, state: dict[str, Any]) -> None:
        """Restores rows saved by `state`."""
        self.rows = {k: np.asarray(v) for k, v in state.items()} if state else None
