"""Config checks that run before anything is built or compiled.

A researcher's slip (a typo'd key, a string where a count belongs, a group size that does not
divide the batch, a mesh that does not match the devices) should stop the run at once with
one line that names the key and says what to change, not minutes later inside XLA, and a
typo'd key must not be silently ignored. `validate_config` is the one entry point; it returns
the complete config the driver reads, every key left out filled with its default.

The schema is `rljax.config.schema.SCHEMA` (every key the driver reads, with its default, whose
type is the expected type, and its range). Three sections take keys that belong to what they
name: `algorithm` (the preset's settings: its named parameters, a dataclass parameter's fields
flat, `rljax.train.builders.preset_settings`), `task` (the task's constructor) and
`rollout_correction` (the correction's keyword arguments); those are checked against the
callable's signature and annotations. Nothing here touches a device beyond
`jax.device_count()`, loads weights or traces a function.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax.config.memory import check_fits
from rljax.config.schema import OPEN_SECTIONS, SCHEMA, Key
from rljax.data.tasks import TASKS
from rljax.metrics.backends import parse_backends
from rljax.models.attention import cudnn_unfit
from rljax.models.fetch import cached_file
from rljax.models.gguf import gguf_limits
from rljax.models.hf import _read_json, config_from_hf
from rljax.models.lora import TARGETS
from rljax.parallel.mesh import MESH_AXES

# Arguments the driver passes itself, by section: {argument: the config key it comes from}.
_DRIVER_ARGUMENTS = {"algorithm": {"group_size": "rollout.n_samples"}, "task": {"seed": "seed"}}
# Preset arguments filled from the run when the config leaves them out (build_algorithm).
_RUN_ARGUMENTS = ("vocab_size", "total_steps", "num_steps")
# Keys only a masked-diffusion policy reads (model.kind="diffusion"), and the causal-LM
# features a diffusion run does not have, with the value that turns each off.
_DIFFUSION_ONLY = (
    "rollout.block_size",
    "rollout.steps_per_block",
    "rollout.remasking",
    "rollout.block_sizes",
    "sft.warmup_steps",
    "sft.weight_decay",
    "sft.mask_eps",
)
_CAUSAL_ONLY = {
    "model.checkpoint": "",
    "lora.rank": 0,
    "model.num_experts": 0,
    "model.remat": "none",
    "model.attention_chunk": 0,
    "task.chat_template": False,
    "rollout.top_k": 0,
    "rollout.top_p": 1.0,
    "rollout.weight_format": "none",
    "rollout.cuts_top_k": 0,
    "rollout.aqn_sigma_start": 0.0,
    "rollout_correction.name": "none",
    "reward.token_level": False,
    "prompt_selection.name": "none",
    "replay.name": "none",
    "lope.num_perturbed": 0,
    "train.microbatches": 1,
    "train.pack_ratio": 0.0,
    "train.max_staleness": 0,
    "train.overlap": "off",
    "mesh.sampler_devices": 0,
}


def validate_config(config: ConfigDict) -> ConfigDict:
    """The complete, checked run config, or a one-line ValueError naming the key and the fix.

    Checks, in order: unknown keys (with the closest valid key) and value types against the
    schema; the algorithm, task and rollout-correction settings against their signatures;
    value ranges and choices; the batch splits (group size, minibatches, micro-batches, mesh
    batch axes); the mesh against `jax.device_count()`; prompt + completion length against a local
    Hugging Face checkpoint's `max_position_embeddings`; and the feature combinations the
    driver does not support. Nothing is built on a device and nothing is compiled.

    Args:
      config: a run config (e.g. `configs/grpo_addition.py: get_config()`); not modified.

    Returns:
      A copy of `config` with every key of `SCHEMA` that it leaves out at its default (in the
      open sections only their own keys: the callables' settings default to their
      signatures), ints of float keys as floats. Code reads this config and supplies no
      default.

    Raises:
      ValueError: the first problem found, e.g. `unknown config key train.learing_rate; did
        you mean train.learning_rate?` or `train.steps='10' must be an int`.
    """
    _check_keys_and_types(config)
    config = _complete(config)
    _check_finite(config)
    _check_ranges(config)
    _check_batch_splits(config, jax.device_count())
    _check_model(config)
    _check_combinations(config)
    return config


def _builders():
    """rljax.train.builders, imported on first use: it imports rljax.train, whose driver
    imports this module."""
    from rljax.train import builders

    return builders


def _diffusion():
    """rljax.diffusion.algorithms, imported on first use (rljax.diffusion imports rljax.train)."""
    from rljax.diffusion import algorithms

    return algorithms


def _complete(config: ConfigDict) -> ConfigDict:
    """A copy of `config` (already checked for keys and types) with every missing key of
    `SCHEMA` at its default, schema keys first; float keys given as ints become floats."""
    given = (config if isinstance(config, ConfigDict) else ConfigDict(config)).to_dict()
    out: dict[str, Any] = {}
    for name, entry in SCHEMA.items():
        if isinstance(entry, Key):
            out[name] = _as_declared(entry, given[name]) if name in given else entry.default
            continue
        values = dict(given.get(name) or {})
        section = {
            key: _as_declared(spec, values.pop(key)) if key in values else spec.default
            for key, spec in entry.items()
        }
        out[name] = {**section, **values}  # an open section's callable settings
    return ConfigDict(out)


def _as_declared(spec: Key, value: Any) -> Any:
    """`value` in the key's declared type where that is lossless (an int of a float key)."""
    is_float = isinstance(spec.default, float)
    if is_float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


