"""Scoring sampled completions on the host: decode, run the task's reward (contained), count.

Every collector and the evaluator score through these functions, so a reward function that
raises, exits, hangs (on a process pool, the default) or returns garbage scores 0 and is
counted in `reward/failures_*` (`eval/reward_failures_*` in evaluation) wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rljax.data import decode_answers, decode_prompts
from rljax.data.tasks import Task
from rljax.models.tokenizer import Tokenizer, char_spans
from rljax.rewards import score_completions
from rljax.rewards.base import Outcome, check_value, failed_call, tally_outcomes

# (reward_fn, prompts, completions, answers) -> (rewards [B], failure counts): how rewards are
# computed, `score_completions` (in-process) or `score_on_shared_pool` (`build_scorer`).
Scorer = Callable[..., tuple[np.ndarray, dict[str, int]]]


class TaskReward:
    """`task.reward(completion, answer)` as a `RewardFn` a process pool can send its workers:
    it pickles with its task, and equals (hashes as) another of the same class and task
    object, so a pool pickles it once per run and sends it once per worker."""

    def __init__(self, task: Task):
        self.task = task

    def __call__(self, prompt: str, completion: str, answer: str) -> float:
        del prompt  # a task scores the completion against the answer
        return self.task.reward(completion, answer)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.task is self.task

    def __hash__(self) -> int:
        return hash((type(self), id(self.task)))

    def __repr__(self) -> str:
        return f"the reward of task {type(self.task).__name__}"


class TaskRewardComponents(TaskReward):
    """`task.reward_components(completion, answer)` as a `RewardFn` of K numbers, which a
    pool sends its workers as it does `TaskReward`."""

    def __call__(self, prompt: str, completion: str, answer: str) -> Any:
        del prompt
        return self.task.reward_components(completion, answer)

    def __repr__(self) -> str:
        return f"the reward components of task {type(self.task).__name__}"


def decode_completions(tokenizer: Tokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Completion texts, without the EOS and padding."""
    return [
        tokenizer.decode([int(t) for t, m in zip(row, keep) if m])
        for row, keep in zip(tokens, mask)
    ]


def score_rollout(
    task: Task,
    tokenizer: Tokenizer,
    prompts: dict,
    tokens,
    mask,
    repeats: int,
    scorer: Scorer = score_completions,
    grouped: bool = True,
    decode: Callable[[Tokenizer, np.ndarray, np.ndarray], list[str]] = decode_completions,
):
    """Rewards of decoded completions ([N * repeats]) and the reward-function failure counts.

    With `grouped`, a task with a `group_rewards(completions, answer)` method scores each
    prompt's `repeats` samples together (e.g. CRPS credit, a training signal), in this
    process; otherwise `scorer` runs `task.reward` on every completion (evaluation scores
    each answer on its own). `decode(tokenizer, tokens, mask)` turns completions into texts
    (a diffusion policy keeps special tokens visible: `rljax.diffusion.collect`).
    """
    texts = decode(tokenizer, np.asarray(tokens), np.asarray(mask))
    if grouped and hasattr(task, "group_rewards"):
        return score_groups(task.group_rewards, texts, decode_answers(prompts), repeats)
    return _score_each(TaskReward(task), tokenizer, prompts, texts, repeats, scorer)


def score_reward_components(
    task: Task,
    tokenizer: Tokenizer,
    prompts: dict,
    tokens,
    mask,
    repeats: int,
    scorer: Scorer = score_completions,
) -> tuple[np.ndarray, dict[str, int]]:
    """The task's reward components [N * repeats, K] of decoded completions (K: its
    `reward_component_names`) and the failure counts, scored by `scorer` as `score_rollout`
    scores the reward: a call that fails, or returns anything but K finite numbers, scores 0
    in every component."""
    texts = decode_completions(tokenizer, np.asarray(tokens), np.asarray(mask))
    fn, dims = TaskRewardComponents(task), len(task.reward_component_names)
    return _score_each(fn, tokenizer, prompts, texts, repeats, scorer, dims=dims)


def _score_each(
    fn: Any,
    tokenizer: Tokenizer,
    prompts: dict,
    texts: list[str],
    repeats: int,
    scorer: Scorer,
    **kwargs: Any,
) -> tuple[np.ndarray, dict[str, int]]:
    """`scorer` running `fn` on each of N * repeats completion texts, with its prompt's
    text and answer."""
    repeat = lambda xs: [x for x in xs for _ in range(repeats)]
    prompt_texts, answers = decode_prompts(prompts, tokenizer), decode_answers(prompts)
    return scorer(fn, repeat(prompt_texts), texts, repeat(answers), **kwargs)


