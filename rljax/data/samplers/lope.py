"""LoPE: rescue all-failed prompts with Lorem-Ipsum-perturbed rollouts (host side).

LoPE (arXiv 2605.05566; authors' code shrango/LoPE, `verl/trainer/ray_trainer.py`,
`config.py`): a prompt whose n rollouts all fail gives GRPO no signal. LoPE prepends a
meaningless Lorem-Ipsum system prefix (100-300 words) to it, `num_perturbed` (6) times, draws
`rollouts_per_perturbed` (4) rollouts of each, and lets the correct ones replace up to n - 1 of
the original failures, keeping at least one failure so the group has a contrast. The merged
samples are trained on under the ORIGINAL prompt (the prefix is dropped). Optionally the group's
advantage mean/std are taken over all base + perturbed scores.

A host loop: `failed = all_failed(rewards, n)`; for each failed prompt, roll out
`perturbed_prompts(text, rng)`, then `merge(original_rows, perturbed_rows, rng)`. The caller
re-scores the merged rows' log-probs under the original prompt before the update (their
sampling log-probs were taken under the perturbed one).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

Rows = dict[str, np.ndarray]  # sample rows: arrays sharing the leading dimension

# A fixed Lorem-Ipsum vocabulary (the classic Cicero-derived filler words).
LOREM_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
    "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
    "cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
    "officia deserunt mollit anim id est laborum"
).split()


@dataclasses.dataclass(frozen=True)
class LoPESettings:
    """LoPE's settings (defaults: the authors' `config.py`).

    Attributes:
      num_perturbed: perturbed prompts built per all-failed prompt (6).
      rollouts_per_perturbed: rollouts drawn from each perturbed prompt (4).
      min_words: the fewest words of a prefix (100).
      max_words: the most words of a prefix (300).
      pooled_stats: take the group's advantage mean/std over base + perturbed scores.
    """

    num_perturbed: int = 6
    rollouts_per_perturbed: int = 4
    min_words: int = 100
    max_words: int = 300
    pooled_stats: bool = False

    def __post_init__(self):
        if self.num_perturbed < 1 or self.rollouts_per_perturbed < 1:
            raise ValueError(
                f"num_perturbed={self.num_perturbed} and rollouts_per_perturbed="
                f"{self.rollouts_per_perturbed} must be >= 1"
            )
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(
                f"prefix lengths need 1 <= min_words <= max_words, got {self.min_words}, "
                f"{self.max_words}"
            )


def all_failed(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """[N] bool: prompts none of whose `group_size` rollouts is correct (reward > 0).

    Args:
      rewards: [N * G] rewards laid out as N contiguous groups.
      group_size: G, rollouts per prompt.
    """
    rewards = np.asarray(rewards)
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards of shape {rewards.shape} are not [N * G] groups of group_size={group_size}"
        )
    return ~np.any(rewards.reshape(-1, group_size) > 0, axis=1)


def lorem_prefix(rng: np.random.Generator, min_words: int = 100, max_words: int = 300) -> str:
    """A Lorem-Ipsum text of a uniform number of words in [min_words, max_words].

    Words are drawn uniformly from `LOREM_WORDS`; sentences of 8-15 words start with a capital
    and end with a period (interpretation: the paper fixes only the word-count range).
    """
    n = int(rng.integers(min_words, max_words + 1))
    words = [LOREM_WORDS[i] for i in rng.integers(0, len(LOREM_WORDS), size=n)]
    out, start = [], 0
    while start < n:
        end = min(n, start + int(rng.integers(8, 16)))
        sentence = words[start:end]
        out.append(" ".join([sentence[0].capitalize(), *sentence[1:]]) + ".")
        start = end
    return " ".join(out)


def perturbed_prompts(
    prompt: str, rng: np.random.Generator, settings: LoPESettings = LoPESettings()
) -> list[str]:
    """`num_perturbed` copies of `prompt`, each after its own Lorem-Ipsum prefix and a blank line.

    Seed `rng` from (seed, step, prompt index) so a resumed run builds the same prefixes. A
    chat template can instead put `lorem_prefix` in the system turn.
    """
    return [
        f"{lorem_prefix(rng, settings.min_words, settings.max_words)}\n\n{prompt}"
        for _ in range(settings.num_perturbed)
    ]


class Merged(NamedTuple):
    """The result of `merge`.

    Attributes:
      rows: [n] the original failures with some completions replaced; prompt fields original.
      replaced: [n] bool, the original rows whose completion was replaced.
      source: [n] int, the perturbed row each replaced row came from (-1 where not replaced).
      stats_scores: the scores the group's advantage mean/std are taken over: the merged rows'
        rewards, or (pooled_stats) the n original rewards followed by every perturbed reward.
    """

    rows: Rows
    replaced: np.ndarray
    source: np.ndarray
    stats_scores: np.ndarray


def merge(
    original: Rows,
    perturbed: Rows,
    rng: np.random.Generator,
    prompt_keys: tuple[str, ...] = ("prompt_tokens", "prompt_mask"),
    reward_key: str = "rewards",
    pooled_stats: bool = False,
) -> Merged:
    """Replaces up to n - 1 of one prompt's n failed rollouts with correct perturbed rollouts.

    If c perturbed rollouts are correct (reward > 0), min(c, n - 1) of them are used, chosen
    uniformly without replacement when c > n - 1; they replace as many original rows chosen
    uniformly (interpretation: the code's order is not specified), so at least one original
    failure stays. Every field except `prompt_keys` is copied from the perturbed row; the
    prompt fields keep the original prompt.

    Args:
      original: [n] rows of one all-failed prompt (n >= 2).
      perturbed: [M] rows of its perturbed rollouts, with the same fields (and trailing shapes).
      rng: chooses the correct rollouts and the rows they replace.
      prompt_keys: the fields that hold the prompt.
      reward_key: the field with each row's reward.
      pooled_stats: return base + perturbed scores in `stats_scores`.
    """
    if original.keys() != perturbed.keys():
        raise ValueError(
            f"perturbed fields {sorted(perturbed)} differ from the original's {sorted(original)}"
        )
    missing = [k for k in (*prompt_keys, reward_key) if k not in original]
    if missing:
        raise ValueError(f"rows lack the fields {missing}; pass prompt_keys/reward_key")
    base = np.asarray(original[reward_key])
    n = len(base)
    if n < 2:
        raise ValueError(f"LoPE needs n >= 2 rollouts per prompt to keep a failure, got {n}")
    if np.any(base > 0):
        raise ValueError("merge applies only to prompts whose rollouts all failed (reward <= 0)")
    pert = np.asarray(perturbed[reward_key])
    correct = np.flatnonzero(pert > 0)
    m = min(len(correct), n - 1)
    used = rng.choice(correct, size=m, replace=False) if len(correct) > m else correct
    slots = rng.choice(n, size=m, replace=False)
    rows = {k: np.array(v, copy=True) for k, v in original.items()}
    for k in rows:
        if k not in prompt_keys:
            rows[k][slots] = np.asarray(perturbed[k])[used]
    replaced = np.zeros(n, bool)
    replaced[slots] = True
    source = np.full(n, -1, np.int64)
    source[slots] = used
    scores = np.concatenate([base, pert]) if pooled_stats else np.asarray(rows[reward_key])
    return Merged(rows, replaced, source, scores)