# --- keys and types ------------------------------------------------------------------------


def _check_keys_and_types(config: ConfigDict) -> None:
    """Every key is in the schema (or the named callable's signature) with a value of its type."""
    model = config.get("model") or {}
    kind = model.get("kind", SCHEMA["model"]["kind"].default)
    _check_type("model.kind", kind, (str,))
    _check_range("model.kind", kind, SCHEMA["model"]["kind"])  # it picks the algorithms
    for key, value in config.items():
        if key not in SCHEMA:
            _unknown(key, SCHEMA)
        if isinstance(SCHEMA[key], dict):
            if not isinstance(value, (ConfigDict, Mapping)):
                raise ValueError(f"{key}={value!r} must be a section (a ConfigDict of settings)")
            _check_section(key, value, SCHEMA[key], kind)
        else:
            _check_type(key, value, _types_of_value(SCHEMA[key].default))


class _Setting(NamedTuple):
    """A key of an open section: its default (`inspect.Parameter.empty`: required) and the
    types its value may have (None: not checked)."""

    default: Any
    kinds: tuple[type, ...] | None


def _check_section(
    section: str, values: Mapping[str, Any], schema: dict[str, Key], kind: str = "causal"
) -> None:
    """The keys of one section: the schema's, plus the named callable's for open sections
    (the algorithm presets of the policy's `kind`)."""
    name, params = None, {}
    if section in OPEN_SECTIONS:
        name = values.get("name", schema["name"].default)  # not yet completed
        params = _callable_parameters(section, name, kind)
    for key, value in values.items():
        full = f"{section}.{key}"
        if key in schema:
            _check_type(full, value, _types_of_value(schema[key].default))
        elif key in params:
            _check_type(full, value, params[key].kinds)
        elif key in _DRIVER_ARGUMENTS.get(section, {}):
            source = _DRIVER_ARGUMENTS[section][key]
            raise ValueError(f"{full} is set by the driver from {source}; remove {full}")
        else:
            _unknown(full, {**schema, **params}, prefix=f"{section}.", owner=name)
    for key, setting in params.items():
        required = setting.default is inspect.Parameter.empty and key not in _RUN_ARGUMENTS
        if required and values.get(key) is None:
            raise ValueError(
                f"{section}.{key} is required by {section}.name={name!r}; "
                f"set --config.{section}.{key}=..."
            )


def _algorithms(kind: str) -> Mapping[str, Callable[..., Any]]:
    """The algorithm presets of a policy kind (`model.kind`)."""
    return _diffusion().DIFFUSION_ALGORITHMS if kind == "diffusion" else _builders().ALGORITHMS