def score_groups(
    group_rewards: Callable[[list[str], str], Any], texts: list[str], answers: list[str], g: int
) -> tuple[np.ndarray, dict[str, int]]:
    """Rewards [N * g] from a group reward function, one call per prompt, failures contained.

    A call that raises, or returns anything but g finite numbers, gives its whole group 0 and
    counts g failures of that kind (as `score_completions` does per completion).
    """
    outcomes: list[Outcome] = []
    for i, answer in enumerate(answers):
        try:
            values = list(group_rewards(texts[i * g : (i + 1) * g], answer))
        except (Exception, SystemExit) as err:  # contained, like score_completions
            reward, kind, detail = failed_call(err)
            outcomes += [(reward, kind, f"prompt {i}: {detail}")] * g
            continue
        if len(values) != g:
            outcomes += [(0.0, "wrong_type", f"prompt {i}: {len(values)} rewards, not {g}")] * g
            continue
        group = [check_value(v) for v in values]
        if any(kind is not None for _, kind, _ in group):
            kind, detail = next((k, d) for _, k, d in group if k is not None)
            group = [(0.0, kind, f"prompt {i}: {detail}")] * g
        outcomes += group
    return tally_outcomes(outcomes)


def score_rollout_tokens(
    task: Task, tokenizer: Tokenizer, prompts: dict, tokens, mask, repeats: int
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Rewards [N * repeats], per-token rewards [N * repeats, T] and failure counts, from the
    task's `token_rewards(completion, answer, spans) -> (reward, [n] token rewards)` (n: the
    row's real completion tokens, `spans` their character spans in the completion text).

    In this process, one completion after another (a code task's sandbox bounds each call's
    time); a call that raises or returns a non-finite or wrongly shaped result scores 0 on
    every token and is counted, as `score_completions` does.
    """
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    answers = [a for a in decode_answers(prompts) for _ in range(repeats)]
    outcomes: list[Outcome] = []
    per_token = np.zeros(tokens.shape, np.float32)
    for i, (row, keep, answer) in enumerate(zip(tokens, mask, answers)):
        ids = [int(t) for t in row[keep]]
        try:
            total, values = task.token_rewards(
                tokenizer.decode(ids), answer, char_spans(tokenizer, ids)
            )
        except (Exception, SystemExit) as err:  # contained, like score_completions
            outcomes.append(failed_call(err))
            continue
        values = np.asarray(values, np.float32)
        outcome = check_value(total)
        if outcome[1] is None and (values.shape != (len(ids),) or not np.isfinite(values).all()):
            outcome = (
                0.0,
                "wrong_type",
                f"token rewards of shape {values.shape}, not ({len(ids)},)",
            )
        outcomes.append(outcome)
        if outcome[1] is None:
            per_token[i, keep] = values
    rewards, failures = tally_outcomes(outcomes)
    return rewards, per_token, failures


def informative_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """[B/G] bool: groups whose [B] rewards (or [B, K] reward components: in any component)
    are not all equal (they carry a learning signal)."""
    r = np.asarray(rewards)
    r = r.reshape(len(r) // group_size, group_size, -1)
    return ~np.all(r == r[:, :1], axis=(1, 2))


def rollout_metrics(rewards: np.ndarray, completion_mask: np.ndarray) -> dict[str, float]:
    """Reward, accuracy and response-length statistics of sampled rows."""
    lengths = completion_mask.sum(axis=1)
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "accuracy": float((rewards >= 1.0).mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_frac": float((lengths == completion_mask.shape[1]).mean()),
    }


def eval_metrics(rewards: np.ndarray, failures: dict[str, int]) -> dict[str, float]:
    """A greedy evaluation's metrics: accuracy (reward >= 1) and mean reward of its [P]
    rewards, and its reward failures by kind as `eval/reward_failures_<kind>`."""
    rewards = np.asarray(rewards, np.float32)
    metrics = {
        "eval/accuracy": float((rewards >= 1.0).mean()),
        "eval/reward": float(rewards.mean()),
    }
    metrics.update({f"eval/reward_failures_{k}": float(v) for k, v in failures.items()})
    return metrics
