"""Training on episodic tasks: the draw that plays a batch of multi-turn episodes with the
sampler's policy, the SFT warm start on scripted episodes, and the greedy evaluation.

An episodic task is a `rljax.data.tasks.Task` with `make_env()`, `env_task(answer)` and
`expert_policy(rng)` (`is_episodic`; e.g. `rljax.envs.guess_number.GuessNumberTask`): its
examples come from the same prompt pipeline as any task (so the data state, its checkpoint
and exact resume are the same), and each example is played as G episodes of
`make_env()` on `env_task(answer)`, each on its own decode slot of the rollout engine
(`rljax.rollout.turns`), environments stepping on a thread pool while the engine decodes.
The batch carries the policy's tokens (`completion_mask`), the observations (`env_mask`),
each episode's total reward (`rewards`) and its per-turn rewards and turn count
(`turn_rewards`, `num_turns`) for turn-level credit (`rljax.advantages.turns`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from rljax.data import decode_answers
from rljax.data.tasks import Task
from rljax.envs.base import Environment, Episode, EpisodeResult, run_episode, tally
from rljax.envs.chat import ChatFormat, get_chat_format
from rljax.envs.episodes import EpisodeTurns, episode_fields, episode_row, start_episodes
from rljax.envs.process_env import ISOLATIONS, process_factory
from rljax.models.config import TransformerConfig
from rljax.models.lora import merged_params
from rljax.models.tokenizer import Tokenizer, encode_prompts
from rljax.rollout.engine import Engine, EngineConfig
from rljax.rollout.sampler import Rollout
from rljax.rollout.sampling import SamplingParams
from rljax.rollout.turns import generate_turns
from rljax.train.builders import build_rollout_config
from rljax.train.collector import Drawn
from rljax.train.evaluation import sample_eval_plan
from rljax.train.host_batch import HostBatch
from rljax.train.prompts import Prompts, sft_on_batches
from rljax.train.staleness import Policies
from rljax.train.steps import RolloutConfig
from rljax.train.timing import add_time

# (state, prompt_tokens [N, P], prompt_mask [N, P], attempt, turns=handler) -> Rollout.
TurnsRolloutFn = Callable[..., Rollout]
_EPISODE_METHODS = ("make_env", "env_task", "expert_policy")


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
    """How a run plays episodes (`env.*` and `task.max_prompt_len`).

    Attributes:
      chat: the chat layout of prompts and observations.
      prompt_len: prompt width.
      time_limit_s: limit on each environment call.
      workers: threads stepping environments.
      overlap: decode while environments step (`rljax.rollout.turns.TurnHandler.overlap`).
      isolation: "thread" (environments in the trainer's threads) or "process" (a child
        process each, killed at the time limit: `rljax.envs.process_env`).
    """

    chat: ChatFormat
    prompt_len: int
    time_limit_s: float = 5.0
    workers: int = 8
    overlap: bool = False
    isolation: str = "thread"

    def env_factory(self, task: Task) -> Callable[[], Environment]:
        """The factory of `task`'s environments under this isolation."""
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"env.isolation={self.isolation!r} is not one of {ISOLATIONS}")
        if self.isolation == "process":
            return process_factory(task.make_env, self.time_limit_s)
        return task.make_env

    @classmethod
    def from_config(cls, config: ConfigDict) -> EpisodeSettings:
        e = config.env
        return cls(
            get_chat_format(e.chat_format),
            config.task.max_prompt_len,
            float(e.time_limit_s),
            int(e.workers),
            bool(e.overlap),
            str(e.isolation),
        )


def is_episodic(task: Task) -> bool:
    """Whether `task` is played as multi-turn episodes (it has `_EPISODE_METHODS`)."""
    return all(callable(getattr(task, name, None)) for name in _EPISODE_METHODS)


