"""Draws: one prompt batch sampled and scored, and the hooks that wrap a draw.

A `Draw` is `(policies, step, attempt) -> Drawn`. `RolloutDraw` is the plain one; each hook
wraps another draw and adds one method's need, so they compose like transforms:

  WithGreedyBaseline(WithRescue(WithFeedback(RolloutDraw(...), ...), ...), ...)

- `WithFeedback`: a prompt selector (HeaPA, DARE, curriculum) sees every drawn batch's rewards
  and rollouts; DARE rescores them with the current and the sampling policy.
- `WithRescue`: LoPE replaces failures of all-failed groups by correct completions sampled
  behind perturbed prompts (`rljax.train.lope`).
- `WithGreedyBaseline`: ReMax decodes each prompt greedily with the current policy and puts
  the greedy completion's reward in `extras["baseline_reward"]` ("ReMax: A Simple, Effective,
  and Efficient Reinforcement Learning Method for Aligning Large Language Models",
  arXiv 2310.10505).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from rljax.advantages.reward_components import REWARD_COMPONENTS
from rljax.core.state import TrainState
from rljax.data.selected import SelectedPromptBatches
from rljax.data.tasks import Task
from rljax.models.tokenizer import Tokenizer
from rljax.rewards import score_completions
from rljax.rollout.rescore import ROLLOUT_KEYS
from rljax.rollout.sampler import Rollout
from rljax.train.collector import Draw, Drawn
from rljax.train.host_batch import HostBatch
from rljax.train.lockstep import gather_batch, gather_rows, own_batch, own_rows
from rljax.train.lope import LoPERescue
from rljax.train.scoring import (
    Scorer,
    score_reward_components,
    score_rollout,
    score_rollout_tokens,
)
from rljax.train.staleness import Policies
from rljax.train.timing import add_time, timed

# (state, prompt_tokens [N, P], prompt_mask [N, P], attempt) -> Rollout of N * G rows.
RolloutFn = Callable[[TrainState, np.ndarray, np.ndarray, int], Rollout]
# (state, prompt_tokens, prompt_mask, completion_tokens, completion_mask) -> [B, T] log-probs.
StateLogprobsFn = Callable[..., np.ndarray | jax.Array]


class RolloutDraw:
    """Draws the next prompt batch, samples G completions of each with the sampler's policy and
    scores them (`rljax.train.scoring`, contained: a failing reward scores 0 and is counted).

    Args:
      data: prompt batches (`rljax.data.prompt_batches` or a selector's).
      rollout: the sampler (`RolloutFn`); `attempt` salts refill draws' randomness.
      task: scores completions against answers.
      tokenizer: decodes completions.
      group_size: G, samples per prompt.
      scorer: runs the task's reward over decoded completions.
      token_level: score with the task's `token_rewards` and keep them as "token_rewards"
        [B, T] (GAE credits each token its own reward).
      components: also score the task's `reward_components` and keep them as
        "reward_components" [B, K] (GDPO, GPRL); their failures count with the reward's.
    """

    def __init__(
        self,
        data: Iterator[dict[str, Any]],
        rollout: RolloutFn,
        task: Task,
        tokenizer: Tokenizer,
        group_size: int,
        scorer: Scorer = score_completions,
        token_level: bool = False,
        components: bool = False,
    ):
        self.data = data
        self.rollout = rollout
        self.task = task
        self.tokenizer = tokenizer
        self.group_size = group_size
        self.scorer = scorer
        self.token_level = token_level
        self.components = components

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        del step  # the rollout's key comes from the state's step and the attempt
        prompts = next(self.data)
        in_flight = {} if policies.in_flight is None else {"in_flight": policies.in_flight}
        out, rollout_s = timed(
            self.rollout,
            policies.sampler,
            prompts["prompt_tokens"],
            prompts["prompt_mask"],
            attempt,
            **in_flight,
        )
        start, g, token_rewards = time.perf_counter(), self.group_size, None
        completions = (self.task, self.tokenizer, prompts, out.completion_tokens)
        if self.token_level:
            rewards, token_rewards, failures = score_rollout_tokens(
                *completions, out.completion_mask, g
            )
        else:
            rewards, failures = score_rollout(*completions, out.completion_mask, g, self.scorer)
        rows = HostBatch.from_rollout(out, prompts["index"], rewards, g)
        if token_rewards is not None:
            rows = rows.with_rows(token_rewards=token_rewards)
        if self.components:
            parts, part_failures = score_reward_components(
                *completions, out.completion_mask, g, self.scorer
            )
            rows = rows.with_rows(**{REWARD_COMPONENTS: parts})
            failures = {k: v + part_failures[k] for k, v in failures.items()}
        metrics = {f"reward/failures_{k}": float(v) for k, v in failures.items()}
        metrics["time/rollout_s"] = rollout_s
        metrics["time/reward_s"] = time.perf_counter() - start
        return Drawn(prompts, rows, metrics)

    def step_metrics(self) -> dict[str, float]:
        return {}


class WithFeedback:
    """Hands each drawn batch's rewards [n, G] and rollouts back to its prompt selector.

    Args:
      inner: the draw whose `data` is `selected`.
      selected: the prompt selector's batches (`rljax.data.selected.SelectedPromptBatches`).
      logprobs: `Steps.logprobs` over rows every process holds whole
        (`rljax.train.lockstep.shared_logprobs`), bound by state here: DARE scores stored
        rollouts with the current policy and fed-back ones with the policy that sampled them.
    """

    def __init__(self, inner: Draw, selected: SelectedPromptBatches, logprobs: StateLogprobsFn):
        self.inner = inner
        self.selected = selected
        self.logprobs = logprobs

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        self.selected.set_policy(
            functools.partial(self.logprobs, policies.current),
            functools.partial(self.logprobs, policies.behaviour),
        )
        drawn = self.inner(policies, step, attempt)
        g = drawn.rows.group_size
        # The selector is whole and equal on every process: it hears every process's groups.
        rows = gather_rows({k: drawn.rows.rows[k] for k in ("rewards", *ROLLOUT_KEYS)})
        rewards = rows.pop("rewards").reshape(-1, g)
        self.selected.feedback(gather_rows({"position": drawn.prompts["position"]}), rewards, rows)
        return drawn

    def step_metrics(self) -> dict[str, float]:
        return {**self.inner.step_metrics(), **self.selected.metrics()}


class WithRescue:
    """LoPE: all-failed groups of each draw get correct completions from perturbed prompts.

    Args:
      inner: the draw to rescue.
      lope: the rescue (`rljax.train.lope.LoPERescue`).
      rollout: the perturbed prompts' sampler (`RolloutFn`, `rollouts_per_perturbed` samples
        per prompt) over prompts every process holds whole
        (`rljax.train.lockstep.shared_rollout`), run with the current policy.
      logprobs: as `WithFeedback`'s; replaced samples are rescored by the current policy.
    """

    def __init__(
        self, inner: Draw, lope: LoPERescue, rollout: RolloutFn, logprobs: StateLogprobsFn
    ):
        self.inner = inner
        self.lope = lope
        self.rollout = rollout
        self.logprobs = logprobs

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        drawn = self.inner(policies, step, attempt)
        # Every process rescues the whole batch (the same groups, the same perturbed
        # rollouts) and keeps its own block.
        groups = gather_batch(drawn.rows).grouped()
        rescued, seconds = timed(
            self.lope,
            step,
            functools.partial(self.rollout, policies.current),
            functools.partial(self.logprobs, policies.current),
            gather_rows(drawn.prompts),
            groups,
            attempt,
        )
        metrics = {**drawn.metrics, **rescued}
        add_time(metrics, "time/rollout_s", seconds)  # mostly sampling; its scoring is cheap
        rows = own_batch(HostBatch.from_groups(groups, drawn.rows.group_size))
        return Drawn(drawn.prompts, rows, metrics)

    def step_metrics(self) -> dict[str, float]:
        return self.inner.step_metrics()


class WithGreedyBaseline:
    """ReMax's baseline: each prompt decoded greedily by the current policy, then scored.

    Args:
      inner: the draw.
      greedy: `(state, prompt_tokens, prompt_mask) -> Rollout` of one greedy row per prompt,
        given every process's prompts (`rljax.train.lockstep.shared_rollout`).
      task, tokenizer, scorer: as for `RolloutDraw`.
    """

    def __init__(
        self,
        inner: Draw,
        greedy: Callable[[TrainState, np.ndarray, np.ndarray], Rollout],
        task: Task,
        tokenizer: Tokenizer,
        scorer: Scorer = score_completions,
    ):
        self.inner = inner
        self.greedy = greedy
        self.task = task
        self.tokenizer = tokenizer
        self.scorer = scorer

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        drawn = self.inner(policies, step, attempt)
        prompts = drawn.prompts
        whole = gather_rows({k: prompts[k] for k in ("prompt_tokens", "prompt_mask")})
        out, rollout_s = timed(
            self.greedy, policies.current, whole["prompt_tokens"], whole["prompt_mask"]
        )
        mine = own_rows({"tokens": out.completion_tokens, "mask": out.completion_mask})
        start = time.perf_counter()
        rewards, _ = score_rollout(
            self.task, self.tokenizer, prompts, mine["tokens"], mine["mask"], 1, self.scorer
        )
        baseline = np.repeat(np.asarray(rewards), drawn.rows.group_size)
        metrics = dict(drawn.metrics)
        add_time(metrics, "time/rollout_s", rollout_s)
        add_time(metrics, "time/reward_s", time.perf_counter() - start)
        rows = drawn.rows.with_rows(baseline_reward=baseline)
        return Drawn(prompts, rows, metrics)

    def step_metrics(self) -> dict[str, float]:
        return self.inner.step_metrics()