def _callable_parameters(section: str, name: Any, kind: str = "causal") -> dict[str, _Setting]:
    """{key: its default and types} of the settings that `section.name` accepts.

    An algorithm preset (of the policy's `kind`) has `rljax.train.builders.preset_settings`'
    keys (a dataclass parameter's fields are keys, with the fields' annotations); a task's or
    a rollout correction's are its named keyword arguments. The arguments the driver passes
    itself (`_DRIVER_ARGUMENTS`) are left out; a name that is not registered is an error
    naming the key (with the closest registered name, or the `model.kind` whose algorithm it
    is).
    """
    _check_type(f"{section}.name", name, (str,))
    b = _builders()
    registry = {
        "algorithm": _algorithms(kind),
        "task": TASKS,
        "rollout_correction": b.ROLLOUT_CORRECTIONS,
    }
    known = registry[section]
    if section == "rollout_correction" and name == "none":
        return {}
    other = "causal" if kind == "diffusion" else "diffusion"
    if section == "algorithm" and name not in known and name in _algorithms(other):
        raise ValueError(
            f"algorithm.name={name!r} is a model.kind={other!r} algorithm; set "
            f"--config.model.kind={other} or choose one of {sorted(known)}"
        )
    if name not in known:
        names = sorted(known) + (["none"] if section == "rollout_correction" else [])
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"{section}.name={name!r} is unknown; {hint}choose one of {names}")
    if section == "algorithm":
        settings = b.preset_settings(known[name])
        params = {
            k: _Setting(s.default, _types_of_hint(s.hint, s.default)) for k, s in settings.items()
        }
    else:
        params = _keywords(known[name])
    for key in _DRIVER_ARGUMENTS.get(section, {}):
        params.pop(key, None)
    return params


def _keywords(fn: Callable[..., Any]) -> dict[str, _Setting]:
    """The named parameters of `fn` (no *args / **kwargs), with their types from its
    annotations."""
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):  # an annotation that does not resolve: use the defaults
        hints = {}
    return {
        p.name: _Setting(p.default, _types_of_hint(hints.get(p.name, p.empty), p.default))
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in skip
    }


def _unknown(key: str, valid: Mapping[str, Any], prefix: str = "", owner: str | None = None):
    """Raises the unknown-key error with the closest valid key, or the list of valid keys."""
    names = [prefix + k for k in valid]
    close = difflib.get_close_matches(key, names, n=1)
    where = f" (for {prefix}name={owner!r})" if owner is not None else ""
    if close:
        raise ValueError(f"unknown config key {key}{where}; did you mean {close[0]}?")
    raise ValueError(f"unknown config key {key}{where}; valid keys: {', '.join(sorted(names))}")


# Types a value may have, by the type it must be: an int count is never a float or a bool;
# an int is a fine float; a tuple may be written as a list.
_ACCEPTED = {bool: (bool,), int: (int,), float: (int, float), str: (str,), tuple: (tuple, list)}
_TYPE_NAMES = {bool: "a bool (True or False)", int: "an int", float: "a float", str: "a str"}


def _types_of_value(default: Any) -> tuple[type, ...] | None:
    """The expected types of a key whose reference default is `default` (None: any)."""
    for kind in _ACCEPTED:  # bool before int: a bool is an int to isinstance
        if isinstance(default, kind):
            return (kind,)
    if isinstance(default, list):
        return (tuple,)
    return None