def episode_prompts(
    firsts: Sequence[str | None],
    group_size: int,
    tokenizer: Tokenizer,
    chat: ChatFormat,
    width: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompt tokens and mask [N / G, width] of the groups' first observations.

    The G episodes of one example share one prompt (the engine's shared prefix), so their
    environments must start alike; an episode whose start failed (None) takes its group's.

    Raises:
      ValueError: if one group's resets gave different observations, or a prompt is longer
        than `width` (`task.max_prompt_len`).
    """
    texts = []
    for start in range(0, len(firsts), group_size):
        seen = {first for first in firsts[start : start + group_size] if first is not None}
        if len(seen) > 1:
            raise ValueError(
                f"the {group_size} episodes of one example started with different observations "
                f"{sorted(seen)[:2]}: an episodic task's reset must be deterministic in its task"
            )
        texts.append(chat.render_prompt(seen.pop() if seen else ""))
    try:
        return encode_prompts(tokenizer, texts, width, add_bos=False)
    except ValueError as err:
        raise ValueError(f"an episode's first prompt: {err} (task.max_prompt_len={width})") from err


class GroupEpisodes(NamedTuple):
    """Started episodes of a batch of examples, ready for `generate_turns(..., handler,
    n_samples=G)`: G episodes per example (row i * G + g plays `episodes[i * G + g]`), their
    engine handler and the examples' prompts [examples, prompt_len]."""

    episodes: list[Episode]
    handler: EpisodeTurns
    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray

    def results(self) -> list[EpisodeResult]:
        """Every episode's result (after the rollout)."""
        return [episode.result() for episode in self.episodes]


def start_group_episodes(
    task: Task,
    answers: Sequence[str],
    group_size: int,
    tokenizer: Tokenizer,
    settings: EpisodeSettings,
    executor: concurrent.futures.Executor,
) -> GroupEpisodes:
    """G started episodes of each example (by its answer), on `executor`."""
    tasks = [task.env_task(a) for a in answers for _ in range(group_size)]
    episodes, firsts = start_episodes(
        settings.env_factory(task),
        tasks,
        executor,
        max_turns=task.max_turns,
        time_limit_s=settings.time_limit_s,
    )
    chat = settings.chat
    tokens, mask = episode_prompts(firsts, group_size, tokenizer, chat, settings.prompt_len)
    handler = EpisodeTurns(episodes, tokenizer, chat, executor, settings.overlap)
    return GroupEpisodes(episodes, handler, tokens, mask)


class EpisodeDraw:
    """Draws the next batch of examples and plays G episodes of each (a `Draw`).

    Args:
      data: prompt batches of the episodic task (their answers define the games).
      rollout: the engine's rollout step with a `turns=` handler (`Steps.rollout`).
      task: the episodic task.
      tokenizer: decodes turns, encodes observations.
      group_size: G, episodes per example.
      settings: how episodes are played.
      executor: steps environments (and starts them).
    """

    def __init__(
        self,
        data: Iterator[dict[str, Any]],
        rollout: TurnsRolloutFn,
        task: Task,
        tokenizer: Tokenizer,
        group_size: int,
        settings: EpisodeSettings,
        executor: concurrent.futures.Executor,
    ):
        self.data, self.rollout, self.task = data, rollout, task
        self.tokenizer, self.group_size = tokenizer, group_size
        self.settings, self.executor = settings, executor

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        del step  # the rollout's key comes from the state's step and the attempt
        prompts = next(self.data)
        start = time.perf_counter()
        group = start_group_episodes(
            self.task,
            decode_answers(prompts),
            self.group_size,
            self.tokenizer,
            self.settings,
            self.executor,
        )
        out = self.rollout(
            policies.sampler, group.prompt_tokens, group.prompt_mask, attempt, turns=group.handler
        )
        rows, metrics = episode_batch(
            out, group.results(), prompts["index"], self.group_size, self.task.max_turns
        )
        metrics["time/rollout_s"] = time.perf_counter() - start
        return Drawn(prompts, rows, metrics)

    def step_metrics(self) -> dict[str, float]:
        return {}


class WithGreedyEpisodes:
    """ReMax's baseline for episodes: each example played once more, greedily, by the current
    policy; its total reward becomes the example's `baseline_reward` (a `Draw` wrapper).

    Args:
      inner: the episode draw.
      engine: a greedy engine (`episode_engine(..., SamplingParams(greedy=True))`).
      task, tokenizer, settings, executor: as for `EpisodeDraw`.
    """

    def __init__(
        self,
        inner: EpisodeDraw,
        engine: Engine,
        task: Task,
        tokenizer: Tokenizer,
        settings: EpisodeSettings,
        executor: concurrent.futures.Executor,
    ):
        self.inner, self.engine, self.task = inner, engine, task
        self.tokenizer, self.settings, self.executor = tokenizer, settings, executor

    def __call__(self, policies: Policies, step: int, attempt: int) -> Drawn:
        drawn = self.inner(policies, step, attempt)
        answers = decode_answers(drawn.prompts)
        start = time.perf_counter()
        results = play_episodes(
            self.engine,
            merged_params(policies.current),
            self.task,
            self.tokenizer,
            self.settings,
            answers,
            len(answers),
            self.executor,
        )
        rewards = np.asarray([r.total_reward for r in results], np.float32)
        metrics = dict(drawn.metrics)
        add_time(metrics, "time/rollout_s", time.perf_counter() - start)
        metrics["env/greedy_success"] = float(np.mean([r.success for r in results]))
        baseline = np.repeat(rewards, drawn.rows.group_size)
        return Drawn(drawn.prompts, drawn.rows.with_rows(baseline_reward=baseline), metrics)

    def step_metrics(self) -> dict[str, float]:
        return self.inner.step_metrics()


def episode_batch(
    out: Rollout,
    results: Sequence[EpisodeResult],
    prompt_ids: np.ndarray,
    group_size: int,
    max_turns: int,
) -> tuple[HostBatch, dict[str, float]]:
    """The HostBatch of a multi-turn rollout and its episodes (`max_turns` columns of turn
    rewards), and their metrics (`rljax.envs.tally` and env/success, the fraction of successful
    episodes)."""
    mask = np.asarray(out.completion_mask)
    fields = episode_fields(results, mask, max_turns)
    rows = HostBatch.from_rollout(out, prompt_ids, fields["rewards"], group_size).with_rows(
        turn_rewards=fields["turn_rewards"], num_turns=fields["num_turns"]
    )
    metrics = tally(results)
    metrics["env/success"] = float(fields["episode_success"].mean())
    return rows, metrics


def scripted_episode_rows(
    task: Task,
    tokenizer: Tokenizer,
    settings: EpisodeSettings,
    width: int,
    count: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """SFT rows of `count` train examples played by the task's expert policy: prompt tokens
    and mask [count, settings.prompt_len], completion tokens, completion_mask (the expert's
    turns and their EOS: the SFT targets) and env_mask (observations: context only)
    [count, width].

    Raises:
      ValueError: if a scripted episode fails (its environment or expert is broken).
    """
    rng = np.random.default_rng(seed)
    make_env = settings.env_factory(task)
    rows: list[dict[str, np.ndarray]] = []
    firsts: list[str | None] = []
    # One after the other: the expert draws from one generator in the order it plays.
    bar = tqdm(
        range(count),
        desc="scripted episodes",
        unit="episode",
        dynamic_ncols=True,
        disable=jax.process_index() != 0,
    )
    for index in bar:
        answer = task.example(index, "train")["answer"]
        policy = task.expert_policy(rng)
        seen: list[str] = []

        def play(observations: list[str], policy=policy, seen=seen) -> str:
            seen[:] = observations[:1]
            return policy(observations)

        result = run_episode(
            make_env,
            task.env_task(answer),
            play,
            max_turns=task.max_turns,
            time_limit_s=settings.time_limit_s,
        )
        if result.errored:
            raise ValueError(f"a scripted episode of example {index} failed: {result.error}")
        rows.append(episode_row(result, tokenizer, settings.chat, width))
        firsts.append(seen[0])
    tokens, mask = episode_prompts(firsts, 1, tokenizer, settings.chat, settings.prompt_len)
    out = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    return {"prompt_tokens": tokens, "prompt_mask": mask, **out}


def sft_batches(rows: dict[str, np.ndarray], batch_size: int, seed: int) -> Iterator[dict]:
    """Endless shuffled batches of `batch_size` rows (reshuffled each pass)."""
    n = len(rows["prompt_tokens"])
    if batch_size > n:
        raise ValueError(f"sft.batch_size={batch_size} is more than the {n} scripted episodes")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            take = order[start : start + batch_size]
            yield {k: v[take] for k, v in rows.items()}


def play_episodes(
    engine: Engine,
    params: nnx.State,
    task: Task,
    tokenizer: Tokenizer,
    settings: EpisodeSettings,
    answers: Sequence[str],
    batch_size: int,
    executor: concurrent.futures.Executor,
    n_samples: int = 1,
    seed: int = 0,
) -> list[EpisodeResult]:
    """`n_samples` episodes per answer as `engine` samples them (greedy engines: one), played
    `batch_size` answers at a time (the last batch padded; batch b samples with
    fold_in(PRNGKey(seed), b)). Episode i * n_samples + g plays answer i."""
    results: list[EpisodeResult] = []
    for b, start in enumerate(range(0, len(answers), batch_size)):
        chunk = list(answers[start : start + batch_size])
        real = len(chunk)
        chunk += [chunk[-1]] * (batch_size - real)
        group = start_group_episodes(task, chunk, n_samples, tokenizer, settings, executor)
        key = jax.random.fold_in(jax.random.PRNGKey(seed), b)
        generate_turns(
            engine,
            params,
            group.prompt_tokens,
            group.prompt_mask,
            key,
            group.handler,
            n_samples=n_samples,
        )
        results += group.results()[: real * n_samples]
    return results


def episode_eval_metrics(results: Sequence[EpisodeResult]) -> dict[str, float]:
    """eval/accuracy (the fraction of successful episodes, `EpisodeResult.success`: won,
    answered right), eval/reward (mean total reward), eval/mean_turns and eval/failed/<kind>
    counts."""
    metrics = tally(results)
    return {
        "eval/accuracy": float(np.mean([r.success for r in results])),
        "eval/reward": metrics["env/mean_reward"],
        "eval/mean_turns": metrics["env/mean_turns"],
        **{
            k.replace("env/", "eval/"): v for k, v in metrics.items() if k.startswith("env/failed/")
        },
    }


def run_engine(
    graphdef: nnx.GraphDef,
    model_config: TransformerConfig,
    rollout_config: RolloutConfig,
    sampling: SamplingParams | None = None,
) -> Engine:
    """An engine with the run's budget, EOS ids, stop rule and schedule, sampling as the run
    does or as `sampling` says (greedy evaluation: `SamplingParams(greedy=True)`)."""
    rc = rollout_config
    return Engine(
        graphdef,
        model_config,
        max_new_tokens=rc.max_new_tokens,
        eos_ids=(rc.eos_id, *rc.extra_eos_ids),
        pad_id=rc.pad_id,
        sampling=rc.sampling if sampling is None else sampling,
        engine=rc.engine or EngineConfig(),
        stop=rc.stop,
    )


def episodic_warm_start(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    log: Callable[[int, dict[str, Any]], None],
    mesh: Mesh,
) -> nnx.State:
    """SFT on scripted episodes (`sft.*`): the expert's turns are the targets, the
    observations context; at most `sft.scripted_episodes` episodes are played, and the
    batches cycle through them. Logs sft/loss at negative steps, as `prompts.warm_start`
    does."""
    s = config.sft
    count = max(s.batch_size, min(s.steps * s.batch_size, s.scripted_episodes))
    rows = scripted_episode_rows(
        task,
        prompts.tokenizer,
        EpisodeSettings.from_config(config),
        config.rollout.max_new_tokens,
        count,
        seed=config.seed + 1,
    )
    batches = sft_batches(rows, s.batch_size, config.seed + 1)
    return sft_on_batches(graphdef, params, batches, config, log, mesh)


def episodic_eval(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    mesh: Mesh | None = None,
) -> dict[str, float]:
    """Greedy episodes on the first `task.eval_size` test examples (`episode_eval_metrics`);
    one process (`mesh` must be None)."""
    if mesh is not None:
        raise ValueError("episodic tasks are evaluated on one process")
    answers = _split_answers(task, "test", config.task.eval_size, "task.eval_size")
    tokenizer = prompts.tokenizer
    engine = episode_engine(graphdef, params, config, tokenizer, SamplingParams(greedy=True))
    results = _play(engine, params, task, tokenizer, config, answers, 1, 0)
    return episode_eval_metrics(results)


def _split_answers(task: Task, split: str, count: int, key: str) -> list[str]:
    """The answers of the first `count` examples of `split` (`key` names the setting)."""
    size = task.split_size(split)
    if count < 1 or (size is not None and count > size):
        most = "" if size is None else f" and at most the {size} examples of the {split} split"
        raise ValueError(f"{key}={count} must be at least 1{most}")
    return [task.example(i, split)["answer"] for i in range(count)]


def episode_engine(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    config: ConfigDict,
    tokenizer: Tokenizer,
    sampling: SamplingParams,
) -> Engine:
    """`run_engine` for the policy (`params`: its full parameters) with the run's rollout
    settings, sampling as `sampling` says."""
    model_config = nnx.merge(graphdef, params).config
    return run_engine(graphdef, model_config, build_rollout_config(config, tokenizer), sampling)


def _play(
    engine: Engine,
    params: nnx.State,
    task: Task,
    tokenizer: Tokenizer,
    config: ConfigDict,
    answers: list[str],
    n_samples: int,
    seed: int,
) -> list[EpisodeResult]:
    """`play_episodes` in batches of `train.prompts_per_step` examples, on a fresh pool."""
    settings = EpisodeSettings.from_config(config)
    batch = min(len(answers), config.train.prompts_per_step)
    with concurrent.futures.ThreadPoolExecutor(settings.workers) as executor:
        return play_episodes(
            engine, params, task, tokenizer, settings, answers, batch, executor, n_samples, seed
        )


def episodic_sample_eval(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    task: Task,
    prompts: Prompts,
    config: ConfigDict,
    n_samples: int,
    ks: Sequence[int],
    *,
    temperature: float | None = None,
    split: str = "test",
    num_problems: int | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """pass@k, avg@n and greedy success of an episodic task: `n_samples` sampled episodes and
    one greedy episode per problem (`rljax.train.evaluation.sample_eval`'s report for episodes;
    an episode is correct when `EpisodeResult.success`).

    Args:
      graphdef, params, task, prompts, config: the policy, the task and the run's config.
      n_samples: n >= 1 sampled episodes per problem.
      ks: the k of pass@k, each in [1, n].
      temperature: sampling temperature; None takes `rollout.temperature` (top_k, top_p from
        `rollout.*`).
      split: the task split; num_problems: its first this many (None: `task.eval_size`).
      seed: sampling key (batch b samples with fold_in(PRNGKey(seed), b)); None: `config.seed`.

    Returns:
      A JSON-ready dict: split, num_problems, n_samples, temperature, top_k, top_p, seed;
      "pass_at_k" {str(k): mean over problems}, "avg_at_n" (success over all sampled
      episodes), "mean_reward", "mean_turns"; "greedy_accuracy", "greedy_reward",
      "greedy_mean_turns"; "failures" (sampled and greedy episodes by failure kind); and
      "problems": per problem {"index", "correct" (of n), "greedy_correct"}.

    Raises:
      ValueError: n_samples < 1, a k outside [1, n], or a bad problem count.
    """
    plan = sample_eval_plan(config, n_samples, ks, temperature, split, num_problems, seed)
    num_problems = plan.num_problems
    answers = _split_answers(task, split, num_problems, "num_problems")
    tokenizer = prompts.tokenizer
    runs = {}
    for mode, n, sampling in (
        ("sampled", n_samples, plan.sampling),
        ("greedy", 1, SamplingParams(greedy=True)),
    ):
        engine = episode_engine(graphdef, params, config, tokenizer, sampling)
        runs[mode] = _play(engine, params, task, tokenizer, config, answers, n, plan.seed)
    success = np.asarray([r.success for r in runs["sampled"]]).reshape(num_problems, n_samples)
    correct = success.sum(axis=1)
    greedy_correct = [r.success for r in runs["greedy"]]
    sampled, greedy = tally(runs["sampled"]), tally(runs["greedy"])
    return {
        **plan.header(),
        "pass_at_k": plan.pass_at_k(correct),
        "avg_at_n": float(success.mean()),
        "mean_reward": sampled["env/mean_reward"],
        "mean_turns": sampled["env/mean_turns"],
        "greedy_accuracy": float(np.mean(greedy_correct)),
        "greedy_reward": greedy["env/mean_reward"],
        "greedy_mean_turns": greedy["env/mean_turns"],
        "failures": {
            mode: {k.split("/")[-1]: int(v) for k, v in m.items() if k.startswith("env/failed/")}
            for mode, m in (("sampled", sampled), ("greedy", greedy))
        },
        "problems": [
            {"index": i, "correct": int(c), "greedy_correct": bool(g)}
            for i, c, g in zip(range(num_problems), correct, greedy_correct)
        ],
    }
