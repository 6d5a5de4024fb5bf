"""Host side of an RL iteration: prompts -> sampled, scored rollout batch.

Sampling runs in the jitted rollout step; decoding and rewards run here on the host. Two
algorithm needs are met here because they need more generation than one rollout:
- DAPO's dynamic sampling with refill ("DAPO: An Open-Source LLM Reinforcement Learning System
  at Scale", arXiv 2503.14476): groups whose rewards are all equal carry no signal, so more
  prompts are drawn and sampled until the batch holds `prompts_per_step` informative groups
  (at most `max_refill_rounds` extra rounds; if still short, all-equal groups fill the rest and
  the dynamic-sampling transform masks them out).
- ReMax's greedy baseline ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning
  Method for Aligning Large Language Models", arXiv 2310.10505): each prompt is also decoded
  greedily and scored; the score goes to `batch.extras["baseline_reward"]`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax.core.batch import Batch, make_batch
from rljax.data import decode_answers, decode_prompts
from rljax.data.tasks import Task
from rljax.models.tokenizer import Tokenizer, char_spans
from rljax.rewards import score_completions
from rljax.rewards.base import Outcome, check_value, tally_outcomes
from rljax.rollout.cuts import training_rollout_logprobs
from rljax.rollout.sampler import Rollout

# (prompt_tokens [N, P], prompt_mask [N, P], attempt) -> Rollout of N * n_samples rows.
RolloutFn = Callable[[jax.Array, jax.Array, int], Rollout]
# (reward_fn, prompts, completions, answers) -> (rewards [B], failure counts): how rewards are
# computed, `score_completions` (in-process) or a partial of `score_completions_parallel`.
Scorer = Callable[..., tuple[np.ndarray, dict[str, int]]]


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
):
    """Rewards of decoded completions ([N * repeats]) and the reward-function failure counts.

    A task with a `group_rewards(completions, answer)` method scores each prompt's `repeats`
    samples together (e.g. CRPS credit), in this process; otherwise `scorer` runs
    `task.reward` on every completion.
    """
    texts = decode_completions(tokenizer, np.asarray(tokens), np.asarray(mask))
    if hasattr(task, "group_rewards"):
        return score_groups(task.group_rewards, texts, decode_answers(prompts), repeats)
    repeat = lambda xs: [x for x in xs for _ in range(repeats)]
    return scorer(
        lambda p, c, a: task.reward(c, a),
        repeat(decode_prompts(prompts, tokenizer)),
        texts,
        repeat(decode_answers(prompts)),
    )


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
        except Exception as err:  # contained by design, like score_completions
            outcomes += [(0.0, "exception", f"prompt {i}: {err!r}")] * g
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
        except Exception as err:  # contained by design, like score_completions
            outcomes.append((0.0, "exception", repr(err)))
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
    """[B/G] bool: groups whose rewards are not all equal (they carry a learning signal)."""
    r = np.asarray(rewards).reshape(-1, group_size)
    return ~np.all(r == r[:, :1], axis=1)


def collect_batch(
    rollout: RolloutFn,
    data: Iterator[dict[str, Any]],
    task: Task,
    tokenizer: Tokenizer,
    n_samples: int,
    max_refill_rounds: int = 0,
    greedy: Callable[[jax.Array, jax.Array], Rollout] | None = None,
    scorer: Scorer = score_completions,
    feedback: Callable[[dict[str, Any], np.ndarray, dict[str, np.ndarray]], None] | None = None,
    rescue: Callable[[dict[str, Any], dict[str, np.ndarray], int], dict[str, float]] | None = None,
    token_level: bool = False,
) -> tuple[Batch, dict[str, float]]:
    """Draws prompts, samples `n_samples` completions each, scores them and builds the `Batch`.

    Args:
      rollout: the jitted rollout step bound to the current train state; `attempt` salts its
        randomness so refill rounds draw fresh samples.
      data: prompt batches (`prompt_batches`), each of `prompts_per_step` prompts.
      task: scores completions against answers.
      tokenizer: decodes completions.
      n_samples: G, completions per prompt.
      max_refill_rounds: extra prompt batches to draw when groups have all-equal rewards (0
        keeps every group of the first draw).
      greedy: when given, decodes each prompt greedily (one row per prompt) for ReMax's baseline.
      scorer: runs the task's reward over the decoded completions (`Scorer`).
      feedback: called with every drawn prompt batch, its rewards [n_prompts, G] and its
        rollouts ([n_prompts * G] rows of prompt/completion tokens and masks) once scored,
        kept or not (a prompt selector's update, `SelectedPromptBatches.feedback`).
      rescue: called with every drawn prompt batch, its per-group rows (arrays
        [n_prompts, G, ...]: prompt_tokens, prompt_mask, completion_tokens, completion_mask,
        rollout_logprobs, rewards, and prompt_id [n_prompts]) and the draw's attempt number;
        may replace entries of the dict before the informative groups are counted (LoPE,
        `rljax.train.lope`) and returns metrics, summed over draws.
      token_level: score with the task's `token_rewards` (`score_rollout_tokens`, in this
        process) and put them in `extras["token_rewards"]` [B, T] (GAE uses them).

    Returns:
      The batch (rows grouped by prompt; `extras["prompt_id"]` holds each sample's task index)
      and host metrics: reward/accuracy/length statistics of the kept rows, reward-function
      failures, and with refill "refill/rounds", "refill/informative_frac" (of the first draw)
      and "refill/short_groups" (all-equal groups that had to fill the batch).
    """
    if max_refill_rounds < 0:
        raise ValueError(f"max_refill_rounds={max_refill_rounds} must be >= 0")
    kept: list[dict[str, np.ndarray]] = []
    spare: list[dict[str, np.ndarray]] = []
    failures: dict[str, float] = {}
    metrics: dict[str, float] = {}
    wanted = None
    for attempt in range(max_refill_rounds + 1):
        prompts = next(data)
        tokens, mask = jnp.asarray(prompts["prompt_tokens"]), jnp.asarray(prompts["prompt_mask"])
        out = rollout(tokens, mask, attempt)
        token_rewards = None
        if token_level:
            rewards, token_rewards, fails = score_rollout_tokens(
                task, tokenizer, prompts, out.completion_tokens, out.completion_mask, n_samples
            )
        else:
            rewards, fails = score_rollout(
                task,
                tokenizer,
                prompts,
                out.completion_tokens,
                out.completion_mask,
                n_samples,
                scorer,
            )
        if feedback is not None:
            rollouts = {
                "prompt_tokens": out.prompt_tokens,
                "prompt_mask": out.prompt_mask,
                "completion_tokens": out.completion_tokens,
                "completion_mask": out.completion_mask,
            }
            feedback(prompts, np.asarray(rewards).reshape(-1, n_samples), rollouts)
        for k, v in fails.items():
            failures[k] = failures.get(k, 0) + v
        groups = _groups(prompts, out, rewards, n_samples)
        if token_rewards is not None:
            groups["token_rewards"] = token_rewards.reshape(
                len(rewards) // n_samples, n_samples, -1
            )
        if rescue is not None:
            for k, v in rescue(prompts, groups, attempt).items():
                metrics[k] = metrics.get(k, 0.0) + v
        rewards = groups["rewards"].reshape(-1)
        if greedy is not None:
            _add_greedy_baseline(groups, greedy, prompts, task, tokenizer, n_samples, scorer)
        wanted = len(groups["prompt_id"])
        good = informative_groups(rewards, n_samples)
        if max_refill_rounds == 0:
            kept.append(groups)
            break
        if attempt == 0:
            metrics["refill/informative_frac"] = float(good.mean())
        kept.append(_take(groups, good))
        spare.append(_take(groups, ~good))
        metrics["refill/rounds"] = float(attempt)
        if sum(len(g["prompt_id"]) for g in kept) >= wanted:
            break
    rows = _concat(kept)
    short = wanted - len(rows["prompt_id"])
    if short > 0:
        rows = _concat([rows, _concat(spare)])
    if max_refill_rounds:
        metrics["refill/short_groups"] = float(max(short, 0))
    rows = {k: v[:wanted] for k, v in rows.items()}
    batch = groups_to_batch(rows, n_samples)
    metrics.update(rollout_metrics(np.asarray(batch.rewards), np.asarray(batch.completion_mask)))
    metrics.update({f"reward/failures_{k}": float(v) for k, v in failures.items()})
    return batch, metrics


def _groups(prompts, out: Rollout, rewards: np.ndarray, g: int) -> dict[str, np.ndarray]:
    """Per-group arrays, leading dim = number of prompts (samples stacked on axis 1)."""
    n = len(prompts["prompt_tokens"])

    def per_group(x):
        x = np.asarray(x)
        return x.reshape(n, g, *x.shape[1:])

    groups = {
        "prompt_tokens": per_group(out.prompt_tokens),
        "prompt_mask": per_group(out.prompt_mask),
        "completion_tokens": per_group(out.completion_tokens),
        "completion_mask": per_group(out.completion_mask),
        # CUTS rows train on the policy's log-probs (treated as on-policy, as the paper does).
        "rollout_logprobs": per_group(
            training_rollout_logprobs(out.sampling_logprobs, out.policy_logprobs, out.cuts_rows)
        ),
        "rewards": per_group(rewards),
        "prompt_id": np.asarray(prompts["index"]).astype(np.int64),
    }
    if out.routes is not None:  # MoE: the expert choices, replayed in training
        groups["routes"] = per_group(out.routes)
    return groups


def _add_greedy_baseline(groups, greedy, prompts, task, tokenizer, g: int, scorer) -> None:
    out = greedy(jnp.asarray(prompts["prompt_tokens"]), jnp.asarray(prompts["prompt_mask"]))
    rewards, _ = score_rollout(
        task, tokenizer, prompts, out.completion_tokens, out.completion_mask, 1, scorer
    )
    groups["baseline_reward"] = np.repeat(rewards[:, None], g, axis=1)


def _take(groups: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[keep] for k, v in groups.items()}


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def groups_to_batch(rows: dict[str, np.ndarray], g: int) -> Batch:
    """A `Batch` of per-group rows (arrays [n, G, ...] as `collect_batch` builds them, and
    prompt_id [n]): row i*G + j is sample j of group i."""
    n = len(rows["prompt_id"])
    flat = lambda x: x.reshape(n * g, *x.shape[2:])
    ids = np.repeat(np.asarray(rows["prompt_id"], np.int64), g) % 2**31
    extras = {"prompt_id": jnp.asarray(ids, jnp.int32)}
    for key in ("baseline_reward", "token_rewards"):
        if key in rows:
            extras[key] = jnp.asarray(flat(rows[key]), jnp.float32)
    if "routes" in rows:
        extras["routes"] = jnp.asarray(flat(rows["routes"]), jnp.int32)
    return make_batch(
        flat(rows["prompt_tokens"]),
        flat(rows["prompt_mask"]),
        flat(rows["completion_tokens"]),
        flat(rows["completion_mask"]),
        np.repeat(np.arange(n), g),
        flat(rows["rewards"]),
        rollout_logprobs=flat(rows["rollout_logprobs"]),
        extras=extras,
    )


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