def _types_of_hint(hint: Any, default: Any) -> tuple[type, ...] | None:
    """The expected types of a setting, from its resolved annotation `hint` (else its
    default; `inspect.Parameter.empty` for either means none)."""
    if hint is inspect.Parameter.empty:
        if default is inspect.Parameter.empty or default is None:
            return None
        return _types_of_value(default)
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    kinds = []
    for option in options:
        base = typing.get_origin(option) or option
        if base is type(None):
            kinds.append(type(None))
        elif base in _ACCEPTED:
            kinds.append(base)
        else:  # a callable, a protocol, a dict...: not checked
            return None
    return tuple(kinds)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _check_type(key: str, value: Any, kinds: tuple[type, ...] | None) -> None:
    """Raises `key=value must be an int` (etc.) when `value` is none of `kinds`."""
    if kinds is None or value is None:  # None: a placeholder, or an optional setting left off
        return
    for kind in kinds:
        if kind is type(None):
            continue
        accepted = _ACCEPTED[kind]
        if isinstance(value, accepted) and (kind is bool or not isinstance(value, bool)):
            return
    names = " or ".join(_TYPE_NAMES.get(k, "a tuple") for k in kinds if k is not type(None))
    raise ValueError(f"{key}={value!r} must be {names}")


# --- value ranges --------------------------------------------------------------------------

# The largest float32: a float setting beyond it is inf on the device (the training dtype).
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_finite(value: Any, key: str = "") -> None:
    """Every float of the completed config (schema keys, the open sections' settings, items of
    tuples) is a number float32 holds: an inf, a nan or a 1e39 learning rate, KL coefficient
    or clip range would turn the first update's parameters into NaNs."""
    if isinstance(value, float) and not abs(value) <= _FLOAT32_MAX:  # False for nan too
        raise ValueError(
            f"{key}={value} must be a finite number within float32's range (|x| <= 3.4e38; "
            "the training dtype)"
        )
    if isinstance(value, (ConfigDict, Mapping)):
        for name, item in value.items():
            _check_finite(item, f"{key}.{name}" if key else name)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _check_finite(item, f"{key}[{i}]")


def _check_ranges(config: ConfigDict) -> None:
    """Counts, lengths, rates and sampling settings a run cannot use: the schema's ranges and
    choices, then the checks that depend on other keys."""
    for name, entry in SCHEMA.items():
        if isinstance(entry, Key):
            _check_range(name, config[name], entry)
        else:
            for key, spec in entry.items():
                _check_range(f"{name}.{key}", config[name][key], spec)
    if not config.run_dir.strip():  # os.path.abspath("") is the current directory
        raise ValueError(
            f"run_dir={config.run_dir!r} is empty; set --config.run_dir to the directory for "
            "the run's checkpoints, metrics.jsonl and config.json"
        )
    r, s = config.rollout, config.sft
    if s.steps > 0:
        _at_least("sft.batch_size", s.batch_size, 1)
        _positive("sft.learning_rate", s.learning_rate)
    if r.n_samples < 2:
        raise ValueError(
            f"rollout.n_samples={r.n_samples}: group-relative advantages need "
            "at least 2 samples per prompt"
        )
    b = _builders()
    b.build_rollout_weights(config)
    b.build_rollout_correction(config)
    b.build_scorer(config)
    parse_backends(config.log.backends)


def _check_range(key: str, value: Any, spec: Key) -> None:
    """`key=value must be >= 1` (etc.) when `value` is outside the key's range or choices."""
    if value is None:  # an optional setting left off
        return
    if spec.choices is not None and value not in spec.choices:
        options = " or ".join(repr(c) for c in spec.choices)
        if len(spec.choices) > 2:
            options = f"one of {list(spec.choices)}"
        raise ValueError(f"{key}={value!r} is unknown; use {options}")
    hint = f" ({spec.hint})" if spec.hint else ""
    low = spec.min if spec.gt is None else spec.gt
    if spec.max is not None:
        below = low is not None and (value < low if spec.gt is None else value <= low)
        if below or value > spec.max:
            bracket = "[" if spec.gt is None else "("
            raise ValueError(f"{key}={value} must be in {bracket}{low}, {spec.max}]{hint}")
    elif spec.min is not None and value < spec.min:
        raise ValueError(f"{key}={value} must be >= {spec.min}{hint}")
    elif spec.gt is not None and not value > spec.gt:
        raise ValueError(f"{key}={value} must be > {spec.gt}{hint}")


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ValueError(f"{key}={value} must be >= {low}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{key}={value} must be > 0")


