"""What the generated (synthetic) tasks share: an unbounded train split, a finite test split of
`test_size` examples, and the checks of those settings.

A task's examples are drawn from numpy generators seeded with (seed, split id, index); which
split a problem belongs to is decided by a fixed hash of the problem (`split_hash`), so the
splits are disjoint for every seed.
"""

from __future__ import annotations

import numpy as np

SPLIT_IDS = {"train": 0, "test": 1}


class GeneratedSplits:
    """Mixin for dataclass tasks with the fields `seed`, `test_fraction` and `test_size`."""

    splits = ("train", "test")

    def check_split_settings(self) -> None:
        """Raises ValueError unless 0 < test_fraction < 1, seed >= 0 and test_size >= 1."""
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction={self.test_fraction} must be strictly between 0 and 1")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be non-negative (numpy seeds need it)")
        if self.test_size < 1:
            raise ValueError(f"test_size={self.test_size} must be at least 1")

    def split_size(self, split: str) -> int | None:
        """Examples in `split`: None for the unbounded train split, `test_size` for test."""
        self.split_id(split)
        return None if split == "train" else self.test_size

    def example_rng(self, index: int, split: str) -> np.random.Generator:
        """The generator of example `index` of `split`: seeded with (seed, split id, index)."""
        split_id = self.split_id(split)
        if index < 0:
            raise ValueError(f"index={index} must be non-negative")
        return np.random.default_rng([self.seed, split_id, index])

    def split_id(self, split: str) -> int:
        """0 for "train", 1 for "test" (part of every example's seed)."""
        if split not in SPLIT_IDS:
            raise ValueError(f"split={split!r} is not one of {self.splits}")
        return SPLIT_IDS[split]
