"""The environment interface of multi-turn agentic RL, and a contained episode loop.

An `Environment` is pure host-side Python, one instance per episode: `reset(task)` gives the
first observation and each `step(action)` gives a `Step`. `run_episode` drives one episode with
any `policy(observations) -> action` callable (the rollout engine in training, a scripted policy
in tests), so every environment is testable without a model. Single-turn tasks enter the same
path as one-step environments (`SingleTurn`).

Why containment: an environment is user code, and one that raises, returns garbage or hangs
must not stop a long run. `run_episode` ends such an episode with total reward 0 and a failure
kind (`EPISODE_FAILURE_KINDS`), counted by `tally`; it never propagates. The time limit is
enforced on each environment call (construction with `reset`, then each `step`) by running it
in a daemon thread and abandoning it at the deadline. A thread cannot be killed: an abandoned
call runs on until it returns (as with `rljax.rewards.pool`'s kind="thread"), so this limit
bounds the episode's latency, not the work done; `rljax.envs.process_env` runs each
environment in a process of its own, killed at the limit. Exceptions from the policy are not
contained: they are the trainer's own.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from rljax.rewards.base import RewardFn

EPISODE_FAILURE_KINDS = ("raised", "timeout", "garbage", "turn_limit", "token_budget")
"""Values of `EpisodeResult.failure`; "turn_limit" and "token_budget" (the rollout's token
budget ran out) are counted but are not errors: the episode keeps its rewards so far."""
_NOT_ERRORS = ("turn_limit", "token_budget")

_ERROR_CHARS = 200


class Step(NamedTuple):
    """What an environment returns for one action."""

    observation: str
    reward: float
    done: bool
    info: dict


class Environment(Protocol):
    """One episode of an environment; host-side Python, built fresh for each episode."""

    def reset(self, task: Mapping[str, Any]) -> str:
        """Starts the episode on `task`; returns the first observation ("" when the prompt is
        the whole task)."""
        ...

    def step(self, action: str) -> Step:
        """Applies the policy's `action` (its decoded turn) and returns the outcome."""
        ...

    # Optional: close() -> None, called once when the episode ends (not after a timeout,
    # while a call may still be running), to release what the environment holds.


Policy = Callable[[list[str]], str]
"""policy(observations so far, the first from `reset`) -> the next action."""


class EpisodeResult(NamedTuple):
    """One episode: its turns, total reward and how it failed (None when it ended done)."""

    turns: list[tuple[str, Step]]
    total_reward: float
    failure: str | None
    error: str | None

    @property
    def errored(self) -> bool:
        """Whether the environment failed ("raised", "timeout", "garbage"): the episode then
        scores 0; running out of turns or token budget is not an error."""
        return self.failure is not None and self.failure not in _NOT_ERRORS

    @property
    def success(self) -> bool:
        """Whether the episode ended done and its last step did not report
        `info["success"] = False` (an environment that ends on a wrong final answer says so;
        one that ends only on a win need not)."""
        return self.failure is None and bool(self.turns[-1][1].info.get("success", True))


class _Failure(Exception):
    """An environment call failed; `kind` is one of `EPISODE_FAILURE_KINDS`."""

    def __init__(self, kind: str, error: str):
        super().__init__(error)
        self.kind, self.error = kind, error


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_ERROR_CHARS]


def _call_with_limit(fn: Callable[[], Any], time_limit_s: float, what: str) -> Any:
    """fn() run in a daemon thread, abandoned at the deadline; failures raise `_Failure`."""
    box: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # pylint: disable=broad-except  # contained, incl. sys.exit
            box["error"] = err
        finally:
            finished.set()

    threading.Thread(target=target, daemon=True, name=f"rljax-env-{what}").start()
    if not finished.wait(time_limit_s):
        raise _Failure("timeout", f"{what} ran past time_limit_s={time_limit_s}")
    if "error" in box:
        raise _Failure("raised", _one_line(f"{what} raised {box['error']!r}"))
    return box["value"]