# --- batch splits and the mesh -------------------------------------------------------------


def _check_batch_splits(config: ConfigDict, device_count: int) -> None:
    """Rows per step vs the update's splits, and the mesh vs the devices, as the driver uses
    them: the trainer's mesh gets the devices after the sampler's `mesh.sampler_devices`, the
    batch is split over its data x fsdp axes, every update over minibatches x microbatches."""
    t, r, m = config.train, config.rollout, config.mesh
    per_update = t.minibatches * t.microbatches
    rows = t.prompts_per_step * r.n_samples
    if rows % per_update:
        raise ValueError(
            f"train.prompts_per_step x rollout.n_samples = {t.prompts_per_step} x {r.n_samples} "
            f"= {rows} rows is not divisible by train.minibatches x train.microbatches = "
            f"{t.minibatches} x {t.microbatches}; change one of them"
        )
    sampler_devices = m.sampler_devices
    if sampler_devices and not 0 < sampler_devices < device_count:
        raise ValueError(
            f"mesh.sampler_devices={sampler_devices} must leave the trainer at least one of the "
            f"{device_count} devices (0: the sampler shares the trainer's mesh)"
        )
    sizes = _mesh_sizes(m, device_count - sampler_devices, sampler_devices)
    batch_split = sizes["data"] * sizes["fsdp"]
    if t.prompts_per_step % batch_split:
        raise ValueError(
            f"train.prompts_per_step={t.prompts_per_step} is not divisible by mesh.data x "
            f"mesh.fsdp = {sizes['data']} x {sizes['fsdp']}; change one of them"
        )
    if config.sft.steps > 0 and config.sft.batch_size % batch_split:
        raise ValueError(
            f"sft.batch_size={config.sft.batch_size} is not divisible by mesh.data x mesh.fsdp "
            f"= {sizes['data']} x {sizes['fsdp']}; change one of them"
        )
    if sampler_devices and t.prompts_per_step % sampler_devices:
        raise ValueError(
            f"train.prompts_per_step={t.prompts_per_step} is not divisible by "
            f"mesh.sampler_devices={sampler_devices} (the sampler splits prompts over them)"
        )
    replay = _builders().build_replay(config)
    if replay is not None:
        replay_rows = replay.groups * r.n_samples
        if replay_rows % per_update or replay.groups % batch_split:
            raise ValueError(
                f"replay.groups={replay.groups} groups x rollout.n_samples={r.n_samples} must "
                f"split into train.minibatches x train.microbatches = {per_update} parts and "
                f"its groups over mesh.data x mesh.fsdp = {batch_split}; change replay.groups"
            )


