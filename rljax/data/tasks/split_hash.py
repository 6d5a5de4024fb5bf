"""A fixed integer hash that assigns each problem to exactly one split (train or test).

Tasks generate problems from their index; hashing what defines a problem (not the index, not
Python's salted `hash()`) keeps a held-out problem out of train for every seed and run.
"""

from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64 finaliser: a well-mixed 64-bit integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def unit_hash(first: int, *rest: int) -> float:
    """A deterministic number in [0, 1) for a tuple of non-negative integers (order matters)."""
    h = mix64(first)
    for v in rest:
        h = mix64(h ^ v)
    return h / 2.0**64


def text_hash(text: str) -> int:
    """A 64-bit integer hash of `text`, the same on every machine and Python run."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
