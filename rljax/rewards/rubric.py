"""Rubric rewards: a judge scores a response on weighted rubric items, failures contained.

After "ARES: Automated Rubric synthEsis for Scalable RL" (interpretation; only the abstract was
available), which trains on question-specific weighted rubrics: a rubric is a list of items, each
a criterion text and a weight, and every sample may carry its own question's rubric; a pluggable
judge scores how well a response meets each item, in [0, 1]; the reward is the weighted sum.
The per-item scores are returned too, as a [K] vector per response, for methods that take one
advantage per reward dimension (GPRL, spec section 11).

Weights (interpretation): an item with a positive weight is a quality the response should have;
an item with a negative weight is a pitfall, and its judge score says how much the response
falls into it. The reward is sum_i w_i s_i / sum_{w_i > 0} w_i, so a response that meets every
positive item and no pitfall scores 1, pitfalls pull it below (down to
-sum |w_neg| / sum w_pos), and zero-weight items are scored (visible in the vector) but do not
count.

A judge call that raises, returns a non-number, a non-finite number or a number outside [0, 1]
scores that item 0 and is counted by kind, as `rewards.base.score_completions` does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from rljax.rewards.base import FAILURE_KINDS, score_one

Judge = Callable[[str, str, str], float]
"""judge(question, response, item_text) -> score in [0, 1] of how well the response meets it."""

RUBRIC_FAILURE_KINDS = FAILURE_KINDS  # "out_of_range": a judge score outside [0, 1]

_log = logging.getLogger(__name__)
_QUOTED = re.compile(r'"([^"]+)"')


class RubricItem(NamedTuple):
    """One criterion: its text for the judge and its weight (negative: a pitfall)."""

    text: str
    weight: float


def _check_rubric(rubric: Sequence[RubricItem]) -> np.ndarray:
    """[K] weights of a valid rubric."""
    weights = np.array([float(item.weight) for item in rubric], np.float64)
    if not np.all(np.isfinite(weights)) or not np.any(weights > 0):
        raise ValueError(
            f"rubric weights {weights.tolist()} must be finite with at least one positive "
            "weight (the reward is normalised by the sum of the positive weights)"
        )
    return weights


def keyword_judge(question: str, response: str, item_text: str) -> float:
    """A deterministic judge for tests and examples: the fraction of the item's quoted terms
    ("...") that occur in the response, case-insensitively.

    Raises:
      ValueError: if the item quotes no term (a rubric written for another judge).
    """
    del question  # the keyword judge looks at the response only
    terms = _QUOTED.findall(item_text)
    if not terms:
        raise ValueError(f'item {item_text!r:.80} quotes no term; write terms as "term"')
    text = response.lower()
    return sum(term.lower() in text for term in terms) / len(terms)


def _judge_items(
    judge: Judge,
    question: str,
    response: str,
    rubric: Sequence[RubricItem],
    failures: dict[str, int],
    first: dict[str, str],
    timeout_s: float | None,
) -> np.ndarray:
    """[K] item scores, failed items 0; updates the failure counts and first details."""
    scores = np.zeros(len(rubric), np.float64)
    for k, item in enumerate(rubric):
        score, kind, detail = score_one(judge, question, response, item.text, timeout_s)
        if kind is None and not 0.0 <= score <= 1.0:
            score, kind, detail = 0.0, "out_of_range", f"got {score!r}"
        if kind is not None:
            failures[kind] += 1
            first.setdefault(kind, f"item {k} ({item.text!r:.60}): {detail}")
        scores[k] = score
    return scores


def rubric_rewards(
    judge: Judge,
    questions: Sequence[str],
    responses: Sequence[str],
    rubrics: Sequence[Sequence[RubricItem]],
    timeout_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Rubric rewards and per-item score vectors of B responses.

    Args:
      judge: `Judge`, e.g. an LLM judge or `keyword_judge`.
      questions, responses: B strings each.
      rubrics: B rubrics (one per sample; samples of a prompt share one), each of the same
        length K so the score vectors stack; pad a shorter rubric with zero-weight items.
      timeout_s: soft per-judge-call time limit (as in `score_completions`); None for none.

    Returns:
      rewards: [B] float32, sum_i w_i s_i / sum_{w_i > 0} w_i (module docstring).
      scores: [B, K] float32 item scores s_i in [0, 1], 0 for failed judge calls.
      failures: count of failed judge calls per kind, every kind of `RUBRIC_FAILURE_KINDS`.

    Raises:
      ValueError: if the lengths differ, rubrics differ in length, or a rubric has no
        positive weight or a non-finite one.
    """
    b = len(questions)
    if not b == len(responses) == len(rubrics):
        raise ValueError(
            f"got {b} questions, {len(responses)} responses and {len(rubrics)} rubrics; pass "
            "one of each per sample"
        )
    sizes = sorted({len(r) for r in rubrics})
    if len(sizes) > 1:
        raise ValueError(
            f"rubrics have {sizes} items; score vectors need one length K, so pad the shorter "
            "rubrics with zero-weight items"
        )
    failures = dict.fromkeys(RUBRIC_FAILURE_KINDS, 0)
    first: dict[str, str] = {}
    k = sizes[0] if sizes else 0
    rewards, scores = np.zeros(b, np.float32), np.zeros((b, k), np.float32)
    for i, (question, response, rubric) in enumerate(zip(questions, responses, rubrics)):
        weights = _check_rubric(rubric)
        scores[i] = _judge_items(judge, question, response, rubric, failures, first, timeout_s)
        rewards[i] = weights @ scores[i].astype(np.float64) / weights[weights > 0].sum()
    for kind, detail in first.items():
        _log.warning(
            "judge failure %r on %d of %d item calls, which scored 0 (first, %s)",
            kind,
            failures[kind],
            b * k,
            detail,
        )
    return rewards, scores, failures


def rubric_reward(
    judge: Judge, question: str, response: str, rubric: Sequence[RubricItem]
) -> tuple[float, np.ndarray, dict[str, int]]:
    """Rubric reward, [K] item scores and judge failures of one response (`rubric_rewards`)."""
    rewards, scores, failures = rubric_rewards(judge, [question], [response], [rubric])
    return float(rewards[0]), scores[0], failures
