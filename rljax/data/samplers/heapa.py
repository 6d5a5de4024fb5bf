"""HeaPA: a bounded prompt pool split at its reward median, sampled at the boundary (host side).

HeaPA (arXiv 2601.22448; authors' code horizon-rl/HeaPA, `recipe/dapo/dapo_ray_trainer_HeaPA.py`,
`ThreadSafeQueryPool`) keeps prompts ("queries") with their last mean verifier reward, clipped
to [-1, 1], in two heaps:

- low: the lower part of the rewards, read from its maximum (a max-heap);
- high: the upper part, read from its minimum (a min-heap; a max-heap mirror gives its maximum);
- every reward in low is <= every reward in high, so the two tops straddle the median;
- unscored ("cold") queries wait in a FIFO queue and are sampled first, so they get scored.

Sampling k: take the cold queries first; for the remaining m, pop 2m items alternately from the
high minimum and the low maximum (the 2m rewards nearest the boundary), choose m of them
uniformly and put the rest back. Sampled queries leave the pool; the caller adds them back with
their new reward (`add`) after the rollout.

Insertion: reward <= high minimum goes to low, otherwise to high. When the pool is full the
insertion is followed by one eviction: the low heap's minimum (the global minimum: the hardest
query), or the high minimum when low is empty. A cold query arriving at a full pool evicts the
high maximum (the easiest query), else the low maximum, else the oldest cold query (as the code).

Rebalancing, our reading of "a 0.5 fraction is rebalanced" (the code's `low_fraction=0.5` and
`_rebalance_low_high_unlocked`): after every change, if the low heap's size differs from
target = round(low_fraction * scored) by more than one, boundary items move (high minimum to
low, or low maximum to high) until it holds exactly `target`; moving tops keeps low <= high.
The code caps one rebalance at 4 moves; we move all that are needed (after a single insertion
at most one or two are).

Both sides are `_Side`s: a min-heap and a max-heap over the same entries with lazy deletion,
so tops, pops and the evictions are O(log n). Entries are (reward, seq, query id); seq, the
insertion counter, breaks ties (oldest first), which makes every pop deterministic.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from typing import Any

import numpy as np

Entry = tuple[float, int, int]  # (reward, seq, query id)


class _Side:
    """A multiset of entries with both ends available: a min-heap, a max-heap mirror, and lazy
    deletion by seq."""

    def __init__(self, entries: list[Entry] = ()):
        self._live: dict[int, Entry] = {e[1]: e for e in entries}
        self._rebuild()

    def _rebuild(self) -> None:
        self._min = [(r, s, q) for r, s, q in self._live.values()]
        self._max = [(-r, s, q) for r, s, q in self._live.values()]
        heapq.heapify(self._min)
        heapq.heapify(self._max)

    def __len__(self) -> int:
        return len(self._live)

    def push(self, entry: Entry) -> None:
        r, s, q = entry
        self._live[s] = entry
        heapq.heappush(self._min, (r, s, q))
        heapq.heappush(self._max, (-r, s, q))

    def _clean(self, heap: list) -> None:
        while heap and heap[0][1] not in self._live:
            heapq.heappop(heap)

    def peek_min(self) -> Entry | None:
        self._clean(self._min)
        return self._min[0] if self._min else None

    def peek_max(self) -> Entry | None:
        self._clean(self._max)
        return self._live[self._max[0][1]] if self._max else None

    def _remove(self, entry: Entry | None) -> Entry | None:
        if entry is not None:
            del self._live[entry[1]]
            if len(self._min) + len(self._max) > 4 * len(self._live) + 64:
                self._rebuild()  # drop stale mirror entries
        return entry

    def pop_min(self) -> Entry | None:
        return self._remove(self.peek_min())

    def pop_max(self) -> Entry | None:
        return self._remove(self.peek_max())

    def entries(self) -> list[Entry]:
        """The live entries in insertion (seq) order."""
        return sorted(self._live.values(), key=lambda e: e[1])


@dataclasses.dataclass(frozen=True)
class HeaPASettings:
    """HeaPA's pool settings.

    Attributes:
      capacity: the most queries the pool holds (cold + low + high).
      low_fraction: the share of scored queries kept in the low heap (0.5: split at the median).
    """

    capacity: int = 30000
    low_fraction: float = 0.5

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"HeaPA capacity={self.capacity} must be >= 1")
        if not 0.0 < self.low_fraction < 1.0:
            raise ValueError(f"HeaPA low_fraction={self.low_fraction} must be in (0, 1)")


class HeaPAPool:
    """HeaPA's bounded query pool with boundary sampling and exact, checkpointable state.

    Query ids are opaque ints (dataset indices); the pool does not deduplicate them.

    Args:
      settings: capacity and low fraction.
      seed: with the step, seeds the choice among boundary candidates.
    """

    def __init__(self, settings: HeaPASettings, seed: int):
        self.settings = settings
        self.seed = int(seed)
        self.low = _Side()
        self.high = _Side()
        self.cold: collections.deque[int] = collections.deque()
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self.low) + len(self.high) + len(self.cold)

    def add(self, query_ids, rewards=None) -> np.ndarray:
        """Adds queries; a NaN reward (or `rewards=None`) makes a cold query.

        Args:
          query_ids: [Q] int query ids.
          rewards: [Q] mean verifier rewards (clipped to [-1, 1]) or None.

        Returns:
          The ids evicted to stay within capacity, in eviction order.
        """
        ids = np.asarray(query_ids, np.int64).reshape(-1)
        r = np.full(ids.shape, np.nan) if rewards is None else np.asarray(rewards, np.float64)
        if r.shape != ids.shape:
            raise ValueError(f"rewards {r.shape} must match query_ids {ids.shape}")
        evicted = []
        for q, reward in zip(ids.tolist(), np.clip(r, -1.0, 1.0).tolist()):
            full = len(self) >= self.settings.capacity
            if np.isnan(reward):
                if full:
                    evicted.append(self._evict_for_cold())
                self.cold.append(q)
            else:
                self._place((reward, next(self._seq), q))
                if full:
                    gone = self.low.pop_min() or self.high.pop_min()
                    evicted.append(gone[2])
            self._rebalance()
        return np.asarray(evicted, np.int64)

    def _place(self, entry: Entry) -> None:
        top = self.high.peek_min()
        (self.high if top is None or entry[0] > top[0] else self.low).push(entry)

    def _evict_for_cold(self) -> int:
        gone = self.high.pop_max() or self.low.pop_max()
        return gone[2] if gone is not None else self.cold.popleft()

    def _rebalance(self) -> None:
        target = round(self.settings.low_fraction * (len(self.low) + len(self.high)))
        if abs(len(self.low) - target) <= 1:
            return
        while len(self.low) < target:
            self.low.push(self.high.pop_min())
        while len(self.low) > target:
            self.high.push(self.low.pop_max())

    def select(self, step: int, k: int) -> np.ndarray:
        """[<= k] query ids removed from the pool: cold ones first (FIFO), then boundary ones.

        The boundary ones: 2m candidates popped alternately from the high minimum and the low
        maximum (falling back to the other side when one is empty), m chosen uniformly without
        replacement, the rest put back. When m covers every scored query, all are taken.
        """
        if k < 0:
            raise ValueError(f"k={k} must be >= 0")
        chosen = [self.cold.popleft() for _ in range(min(k, len(self.cold)))]
        need = k - len(chosen)
        scored = len(self.low) + len(self.high)
        if need <= 0 or scored == 0:
            return np.asarray(chosen, np.int64)
        take = scored if need >= scored else min(2 * need, scored)
        candidates: list[tuple[Entry, _Side]] = []
        want_high = True
        for _ in range(take):
            side = self.high if (want_high and len(self.high)) or not len(self.low) else self.low
            entry = side.pop_min() if side is self.high else side.pop_max()
            candidates.append((entry, side))
            want_high = not want_high
        rng = np.random.default_rng((self.seed, step))
        picks = rng.choice(len(candidates), size=min(need, len(candidates)), replace=False)
        picked = set(picks.tolist())
        for i, (entry, side) in enumerate(candidates):
            if i not in picked:
                side.push(entry)
        self._rebalance()
        chosen += [candidates[i][0][2] for i in picks.tolist()]
        return np.asarray(chosen, np.int64)

    def state(self) -> dict[str, Any]:
        """The pool for a checkpoint: numpy arrays per part (empty parts are empty dicts)."""

        def side(s: _Side) -> dict[str, np.ndarray]:
            e = s.entries()
            if not e:
                return {}
            r, seq, q = zip(*e)
            return {
                "reward": np.asarray(r, np.float64),
                "seq": np.asarray(seq, np.int64),
                "query_id": np.asarray(q, np.int64),
            }

        cold = {"query_id": np.asarray(self.cold, np.int64)} if self.cold else {}
        return {
            "low": side(self.low),
            "high": side(self.high),
            "cold": cold,
            "next_seq": int(self._peek_seq()),
        }

    def _peek_seq(self) -> int:
        n = next(self._seq)
        self._seq = itertools.count(n)
        return n

    def load(self, state: dict[str, Any]) -> None:
        """Restores a pool saved by `state` (heap layout may differ; pop order is identical)."""

        def side(d: dict[str, Any]) -> _Side:
            if not d:
                return _Side()
            r = np.asarray(d["reward"], np.float64).tolist()
            s = np.asarray(d["seq"], np.int64).tolist()
            q = np.asarray(d["query_id"], np.int64).tolist()
            return _Side(list(zip(r, s, q)))

        self.low = side(state.get("low", {}))
        self.high = side(state.get("high", {}))
        cold = state.get("cold", {})
        self.cold = collections.deque(
            np.asarray(cold["query_id"], np.int64).tolist() if cold else []
        )
        self._seq = itertools.count(int(state.get("next_seq", 0)))