def _as_float(number: numbers.Real) -> float:
    """float(number), or NaN when it has none (an int beyond any float)."""
    try:
        return float(number)
    except (OverflowError, TypeError, ValueError):
        return math.nan


def _check_step(value: Any) -> Step:
    """`value` as a Step, or `_Failure("garbage")` if it is not a well-formed Step-like tuple."""
    if not isinstance(value, tuple) or len(value) != 4:
        raise _Failure("garbage", _one_line(f"step returned {type(value).__name__} {value!r:.80}"))
    observation, reward, done, info = value
    problem = None
    if not isinstance(observation, str):
        problem = f"observation is {type(observation).__name__}, not str"
    elif not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        problem = f"reward is {type(reward).__name__}, not a number"
    elif not math.isfinite(_as_float(reward)):
        problem = f"reward is {reward!r:.80}"
    elif not isinstance(done, (bool, np.bool_)):
        problem = f"done is {type(done).__name__}, not bool"
    elif not isinstance(info, Mapping):
        problem = f"info is {type(info).__name__}, not a mapping"
    if problem:
        raise _Failure("garbage", _one_line(f"step returned a malformed Step: {problem}"))
    return Step(observation, float(reward), bool(done), dict(info))


class Episode:
    """One contained episode, played a turn at a time: the one path of `run_episode` (any
    policy callable) and of engine rollouts (`rljax.envs.episodes`, the model's turns).

    Args:
      make_env: builds a fresh environment (called once, in the same limited call as `reset`).
      task: the episode's task, passed to `reset`.
      max_turns: steps before the episode is cut off with failure "turn_limit".
      time_limit_s: limit on each environment call (make_env + reset, then each step).
    """

    def __init__(
        self,
        make_env: Callable[[], Environment],
        task: Mapping[str, Any],
        *,
        max_turns: int,
        time_limit_s: float,
    ):
        if max_turns < 1 or not time_limit_s > 0:
            raise ValueError(
                f"max_turns={max_turns} and time_limit_s={time_limit_s}: both must be positive"
            )
        self.make_env, self.task = make_env, task
        self.max_turns, self.time_limit_s = max_turns, time_limit_s
        self.turns: list[tuple[str, Step]] = []
        self.failure: str | None = None
        self.error: str | None = None
        self.over = False
        self._env: Environment | None = None

    def start(self) -> str | None:
        """Builds and resets the environment: the first observation, or None if that failed
        (the episode is then over)."""

        def start() -> str:
            self._env = self.make_env()  # kept before reset, so that `_end` can close it
            return self._env.reset(self.task)

        try:
            first = _call_with_limit(start, self.time_limit_s, "reset")
            if not isinstance(first, str):
                raise _Failure("garbage", f"reset returned {type(first).__name__}, not str")
        except _Failure as failure:
            self._end(failure.kind, failure.error)
            return None
        return first

    def act(self, action: str) -> str | None:
        """Steps the environment with `action`: the next observation, or None when the episode
        is over (done, failed, or out of turns)."""
        if self.over or self._env is None:
            raise RuntimeError("Episode.act on an episode that is over or was not started")
        env = self._env
        try:
            step = _check_step(
                _call_with_limit(lambda: env.step(action), self.time_limit_s, "step")
            )
        except _Failure as failure:
            self._end(failure.kind, failure.error)
            return None
        self.turns.append((action, step))
        if step.done:
            self._end(None, None)
        elif len(self.turns) >= self.max_turns:
            self._end("turn_limit", None)
        return None if self.over else step.observation

    def stop(self, kind: str) -> None:
        """Ends the episode from outside with `kind` (e.g. "token_budget"); rewards so far
        are kept."""
        if kind not in _NOT_ERRORS:
            raise ValueError(f"stop kind {kind!r} is not one of {_NOT_ERRORS}")
        if not self.over:
            self._end(kind, None)

    def _end(self, failure: str | None, error: str | None) -> None:
        """Ends the episode and closes its environment (`close()`, when it has one and no
        call of it is still running), contained like every call."""
        self.over, self.failure, self.error = True, failure, error
        close = getattr(self._env, "close", None)
        if failure != "timeout" and callable(close):
            try:
                _call_with_limit(close, self.time_limit_s, "close")
            except _Failure:  # the episode is over; its outcome stands
                pass

    def result(self) -> EpisodeResult:
        """The episode so far: on "raised", "timeout" or "garbage" total reward 0 and a
        one-line error; otherwise the sum of the rewards."""
        result = EpisodeResult(list(self.turns), 0.0, self.failure, self.error)
        if result.errored:
            return result
        return result._replace(total_reward=sum(step.reward for _, step in self.turns))


