"""What benchmarks/e2e.py and its peer workers share: the standard library and numpy only (the
workers run in the peers' venvs, which have neither jax nor rljax's dependencies)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emit(kind: str, **record) -> None:
    """One `E2E {json}` line on stdout, the form the parent parses."""
    print("E2E " + json.dumps({"kind": kind, **record}), flush=True)


def reward_function(scores: list[float]):
    """A reward function of the signature TRL and Tunix call, `(prompts, completions, answer,
    **kwargs) -> [float]`: rljax's `numeric_match_reward` of each completion against its
    answer, every score also appended to `scores` (the worker reports their mean)."""
    match = rljax_reward()

    def reward(prompts, completions, answer, **kwargs):
        del prompts, kwargs
        out = [match(c, a) for c, a in zip(completions, answer)]
        scores.extend(out)
        return out

    return reward


def rljax_reward():
    """rljax's `numeric_match_reward`, from rljax/rewards/math.py alone (stdlib only)."""
    path = os.path.join(ROOT, "rljax", "rewards", "math.py")
    spec = importlib.util.spec_from_file_location("_rljax_rewards_math", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.numeric_match_reward


def left_padded(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token lists as a left-padded batch: tokens [K, L] int32 (0 as padding) and mask [K, L]
    bool, L the longest list."""
    length = max(len(row) for row in ids)
    tokens = np.zeros((len(ids), length), np.int32)
    mask = np.zeros(tokens.shape, bool)
    for i, row in enumerate(ids):
        tokens[i, length - len(row) :] = row
        mask[i, length - len(row) :] = True
    return tokens, mask
