"""The driver's one dispatch: what it builds for each kind of policy (`model.kind`).

The loop (`rljax.train.loop`) is the same for every policy: collect -> learn each batch -> log
-> checkpoint. What differs is how the policy is built, warm-started, sampled, scored and
trained; a `PolicyKind` bundles those builders:

  "causal"     a decoder LM sampled token by token (`rljax.train.builders`, `make_steps`,
               `build_collector`, teacher-forced SFT, greedy decoding)
  "diffusion"  a masked-diffusion LM (`rljax.diffusion.engine`: block-wise sampler,
               likelihood estimates, LLaDA's masked SFT, greedy block-wise decoding)

Why `model.kind` and not the algorithm name: the kind is a property of the policy (its
architecture, sampler, SFT loss and evaluation all follow from it), and each kind has its own
algorithm registry, checked by `rljax.config.validate_config` against the kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ml_collections import ConfigDict

from rljax.train.builders import (
    build_algorithm,
    build_policy,
    build_rollout_config,
    build_train_state,
    build_update_config,
)
from rljax.train.collection import build_collector
from rljax.train.episodes import episodic_eval, episodic_warm_start, is_episodic
from rljax.train.evaluation import greedy_eval
from rljax.train.prompts import warm_start
from rljax.train.steps import Steps, make_steps


@dataclasses.dataclass(frozen=True)
class PolicyKind:
    """The builders the driver calls, for one kind of policy.

    Attributes:
      build_policy: config -> (tokenizer, model config, graphdef, params).
      build_algorithm: (config, model config) -> the algorithm.
      build_train_state: (config, model config, params, algorithm, optimizer) ->
        (TrainState, critic graphdef or None).
      warm_start: (graphdef, params, task, prompts, config, log, mesh) -> params after SFT.
      evaluate: (graphdef, params, task, prompts, config, mesh or None) -> {"eval/..."}.
      make_steps: (config, tokenizer, graphdef, optimizer, algorithm, mesh, state shardings,
        critic graphdef) -> `Steps`.
      build_collector: as `rljax.train.collection.build_collector`.
      trims_padding: whether the driver may cut a batch's unused padding columns before
        learning (`rljax.train.padding`); not for masked-diffusion canvases.
    """

    build_policy: Callable[..., Any]
    build_algorithm: Callable[..., Any]
    build_train_state: Callable[..., Any]
    warm_start: Callable[..., Any]
    evaluate: Callable[..., dict[str, float]]
    make_steps: Callable[..., Steps]
    build_collector: Callable[..., Any]
    trims_padding: bool = True


def _causal_steps(
    config, tokenizer, graphdef, optimizer, algorithm, mesh, shardings, critic_graphdef
) -> Steps:
    return make_steps(
        graphdef,
        optimizer,
        algorithm,
        build_rollout_config(config, tokenizer),
        build_update_config(config),
        mesh,
        shardings,
        critic_graphdef=critic_graphdef,
    )


def causal_warm_start(graphdef, params, task, prompts, config, log, mesh):
    """SFT on the task's targets, or on scripted episodes for an episodic task."""
    start = episodic_warm_start if is_episodic(task) else warm_start
    return start(graphdef, params, task, prompts, config, log, mesh)


def causal_evaluate(graphdef, params, task, prompts, config, mesh=None) -> dict[str, float]:
    """Greedy accuracy on held-out problems, or the greedy episodes' success rate."""
    evaluate = episodic_eval if is_episodic(task) else greedy_eval
    return evaluate(graphdef, params, task, prompts, config, mesh)


CAUSAL = PolicyKind(
    build_policy=build_policy,
    build_algorithm=lambda config, model_config: build_algorithm(config, model_config.vocab_size),
    build_train_state=build_train_state,
    warm_start=causal_warm_start,
    evaluate=causal_evaluate,
    make_steps=_causal_steps,
    build_collector=build_collector,
)


def diffusion_kind() -> PolicyKind:
    """The builders of a masked-diffusion policy (`rljax.diffusion.engine`), imported on first
    use: rljax.diffusion builds on rljax.train, not the other way round."""
    from rljax.diffusion import engine
    from rljax.diffusion.sft import diffusion_warm_start

    return PolicyKind(
        build_policy=engine.build_diffusion_policy,
        build_algorithm=engine.build_diffusion_algorithm,
        build_train_state=engine.build_diffusion_train_state,
        warm_start=diffusion_warm_start,
        evaluate=engine.diffusion_greedy_eval,
        make_steps=engine.build_diffusion_steps,
        build_collector=engine.build_diffusion_collector,
        trims_padding=False,
    )


def policy_kind(config: ConfigDict) -> PolicyKind:
    """The builders of `model.kind` ("causal" or "diffusion"; a validated config)."""
    return diffusion_kind() if config.model.kind == "diffusion" else CAUSAL