def _mesh_sizes(mesh: ConfigDict, devices: int, sampler_devices: int) -> dict[str, int]:
    """{axis: size} of the trainer's mesh on `devices` devices, -1 resolved as
    `rljax.parallel.mesh.make_mesh` does, with the config's keys in the messages."""
    sizes = {axis: mesh[axis] for axis in MESH_AXES}
    given = " x ".join(f"mesh.{a}={s}" for a, s in sizes.items())
    available = f"jax.device_count()={devices + sampler_devices}"
    if sampler_devices:
        available += f" - mesh.sampler_devices={sampler_devices} = {devices}"
    if list(sizes.values()).count(-1) > 1:
        raise ValueError(f"{given}: at most one mesh size may be -1 (the devices left)")
    if any(s == 0 or s < -1 for s in sizes.values()):
        raise ValueError(f"{given}: mesh sizes must be positive (or -1: the devices left)")
    rest = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        if devices % rest:
            raise ValueError(
                f"{given}: the other sizes' product {rest} does not divide the {available} "
                f"devices; set sizes whose product divides {devices}"
            )
        return {a: devices // rest if s == -1 else s for a, s in sizes.items()}
    if rest != devices:
        raise ValueError(
            f"{given} = {rest} devices, but the trainer has {available}; set sizes whose "
            f"product is {devices} (or one of them to -1)"
        )
    return sizes


# --- the model -----------------------------------------------------------------------------


def _check_model(config: ConfigDict) -> None:
    """cuDNN attention against the backend and dtype; a scratch model's shape and dtypes; a
    checkpoint's length budget when it is known without loading weights (a local Hugging Face
    directory's config.json, a GGUF file's metadata); the KV cache and logits of a step against
    the memory (`rljax.config.memory`)."""
    m, b = config.model, _builders()
    why = m.attention_impl == "cudnn" and cudnn_unfit(m.dtype)
    if why:  # the head_dim is checked when the model is traced
        raise ValueError(f"model.attention_impl='cudnn' {why}; use 'auto' or 'xla'")
    source = m.checkpoint
    if not source:
        try:
            model = b.scratch_model_config(m)
        except ValueError as err:  # its messages name the fields: name them as config keys
            fields = "|".join(m.keys())
            detail = re.sub(rf"(TransformerConfig\.|\b)({fields})=", r"model.\2=", str(err))
            raise ValueError(f"model settings: {detail}") from None
        check_fits(config, model, ("the model's context length", None))
        return
    if source in b.FETCHABLE:  # sized when it is cached; a first run reads it once fetched
        source = cached_file(source)
    if source.endswith(".gguf"):
        if os.path.isfile(source):  # a missing file is named when the model is loaded
            model, length = gguf_limits(source, m.dtype, m.param_dtype)
            check_fits(config, model, ("the GGUF file's context_length", length))
        return
    path = os.path.join(source, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"model.checkpoint={source!r} is neither a directory with a config.json, a .gguf "
            f"file nor one of {tuple(b.FETCHABLE)}; pass a local checkpoint"
        )
    hf = _read_json(path)
    try:
        model = config_from_hf(hf).replace(dtype=m.dtype, param_dtype=m.param_dtype)
    except ValueError:  # named, with the checkpoint's path, when the model is loaded
        model = None
    if model is not None and model.num_experts and config.lope.num_perturbed:
        raise ValueError(
            f"lope does not combine with an MoE model yet; model.checkpoint={source!r} has "
            f"{model.num_experts} experts per layer; set lope.num_perturbed=0"
        )
    length = hf.get("max_position_embeddings")
    check_fits(config, model, ("the checkpoint's max_position_embeddings", length))


# --- feature combinations ------------------------------------------------------------------


def _check_kind(config: ConfigDict) -> None:
    """A causal run sets no diffusion key; a diffusion run uses none of the causal-LM features
    it does not have, and its block sizes fit the completion and the step budget."""
    value = lambda key: config[key.split(".")[0]][key.split(".")[1]]  # noqa: E731
    if config.model.kind != "diffusion":
        for key in _DIFFUSION_ONLY:
            section, name = key.split(".")
            if value(key) != SCHEMA[section][name].default:
                raise ValueError(
                    f"{key}={value(key)!r} applies to model.kind='diffusion' only; remove it "
                    "or set --config.model.kind=diffusion"
                )
        return
    for key, off in _CAUSAL_ONLY.items():
        if value(key) != off:
            raise ValueError(
                f"{key}={value(key)!r} is not supported with model.kind='diffusion' (yet); "
                f"set {key}={off!r}"
            )
    r, t = config.rollout, config.train
    gen = r.max_new_tokens
    block = r.block_size or gen
    if gen % block:
        raise ValueError(
            f"rollout.block_size={block} must divide rollout.max_new_tokens={gen} (0: one block)"
        )
    steps = gen // block * (r.steps_per_block or block)
    sizes = tuple(r.block_sizes)
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"rollout.block_sizes={sizes} must be distinct")
    for size in sizes:
        if not isinstance(size, int) or size < 1 or gen % size or steps % (gen // size):
            raise ValueError(
                f"rollout.block_sizes entry {size!r} must divide rollout.max_new_tokens={gen} "
                f"into a number of blocks that divides the {steps} denoising steps; drop it or "
                "raise rollout.steps_per_block"
            )
    if t.prompts_per_step % t.minibatches:
        raise ValueError(
            f"train.prompts_per_step={t.prompts_per_step} prompt groups do not split into "
            f"train.minibatches={t.minibatches} (diffusion minibatches hold whole groups)"
        )
    settings = {k: v for k, v in config.algorithm.items() if k != "name"}
    settings.pop("num_steps", None)
    _diffusion().DiffusionSettings(**settings)  # ranges, naming algorithm.* keys


def _check_lora(config: ConfigDict) -> None:
    """LoRA's targets exist, and the features it does not combine with are off: a warm start
    (a resume rebuilds the base from model.checkpoint, not from the SFT result) and a
    separate sampler mesh (it reshards the policy's parameters, which are adapters here);
    the unmerged sampler takes no sampler weight transform (they act on merged kernels)."""
    lora = config.lora
    if not lora.rank:
        return
    unknown = [t for t in lora.targets if t not in TARGETS]
    if unknown or not lora.targets:
        raise ValueError(
            f"lora.targets={tuple(lora.targets)} must be a non-empty subset of {tuple(TARGETS)}"
        )
    r = config.rollout
    if lora.sampler == "unmerged" and (r.weight_format != "none" or r.aqn_sigma_start > 0):
        raise ValueError(
            f"lora.sampler='unmerged' does not combine with rollout.weight_format="
            f"{r.weight_format!r} / rollout.aqn_sigma_start={r.aqn_sigma_start} (they act "
            "on merged weights); set lora.sampler='merged'"
        )
    off = {"sft.steps": config.sft.steps, "mesh.sampler_devices": config.mesh.sampler_devices}
    for key, value in off.items():
        if value:
            raise ValueError(
                f"{key}={value} does not combine with lora.rank={lora.rank} yet; set {key}=0 "
                "or lora.rank=0"
            )


def _check_combinations(config: ConfigDict) -> None:
    """Features that do not combine, and prompt-selection settings."""
    _check_kind(config)
    _check_lora(config)
    t, b = config.train, _builders()
    if config.reward.token_level:
        if config.algorithm.name != "ppo":
            raise ValueError(
                "reward.token_level=True: token rewards are credited by GAE; use "
                f"algorithm.name='ppo', not {config.algorithm.name!r}"
            )
        if config.lope.num_perturbed:
            raise ValueError(
                "reward.token_level does not combine with lope (set lope.num_perturbed=0)"
            )
        if config.replay.name != "none":
            raise ValueError(
                "reward.token_level does not combine with replay (set replay.name='none')"
            )
    selection = config.prompt_selection
    if selection.name != "none":
        if selection.name not in b.PROMPT_SELECTORS:
            raise ValueError(
                f"prompt_selection.name={selection.name!r} is unknown; choose one of "
                f"{['none', *b.PROMPT_SELECTORS]}"
            )
        pool_size = selection.pool_size
        if pool_size and pool_size < t.prompts_per_step:
            raise ValueError(
                f"prompt_selection.pool_size={pool_size} is smaller than a batch of "
                f"train.prompts_per_step={t.prompts_per_step}"
            )
        if config.algorithm.name == "uec_rl":
            raise ValueError("prompt_selection does not combine with UEC-RL's own collection")
        if selection.name == "dare":
            b.build_dare_settings(config)
    if b.build_replay(config) is not None and config.algorithm.name == "uec_rl":
        raise ValueError("replay.name='fresh_per' does not combine with UEC-RL's own replay")
    lope = b.build_lope_settings(config)
    if lope is not None:
        if config.model.num_experts:
            raise ValueError(
                "lope does not combine with an MoE model yet (rescued rows would keep the failed "
                "rows' expert routes); set lope.num_perturbed=0 or model.num_experts=0"
            )
        if config.algorithm.name == "uec_rl":
            raise ValueError("lope does not combine with UEC-RL's own collection")
        max_len = config.lope.max_prompt_len
        if max_len <= config.task.max_prompt_len:
            raise ValueError(
                f"lope.max_prompt_len={max_len} must exceed task.max_prompt_len="
                f"{config.task.max_prompt_len} to leave room for the Lorem-Ipsum prefix"
            )
