"""From a run config to the run's collector: which draw hooks and wrappers a run composes.

RolloutDraw -> WithFeedback (prompt_selection) -> WithRescue (lope) -> WithGreedyBaseline
(an algorithm that reads `baseline_reward`) -> GroupCollector (refill, staleness, sampler
devices) -> ReplayCollector (replay);   UEC-RL: UECCollector;   train.overlap: the
GroupCollector's draws on a sampler thread (OverlappedCollector).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax.algorithms import Algorithm
from rljax.core.state import TrainState
from rljax.data.selected import SelectedPromptBatches
from rljax.data.tasks import Task
from rljax.models.lora import merged_params
from rljax.models.tokenizer import Tokenizer
from rljax.parallel.mesh import make_mesh, split_devices
from rljax.parallel.rules import mesh_shardings
from rljax.rollout.sampler import Rollout
from rljax.rollout.sampling import SamplingParams
from rljax.train.builders import (
    build_decoder,
    build_explore_rollout_config,
    build_lope,
    build_lope_rollout_config,
    build_replay,
    build_rollout_config,
    build_scorer,
    token_level_rewards,
)
from rljax.train.collector import Collector, GroupCollector
from rljax.train.draws import RolloutDraw, WithFeedback, WithGreedyBaseline, WithRescue
from rljax.train.episodes import (
    EpisodeDraw,
    EpisodeSettings,
    WithGreedyEpisodes,
    episode_engine,
    is_episodic,
)
from rljax.train.fresh_replay import ReplayCollector
from rljax.train.lockstep import sharded_rollout, shared_logprobs, shared_rollout
from rljax.train.overlap import CopyOnTrainer, OverlappedCollector, check_overlap
from rljax.train.sampler_mesh import SamplerDevices
from rljax.train.staleness import SamplerPolicy
from rljax.train.steps import RolloutConfig, Steps, make_steps
from rljax.train.teacher import WithTeacher, load_teacher, teacher_scorer
from rljax.train.uec import UECCollector


def build_collector(
    config: ConfigDict,
    task: Task,
    tokenizer: Tokenizer,
    data: Iterator[dict[str, Any]],
    algorithm: Algorithm,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state: TrainState,
    steps: Steps,
) -> Collector:
    """The collector a config asks for.

    Args:
      config: the run config.
      task, tokenizer: score and decode completions.
      data: the training prompt batches (`rljax.train.prompts.train_prompts`).
      algorithm: UEC-RL's `collection` settings, and whether it reads a greedy baseline.
      graphdef, optimizer, mesh: as for `make_steps`; extra samplers (LoPE's, UEC-RL's
        exploration, the sampler's own devices) are compiled on them.
      state: the train state on the mesh (the parameters' layout; the shardings).
      steps: the trainer's jitted steps (its rollout and log-probs).

    Raises:
      ValueError: for combinations the collectors do not support, naming the keys.
    """
    t, r, n = config.train, config.rollout, config.rollout.n_samples
    whole = getattr(data, "batches", data)  # a multi-process run's HostRows: the whole batches
    check_overlap(config, task, algorithm)
    if is_episodic(task):
        return build_episode_collector(
            config, task, tokenizer, data, algorithm, steps, graphdef, state
        )
    scorer = build_scorer(config)
    batch_split = mesh.shape["data"] * mesh.shape["fsdp"]
    shardings = mesh_shardings(state, mesh)

    def sampler_steps(rollout_config: RolloutConfig) -> Steps:  # another sampler, same mesh
        return make_steps(
            graphdef, optimizer, algorithm, rollout_config, mesh=mesh, state_shardings=shardings
        )

    token_level = token_level_rewards(config)
    if token_level and not hasattr(task, "token_rewards"):
        raise ValueError(
            f"reward.token_level=True needs a task with token_rewards(); task "
            f"{config.task.name!r} has none"
        )
    sampler_devices, staleness = config.mesh.sampler_devices, t.max_staleness
    if algorithm.collection is not None:  # UEC-RL: exploration rollouts and a replay buffer
        if staleness or sampler_devices:
            raise ValueError(
                "algorithm.name='uec_rl' does not support train.max_staleness or "
                "mesh.sampler_devices yet; set both to 0"
            )
        explore = sampler_steps(
            build_explore_rollout_config(config, tokenizer, algorithm.collection)
        )
        return UECCollector(  # decides on the whole batch: every process reads all prompts
            algorithm.collection,
            whole,
            shared_rollout(steps.rollout, mesh),
            shared_rollout(explore.rollout, mesh),
            task,
            tokenizer,
            n,
            t.prompts_per_step * n,
            config.seed,
            prompt_multiple=batch_split,
            scorer=scorer,
        )
    devices, rollout_mesh, rollout = None, mesh, steps.rollout
    # The sampler on its own devices (weights resharded every step), or an overlapped run's
    # sampler on the trainer's mesh (its rollout reads a copy of the sampler's view only).
    if sampler_devices or t.overlap != "off":
        devices = SamplerDevices(
            graphdef,
            optimizer,
            algorithm,
            build_rollout_config(config, tokenizer),
            make_mesh(-1, devices=split_devices(sampler_devices)[0]) if sampler_devices else mesh,
            state.params,
            None if sampler_devices else state.base,
        )
        rollout_mesh, rollout = devices.mesh, devices.steps.rollout
    components = reward_component_names(config, task, algorithm)
    draw: Any = RolloutDraw(
        data,
        sharded_rollout(rollout, rollout_mesh),
        task,
        tokenizer,
        n,
        scorer,
        token_level,
        bool(components),
    )
    logprobs = shared_logprobs(steps.logprobs, mesh)
    if isinstance(whole, SelectedPromptBatches):  # the selector
        draw = WithFeedback(draw, whole, logprobs)
    lope = build_lope(config, task, tokenizer, batch_split)
    if lope is not None:
        lope_steps = sampler_steps(build_lope_rollout_config(config, tokenizer, lope.settings))
        draw = WithRescue(draw, lope, shared_rollout(lope_steps.rollout, mesh), logprobs)
    if algorithm.greedy_baseline:
        greedy = shared_rollout(greedy_decoder(graphdef, config, tokenizer), mesh)
        draw = WithGreedyBaseline(draw, greedy, task, tokenizer, scorer)
    draw = with_teacher(draw, config, tokenizer, algorithm)
    if t.overlap != "off":  # the draws on a sampler thread; it versions and places the weights
        return OverlappedCollector(
            GroupCollector(draw, n, None, r.max_refill_rounds, components),
            staleness,
            t.overlap == "deterministic",
            (lambda state: devices.reshard(state)[0]) if sampler_devices else CopyOnTrainer(),
            in_flight=r.engine == "continuous",
            steps=t.steps,
            timeline_path=os.path.join(config.run_dir, "timeline.jsonl"),
        )
    collector: Collector = GroupCollector(
        draw, n, SamplerPolicy(staleness, devices), r.max_refill_rounds, components
    )
    replay = build_replay(config)
    return collector if replay is None else ReplayCollector(collector, replay)


def build_episode_collector(
    config: ConfigDict,
    task: Task,
    tokenizer: Tokenizer,
    data: Iterator[dict[str, Any]],
    algorithm: Algorithm,
    steps: Steps,
    graphdef: nnx.GraphDef,
    state: TrainState,
) -> Collector:
    """G episodes of each example, played by the rollout engine (`rljax.train.episodes`),
    with DAPO's refill and bounded staleness as for any task, HeaPA's or the curriculum's
    prompt selection (fed each group's episode rewards) and ReMax's greedy baseline (a greedy
    episode per example).

    Raises:
      ValueError: naming the keys of features episodes do not support yet.
    """
    off = {
        "rollout.engine": config.rollout.engine != "continuous",
        # DARE rescores stored rollouts, which would need their observation masks.
        "prompt_selection.name": config.prompt_selection.name == "dare",
        "lope.num_perturbed": config.lope.num_perturbed != 0,
        "mesh.sampler_devices": config.mesh.sampler_devices != 0,
        "reward.token_level": token_level_rewards(config),
        "algorithm.name": algorithm.collection is not None,
        "algorithm.reward_components": algorithm.needs_reward_components,
        "--num_processes": jax.process_count() > 1,
    }
    unsupported = [key for key, on in off.items() if on]
    if unsupported:
        raise ValueError(
            f"episodic task {config.task.name!r} does not support {unsupported} yet (episodes "
            "need rollout.engine='continuous' and the plain group collector; of the prompt "
            "selectors, heapa and curriculum)"
        )
    settings = EpisodeSettings.from_config(config)
    executor = concurrent.futures.ThreadPoolExecutor(
        settings.workers, thread_name_prefix="rljax-env"
    )
    draw: Any = EpisodeDraw(
        data, steps.rollout, task, tokenizer, config.rollout.n_samples, settings, executor
    )
    if isinstance(data, SelectedPromptBatches):  # episodes: one process (checked above)
        draw = WithFeedback(draw, data, steps.logprobs)
    if algorithm.greedy_baseline:
        greedy = SamplingParams(greedy=True)
        engine = episode_engine(graphdef, merged_params(state), config, tokenizer, greedy)
        draw = WithGreedyEpisodes(draw, engine, task, tokenizer, settings, executor)
    draw = with_teacher(draw, config, tokenizer, algorithm)
    policy = SamplerPolicy(config.train.max_staleness, None)
    return GroupCollector(draw, config.rollout.n_samples, policy, config.rollout.max_refill_rounds)


def reward_component_names(config: ConfigDict, task: Task, algorithm: Algorithm) -> tuple[str, ...]:
    """The names of the task's K reward components when the algorithm reads them (GDPO or
    GPRL with `algorithm.reward_components=True`), else ().

    Raises:
      ValueError: a task without `reward_components`, `algorithm.num_dimensions` or
        `algorithm.weights` not K long, or a collector feature that keeps no components.
    """
    if not getattr(algorithm, "needs_reward_components", False):  # a diffusion one has none
        return ()
    name, settings = config.algorithm.name, config.algorithm
    if not hasattr(task, "reward_components"):
        raise ValueError(
            f"algorithm.name={name!r} with algorithm.reward_components=True needs a task "
            f"with reward_components(); task {config.task.name!r} has none"
        )
    names = tuple(task.reward_component_names)
    k = len(names)
    if settings.get("num_dimensions", k) != k:
        raise ValueError(
            f"algorithm.num_dimensions={settings.num_dimensions} but task "
            f"{config.task.name!r} has {k} reward components {names}"
        )
    if settings.get("weights") is not None and len(settings.weights) != k:
        raise ValueError(
            f"algorithm.weights={tuple(settings.weights)} needs one weight per reward "
            f"component of task {config.task.name!r}: {names}"
        )
    off = {
        "lope.num_perturbed": config.lope.num_perturbed != 0,
        "reward.token_level": token_level_rewards(config),
        "task.group_rewards": hasattr(task, "group_rewards"),
    }
    unsupported = [key for key, on in off.items() if on]
    if unsupported:
        raise ValueError(
            f"algorithm.reward_components=True does not combine with {unsupported} yet: "
            "their rows carry no reward components"
        )
    return names


def with_teacher(draw: Any, config: ConfigDict, tokenizer: Tokenizer, algorithm: Algorithm) -> Any:
    """`draw` with the teacher's log-probs of its tokens (`rljax.train.teacher`) when the
    algorithm reads them, else `draw`.

    Raises:
      ValueError: an algorithm that reads them without `teacher.run_dir`, a
        `teacher.run_dir` that nothing reads (a typo'd algorithm would train without it), or
        `teacher.top_k` set where nothing reads the top-k tokens or unset where GKD does.
      FileNotFoundError: as `load_teacher`.
    """
    name = config.algorithm.name
    top_k = config.teacher.top_k
    if not algorithm.needs_teacher:
        if config.teacher.run_dir or top_k:
            raise ValueError(
                f"teacher.run_dir={config.teacher.run_dir!r} and teacher.top_k={top_k} are set "
                f"but algorithm.name={name!r} reads no teacher scores (on_policy_distillation "
                "and gkd do); unset them"
            )
        return draw
    if algorithm.needs_teacher_top_k != (top_k > 0):
        raise ValueError(
            f"algorithm.name={name!r} reads the teacher's top-k tokens: set teacher.top_k > 0"
            if algorithm.needs_teacher_top_k
            else f"teacher.top_k={top_k} but algorithm.name={name!r} does not read the "
            "teacher's top-k tokens (gkd does); set it to 0"
        )
    if not config.teacher.run_dir:
        raise ValueError(
            f"algorithm.name={name!r} scores the student's tokens with a teacher: set "
            "teacher.run_dir to a trained run's directory"
        )
    teacher = load_teacher(config, tokenizer)
    logging.info("teacher: %s at step %d", config.teacher.run_dir, teacher.step)
    return WithTeacher(draw, teacher_scorer(teacher, config.train.vocab_chunk, top_k))


def greedy_decoder(
    graphdef: nnx.GraphDef, config: ConfigDict, tokenizer: Tokenizer
) -> Callable[[TrainState, Any, Any], Rollout]:
    """`(state, prompt_tokens, prompt_mask, attempt=0) -> Rollout`: one greedy completion per
    prompt, by the run's sampler (`build_decoder`); `attempt` is ignored."""
    run = build_decoder(graphdef, config, tokenizer)

    def decode(state: TrainState, tokens, mask, attempt: int = 0) -> Rollout:
        del attempt  # greedy: no randomness to salt
        return run(
            merged_params(state),
            jnp.asarray(tokens),
            jnp.asarray(mask),
            jax.random.PRNGKey(0),
            sampling=SamplingParams(greedy=True),
        )

    return decode


def check_multi_process(config: ConfigDict) -> None:
    """What a multi-process run supports so far, checked before anything is compiled.

    Every jitted step is one program across all processes, so each must call it in lockstep.
    The collectors that decide on host data (DAPO's refill, prompt selection, replay, LoPE,
    ReMax, UEC-RL) decide on every process's rows (`rljax.train.lockstep`); the sampler's own
    devices are a share of each process's (`split_devices`, which `build_mesh` already ran).
    Not yet: an overlapped sampler thread (`check_overlap`).

    Raises:
      ValueError: a replay batch whose groups do not split over the processes.
    """
    count = jax.process_count()
    groups = config.replay.groups or config.train.prompts_per_step
    if config.replay.name != "none" and groups % count:
        raise ValueError(
            f"replay.groups={groups} (0: train.prompts_per_step) does not split over {count} "
            "processes; make it a multiple of the process count"
        )