def run_episode(
    make_env: Callable[[], Environment],
    task: Mapping[str, Any],
    policy: Policy,
    *,
    max_turns: int,
    time_limit_s: float,
) -> EpisodeResult:
    """Plays one episode of `make_env()` on `task` with `policy`, containing every environment
    failure (see `Episode`).

    Returns:
      An `EpisodeResult`: on "raised", "timeout" or "garbage" the turns played so far, total
      reward 0 and a one-line error; on "turn_limit" the sum of the rewards so far.
    """
    episode = Episode(make_env, task, max_turns=max_turns, time_limit_s=time_limit_s)
    observation = episode.start()
    observations = []
    while observation is not None:
        observations.append(observation)
        observation = episode.act(policy(list(observations)))
    return episode.result()


def one_turn_reward(
    make_env: Callable[[], Environment],
    task: Mapping[str, Any],
    action: str,
    time_limit_s: float = 60.0,
) -> float:
    """The total reward of a contained episode of `make_env()` on `task` cut off after one
    turn that plays `action` (0 when the environment fails): the single-turn `Task.reward` of
    an episodic task."""
    result = run_episode(
        make_env, task, lambda observations: action, max_turns=1, time_limit_s=time_limit_s
    )
    return result.total_reward


def tally(results: Sequence[EpisodeResult]) -> dict[str, float]:
    """Metrics of a batch of episodes: `env/episodes`, `env/failed/<kind>` for every kind of
    `EPISODE_FAILURE_KINDS` (0 included, so curves start at 0), `env/mean_turns`, `env/mean_reward`
    (the means are 0 for no episodes)."""
    n = len(results)
    metrics = {"env/episodes": float(n)}
    for kind in EPISODE_FAILURE_KINDS:
        metrics[f"env/failed/{kind}"] = float(sum(r.failure == kind for r in results))
    metrics["env/mean_turns"] = sum(len(r.turns) for r in results) / n if n else 0.0
    metrics["env/mean_reward"] = sum(r.total_reward for r in results) / n if n else 0.0
    return metrics


class SingleTurn:
    """A single-turn task as a one-step environment, so both kinds of task take one path.

    The task is {"prompt": ..., "answer": ...}; `reset` returns "" (the prompt is the whole
    task) and `step` scores its one action with `reward_fn(prompt, action, answer)` (a
    `rljax.rewards.RewardFn`) and ends the episode.
    """

    def __init__(self, reward_fn: RewardFn):
        self.reward_fn = reward_fn
        self._task: Mapping[str, Any] | None = None

    def reset(self, task: Mapping[str, Any]) -> str:
        """Keeps the task's prompt and answer; the first observation is ""."""
        self._task = task
        return ""

    def step(self, action: str) -> Step:
        """The reward of `action` as the completion; done after one step."""
        if self._task is None:
            raise RuntimeError("SingleTurn.step before reset: call reset(task) first")
        reward = self.reward_fn(self._task["prompt"], action, self._task["answer"])
        return Step("", reward, True, {})
