"""Episodes as token rows: the engine's `TurnHandler` over contained `Episode`s, the per-row
fields a multi-turn batch carries, and scripted episodes laid out as SFT rows.

`EpisodeTurns` plays one `rljax.envs.Episode` per rollout row: when the engine hands it a
policy turn, it decodes the turn, steps the environment on a worker pool (the engine decodes
other rows meanwhile) and answers with the observation rendered in the chat format and
tokenized, or None when the episode is over: done, failed (raised, timed out, garbage), out
of turns, or out of token budget (the turn ran to the budget, or the observation would leave
the policy no column to answer in: failure "token_budget", rewards so far kept).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rljax.envs.base import Episode, EpisodeResult
from rljax.envs.chat import ChatFormat
from rljax.models.tokenizer import Tokenizer


class EpisodeTurns:
    """A `rljax.rollout.turns.TurnHandler` over `episodes` (row i plays `episodes[i]`, already
    started: an episode whose start failed ends at its first turn).

    Args:
      episodes: one per rollout row.
      tokenizer: decodes turns (special tokens such as the EOS dropped) and encodes
        observations.
      chat: renders observations in the model's chat convention.
      executor: runs environment steps (threads: steps are contained by their own limits).
      overlap: let the engine decode while steps run (`rljax.rollout.turns.TurnHandler`);
        False keeps rollouts bit-identical whatever the threads' timing.
    """

    def __init__(
        self,
        episodes: Sequence[Episode],
        tokenizer: Tokenizer,
        chat: ChatFormat,
        executor: concurrent.futures.Executor,
        overlap: bool = False,
    ):
        self.episodes, self.tokenizer, self.chat = episodes, tokenizer, chat
        self.executor, self.overlap = executor, overlap
        self._running: dict[concurrent.futures.Future, int] = {}
        self._ready: dict[int, np.ndarray | None] = {}

    def end_turn(self, row: int, tokens: np.ndarray, room: int) -> None:
        """Steps row `row`'s episode with the decoded turn, in the background."""
        episode = self.episodes[row]
        if episode.over:  # its start failed
            self._ready[row] = None
        elif room == 0:  # the turn ran to the end of the budget: no complete action
            episode.stop("token_budget")
            self._ready[row] = None
        else:
            action = self.tokenizer.decode([int(t) for t in tokens])
            self._running[self.executor.submit(self._step, episode, action, room)] = row

    def _step(self, episode: Episode, action: str, room: int) -> np.ndarray | None:
        observation = episode.act(action)
        if observation is None:
            return None
        tokens = self.tokenizer.encode(self.chat.render_observation(observation))
        if not 0 < len(tokens) < room:
            episode.stop("token_budget")
            return None
        return np.asarray(tokens, np.int32)

    def observations(self, wait: bool) -> dict[int, np.ndarray | None]:
        """Observations of the steps that finished (blocking for one with `wait`)."""
        if wait and not self._ready and self._running:
            concurrent.futures.wait(self._running, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in [f for f in self._running if f.done()]:
            self._ready[self._running.pop(future)] = future.result()
        ready, self._ready = self._ready, {}
        return ready


def start_episodes(
    make_env: Callable[[], Any],
    tasks: Sequence[dict[str, Any]],
    executor: concurrent.futures.Executor,
    *,
    max_turns: int,
    time_limit_s: float,
) -> tuple[list[Episode], list[str | None]]:
    """One started `Episode` per task (resets run concurrently on `executor`) and each first
    observation (None where the start failed; the episode is then over)."""
    episodes = [
        Episode(make_env, task, max_turns=max_turns, time_limit_s=time_limit_s) for task in tasks
    ]
    firsts = list(executor.map(lambda episode: episode.start(), episodes))
    return episodes, firsts


def policy_turns(completion_mask: np.ndarray) -> np.ndarray:
    """[N] policy turns of each row: the runs of True in its [T] `completion_mask`."""
    mask = np.asarray(completion_mask, bool)
    starts = mask & ~np.concatenate([np.zeros((len(mask), 1), bool), mask[:, :-1]], axis=1)
    return starts.sum(axis=1)


def episode_fields(
    results: Sequence[EpisodeResult], completion_mask: np.ndarray, max_turns: int
) -> dict[str, np.ndarray]:
    """The multi-turn fields of a batch of episode rows.

    Returns:
      rewards [N] (each episode's total), turn_rewards [N, max_turns] (the environment's
      reward for the step after each turn; all 0 for an episode that failed with an error, as
      its total is), num_turns [N] (policy turns in the row, counted from the mask: a turn
      whose step failed or that ran out of budget is still one) and episode_success [N] (1.0
      where `EpisodeResult.success`).
    """
    n = len(results)
    turn_rewards = np.zeros((n, max_turns), np.float32)
    for i, result in enumerate(results):
        if not result.errored:
            rewards = [step.reward for _, step in result.turns][:max_turns]
            turn_rewards[i, : len(rewards)] = rewards
    return {
        "rewards": np.asarray([r.total_reward for r in results], np.float32),
        "turn_rewards": turn_rewards,
        "num_turns": policy_turns(completion_mask).astype(np.int32),
        "episode_success": np.asarray([r.success for r in results], np.float32),
    }


def episode_row(
    result: EpisodeResult, tokenizer: Tokenizer, chat: ChatFormat, width: int
) -> dict[str, np.ndarray]:
    """A played episode (e.g. by a scripted policy) as one completion row of `width` columns,
    laid out as the engine lays out sampled ones: each action's tokens and the EOS
    (completion_mask), the rendered observation after every turn but the last (env_mask).

    Raises:
      ValueError: if the episode does not fit in `width` columns.
    """
    tokens: list[int] = []
    policy: list[bool] = []
    for k, (action, step) in enumerate(result.turns):
        turn = [*tokenizer.encode(action), tokenizer.eos_id]
        tokens += turn
        policy += [True] * len(turn)
        if k + 1 < len(result.turns):
            observation = tokenizer.encode(chat.render_observation(step.observation))
            tokens += observation
            policy += [False] * len(observation)
    if len(tokens) > width:
        raise ValueError(f"an episode of {len(tokens)} tokens does not fit in {width} columns")
    row = np.full(width, tokenizer.pad_id, np.int32)
    row[: len(tokens)] = tokens
    policy_mask = np.zeros(width, bool)
    policy_mask[: len(policy)] = policy
    env_mask = np.zeros(width, bool)
    env_mask[: len(policy)] = ~np.asarray(policy, bool)
    return {"completion_tokens": row, "completion_mask": policy_mask, "env_mask": env_mask}
