"""Hugging Face Llama/Qwen2 checkpoints (config.json + safetensors) <-> rljax params.

Everything is read from and written to a local directory; nothing is fetched from a hub.
Tensors are read on the host (numpy, bf16 through ml_dtypes) and converted to our layouts:
HF `nn.Linear` weights are [out, in], ours are [in, ...] with the heads split out, e.g.
`q_proj.weight [H*hd, D]` -> `q_proj [D, H, hd]`. RoPE uses the same rotate-half layout as HF,
so q/k need no permutation.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_QWEN3 = ("qwen3", "qwen3_moe")  # per-head q/k RMSNorm; attention_bias sets all four biases
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"
_SUPPORTED_ROPE = ("default", "linear", "llama3")


# ----------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either transformers 4 or 5 style fields.

    transformers 4 writes a top-level `rope_theta` and an optional `rope_scaling` dict;
    transformers 5 writes one `rope_parameters` dict holding `rope_theta` and `rope_type`.
    """
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters/rope_scaling must be a dict, got {params!r}")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError(
            "per-layer-type rope_parameters are not supported by Llama/Qwen2 loading; "
            f"got keys {sorted(params)}"
        )
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported: rljax rotates the full head")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _SUPPORTED_ROPE:
        raise ValueError(f"rope type {kind!r} is not supported; supported: {_SUPPORTED_ROPE}")
    if kind == "default":
        return float(theta), None
    skip = ("rope_theta", "type", "rope_type", "partial_rotary_factor")
    scaling = {k: v for k, v in params.items() if k not in skip and v is not None}
    scaling["rope_type"] = kind
    return float(theta), scaling


def _moe_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-MoE's expert fields as TransformerConfig arguments (a KeyError if one is missing).

    Raises:
      ValueError: a stack that mixes dense and MoE layers (decoder_sparse_step != 1 or
        mlp_only_layers), which rljax's uniform blocks cannot hold.
    """
    step, dense = hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
    if step != 1 or dense:
        raise ValueError(
            f"decoder_sparse_step={step}, mlp_only_layers={dense}: mixed dense/MoE layer stacks "
            "are not supported; rljax needs experts in every layer (decoder_sparse_step=1, "
            "mlp_only_layers=[])"
        )
    experts = hf["num_experts"] if "num_experts" in hf else hf["num_local_experts"]
    expert_d_ff = hf["moe_intermediate_size"]
    return dict(
        num_experts=experts,
        experts_per_token=hf["num_experts_per_tok"],
        expert_d_ff=None if expert_d_ff == hf["intermediate_size"] else expert_d_ff,
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),  # Qwen3MoeConfig's default
    )


def config_from_hf(hf_config: dict[str, Any]) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face Llama, Qwen2, Qwen3 or Qwen3-MoE `config.json`.

    Raises:
      ValueError: for a model type or feature rljax does not implement (sliding-window
        attention, MLP biases, a non-SiLU activation, an unsupported RoPE scaling).
    """
    hf = hf_config
    model_type = hf.get("model_type")
    if model_type is None:  # fall back on the architecture name
        by_arch = {arch: mt for mt, arch in _ARCHITECTURES.items()}
        model_type = next((by_arch[a] for a in hf.get("architectures") or [] if a in by_arch), None)
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"model_type {model_type!r} (architectures {hf.get('architectures')}) is not "
            f"supported; supported model types: {sorted(_ARCHITECTURES)} "
            f"({sorted(_ARCHITECTURES.values())})"
        )
    archs = hf.get("architectures")
    if archs and _ARCHITECTURES[model_type] not in archs:
        raise ValueError(
            f"architectures {archs} are not supported for model_type {model_type!r}; "
            f"rljax loads only {_ARCHITECTURES[model_type]}"
        )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported: rljax's MLP is SwiGLU with silu")
    if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported: rljax's MLP has no biases")
    if hf.get("use_sliding_window", False) or "sliding_attention" in (hf.get("layer_types") or []):
        raise ValueError(
            "sliding-window attention (use_sliding_window=True) is not supported; "
            "set use_sliding_window=false in config.json if the window exceeds "
            "every sequence you will run"
        )
    if model_type == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(hf.get("attention_bias", False))
    theta, scaling = _rope_from_hf(hf)
    try:
        heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
        head_dim = hf.get("head_dim", 128 if model_type == "qwen3" else None)  # HF's defaults
        moe = _moe_from_hf(hf) if model_type == "qwen3_moe" else {}
        if head_dim is not None and head_dim * heads == d_model:
            head_dim = None  # the default; keeps configs equal across a save/load round trip
        return TransformerConfig(
            vocab_size=hf["vocab_size"],
            d_model=d_model,
            n_layers=hf["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            d_ff=hf["intermediate_size"],
            head_dim=head_dim,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=model_type in _QWEN3,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            **moe,
        )
    except KeyError as e:
        raise ValueError(f"config.json lacks required field {e.args[0]!r}") from None


def config_to_hf(config: TransformerConfig, model_type: str = "qwen2") -> dict[str, Any]:
    """A `config.json` dict transformers can load (both its 4.x and 5.x rope fields are written)."""
    if model_type not in _ARCHITECTURES:
        raise ValueError(f"model_type={model_type!r}; use one of {sorted(_ARCHITECTURES)}")
    if bool(config.num_experts) != (model_type == "qwen3_moe"):
        raise ValueError(
            f"model_type={model_type!r} cannot hold a config with num_experts="
            f"{config.num_experts}; save it with model_type="
            + ("'qwen3_moe'" if config.num_experts else "'qwen3', 'qwen2' or 'llama'")
        )
    if config.qk_norm != (model_type in _QWEN3):
        raise ValueError(
            f"model_type={model_type!r} cannot hold a config with qk_norm={config.qk_norm}; "
            + (
                "save it with model_type='qwen3'"
                if config.qk_norm
                else "save it with 'qwen2' or 'llama'"
            )
        )
    if model_type == "qwen2" and (not config.qkv_bias or config.o_bias):
        raise ValueError(
            "Qwen2 always has q/k/v biases and no output bias, but this config has "
            f"qkv_bias={config.qkv_bias}, o_bias={config.o_bias}; "
            "save it with model_type='llama'"
        )
    if model_type != "qwen2" and config.qkv_bias != config.o_bias:
        raise ValueError(
            f"{_ARCHITECTURES[model_type]}'s attention_bias sets q/k/v and output biases "
            f"together, but this config has qkv_bias={config.qkv_bias}, o_bias={config.o_bias}; "
            + (
                "save it with model_type='qwen2'"
                if config.qkv_bias
                else "Llama/Qwen2 cannot express it"
            )
        )
    scaling = config.rope_scaling_dict
    rope_parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": config.rope_theta}
    hf = {
        "architectures": [_ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.resolved_head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "rope_theta": config.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": rope_parameters,
        "torch_dtype": config.param_dtype,
        "dtype": config.param_dtype,
    }
    if model_type == "llama":
        hf.update(attention_bias=config.qkv_bias, mlp_bias=False)
    elif model_type == "qwen2":
        hf.update(use_sliding_window=False)
    else:
        hf.update(attention_bias=config.qkv_bias, use_sliding_window=False)
    if config.num_experts:
        hf.update(
            num_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            moe_intermediate_size=config.resolved_expert_d_ff,
            norm_topk_prob=config.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return hf


# ----------------------------------------------------------------------------------------------
# Tensor name and layout mapping


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One HF tensor: its name, our param path, its HF shape, and the layout conversions.

    `expert` is None, or the index of this tensor along the leading (expert) axis of our
    stacked MoE param at `path` (HF stores one tensor per expert); the specs of one stack come
    in expert order.
    """

    hf_name: str
    path: tuple[Any, ...]
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    expert: int | None = None


def _linear(shape_ours: tuple[int, ...]):
    """HF [out, in] <-> ours [in, *out_split] (q/k/v/gate/up/lm_head)."""
    return (lambda w: w.T.reshape(shape_ours)), (lambda p: p.reshape(shape_ours[0], -1).T)


def _linear_in_split(shape_ours: tuple[int, ...]):
    """HF [out, in] <-> ours [*in_split, out] (o_proj, down_proj)."""
    return (lambda w: w.T.reshape(shape_ours)), (lambda p: p.reshape(-1, shape_ours[-1]).T)


def _reshape(shape_ours: tuple[int, ...]):
    return (lambda w: w.reshape(shape_ours)), (lambda p: p.reshape(-1))


def _moe_specs(config: TransformerConfig, i: int) -> list[_Spec]:
    """Layer i's Qwen3-MoE tensors: the router `mlp.gate` and each expert's SwiGLU."""
    d, e, f = config.d_model, config.num_experts, config.resolved_expert_d_ff
    pre, mlp = f"model.layers.{i}.mlp.", ("layers", i, "mlp")
    specs = [_Spec(pre + "gate.weight", (*mlp, "router"), (e, d), *_linear((d, e)))]
    for name, hf_shape, layout in (
        ("gate_proj", (f, d), _linear((d, f))),
        ("up_proj", (f, d), _linear((d, f))),
        ("down_proj", (d, f), _linear_in_split((f, d))),
    ):
        specs += [
            _Spec(f"{pre}experts.{j}.{name}.weight", (*mlp, name), hf_shape, *layout, expert=j)
            for j in range(e)
        ]
    return specs


def _specs(config: TransformerConfig) -> list[_Spec]:
    """Every tensor a Llama/Qwen2/Qwen3(-MoE) checkpoint of this config holds."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    h, k, hd = config.n_heads, config.n_kv_heads, config.resolved_head_dim
    same = (lambda w: w), (lambda p: p)
    specs = [
        _Spec("model.embed_tokens.weight", ("embed",), (v, d), *same),
        _Spec("model.norm.weight", ("final_norm", "weight"), (d,), *same),
    ]
    if not config.tie_embeddings:
        specs.append(_Spec("lm_head.weight", ("lm_head",), (v, d), *_linear((d, v))))
    for i in range(config.n_layers):
        pre = f"model.layers.{i}."
        attn = pre + "self_attn."
        specs += [
            _Spec(
                attn + "q_proj.weight",
                ("layers", i, "attn", "q_proj"),
                (h * hd, d),
                *_linear((d, h, hd)),
            ),
            _Spec(
                attn + "k_proj.weight",
                ("layers", i, "attn", "k_proj"),
                (k * hd, d),
                *_linear((d, k, hd)),
            ),
            _Spec(
                attn + "v_proj.weight",
                ("layers", i, "attn", "v_proj"),
                (k * hd, d),
                *_linear((d, k, hd)),
            ),
            _Spec(
                attn + "o_proj.weight",
                ("layers", i, "attn", "o_proj"),
                (d, h * hd),
                *_linear_in_split((h, hd, d)),
            ),
            _Spec(
                pre + "input_layernorm.weight", ("layers", i, "attn_norm", "weight"), (d,), *same
            ),
            _Spec(
                pre + "post_attention_layernorm.weight",
                ("layers", i, "mlp_norm", "weight"),
                (d,),
                *same,
            ),
        ]
        if config.num_experts:
            specs += _moe_specs(config, i)
        else:
            specs += [
                _Spec(
                    pre + "mlp.gate_proj.weight",
                    ("layers", i, "mlp", "gate_proj"),
                    (f, d),
                    *_linear((d, f)),
                ),
                _Spec(
                    pre + "mlp.up_proj.weight",
                    ("layers", i, "mlp", "up_proj"),
                    (f, d),
                    *_linear((d, f)),
                ),
                _Spec(
                    pre + "mlp.down_proj.weight",
                    ("layers", i, "mlp", "down_proj"),
                    (d, f),
                    *_linear_in_split((f, d)),
                ),
            ]
        if config.qk_norm:
            specs += [
                _Spec(
                    attn + "q_norm.weight", ("layers", i, "attn", "q_norm", "weight"), (hd,), *same
                ),
                _Spec(
                    attn + "k_norm.weight", ("layers", i, "attn", "k_norm", "weight"), (hd,), *same
                ),
            ]
        if config.qkv_bias:
            specs += [
                _Spec(
                    attn + "q_proj.bias",
                    ("layers", i, "attn", "q_bias"),
                    (h * hd,),
                    *_reshape((h, hd)),
                ),
                _Spec(
                    attn + "k_proj.bias",
                    ("layers", i, "attn", "k_bias"),
                    (k * hd,),
                    *_reshape((k, hd)),
                ),
                _Spec(
                    attn + "v_proj.bias",
                    ("layers", i, "attn", "v_bias"),
                    (k * hd,),
                    *_reshape((k, hd)),
                ),
            ]
        if config.o_bias:
            specs.append(_Spec(attn + "o_proj.bias", ("layers", i, "attn", "o_bias"), (d,), *same))
    return specs


def _ignorable(name: str, config: TransformerConfig) -> bool:
    """Tensors a checkpoint may carry that we do not need (recomputed buffers, a tied head)."""
    return name.endswith("rotary_emb.inv_freq") or (
        config.tie_embeddings and name == "lm_head.weight"
    )


# ----------------------------------------------------------------------------------------------
# Loading


def _read_json(file: str) -> dict[str, Any]:
    """A checkpoint's JSON file; a damaged one is a one-line error naming it."""
    try:
        with open(file, encoding="utf-8") as fh:
            return json.load(fh)
    except ValueError as err:  # invalid JSON or UTF-8: a cut-off or corrupted download
        raise ValueError(f"{file} is damaged (truncated?): {err}; re-download it") from None


def _weight_files(path: str) -> list[str]:
    """The safetensors files of a checkpoint directory: one file, or the shards of an index."""
    single = os.path.join(path, _SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    index = os.path.join(path, _INDEX_FILE)
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no 'weight_map'; re-save the checkpoint")
        files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"{index} lists shard files that do not exist: {missing}; "
                "copy the complete checkpoint directory"
            )
        return files
    raise FileNotFoundError(
        f"no weights in {path}: expected {_SINGLE_FILE} or {_INDEX_FILE} (safetensors). "
        "Convert .bin/.pt checkpoints with transformers' save_pretrained(safe_serialization=True)"
    )


def _read_tensors(files: list[str]) -> dict[str, np.ndarray]:
    """All tensors of the files as host numpy arrays (bf16 as ml_dtypes.bfloat16).

    safetensors' numpy backend cannot represent bf16, so this reads through its flax backend
    with jax pinned to the CPU, which keeps the tensors on the host.
    """
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS excludes the CPU; the default device will do.
        cpu = None
    tensors: dict[str, np.ndarray] = {}
    with jax.default_device(cpu):
        for file in files:
            try:
                with safetensors.safe_open(file, framework="flax") as fh:
                    for name in fh.keys():
                        if name in tensors:
                            raise ValueError(
                                f"tensor {name!r} appears in more than one shard ({file})"
                            )
                        tensors[name] = np.asarray(fh.get_tensor(name))
            except safetensors.SafetensorError as err:  # a cut-off download, flipped bytes
                raise ValueError(f"{file} is damaged (truncated?): {err}; re-download it") from None
    return tensors


def _set_path(tree: dict, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get_path(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def load_hf_checkpoint(
    path: str,
    dtype: str = "float32",
    param_dtype: str = "float32",
) -> tuple[TransformerConfig, nnx.GraphDef, nnx.State]:
    """Load a local Llama/Qwen2 checkpoint directory as (config, graphdef, params).

    Args:
      path: a directory holding config.json and model.safetensors (or a sharded
        model.safetensors.index.json with its shard files).
      dtype: compute dtype of the returned config ("float32", "bfloat16", "float16").
      param_dtype: storage dtype the weights are cast to.

    Returns:
      The config, and (graphdef, params) as `create_model` would return them.

    Raises:
      FileNotFoundError: the directory, config.json or the weights are missing.
      ValueError: an unsupported architecture, tensors missing, extra or of the wrong shape, or
        a damaged (e.g. truncated) safetensors file.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"checkpoint directory {path!r} does not exist; pass the local "
            "directory that holds config.json and model.safetensors"
        )
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"{config_file} not found; a Hugging Face checkpoint directory "
            "needs its config.json next to the safetensors weights"
        )
    config = config_from_hf(_read_json(config_file)).replace(dtype=dtype, param_dtype=param_dtype)
    tensors = _read_tensors(_weight_files(path))

    graphdef, params = abstract_model(config)
    target = _NP_DTYPES[config.param_dtype]
    pure: dict = {}
    specs = _specs(config)
    missing = [s.hf_name for s in specs if s.hf_name not in tensors]
    if missing:
        raise ValueError(
            f"checkpoint {path} lacks {len(missing)} tensor(s) this config needs, e.g. "
            f"{missing[:5]}; check that config.json matches the weights"
        )
    stacks: dict[tuple[Any, ...], list[np.ndarray]] = {}  # MoE params, one entry per expert
    for spec in specs:
        weight = tensors.pop(spec.hf_name)
        if tuple(weight.shape) != spec.hf_shape:
            raise ValueError(
                f"tensor {spec.hf_name!r} has shape {tuple(weight.shape)}, expected "
                f"{spec.hf_shape} from config.json; check that config and weights match"
            )
        value = np.ascontiguousarray(spec.to_ours(weight).astype(target))
        if spec.expert is None:
            _set_path(pure, spec.path, jnp.asarray(value))
        else:
            stacks.setdefault(spec.path, []).append(value)
    for param_path, experts in stacks.items():
        _set_path(pure, param_path, jnp.asarray(np.stack(experts)))
    extra = sorted(n for n in tensors if not _ignorable(n, config))
    if extra:
        raise ValueError(
            f"checkpoint {path} has {len(extra)} tensor(s) that the model described by "
            f"its config.json does not use, e.g. {extra[:5]}; the weights probably "
            "belong to another architecture or config"
        )
    nnx.replace_by_pure_dict(params, pure)
    return config, graphdef, params


# ----------------------------------------------------------------------------------------------
# Saving


def _shards(tensors: dict[str, np.ndarray], shard_size: int | None) -> list[dict[str, np.ndarray]]:
    """Greedy split in name order; a tensor larger than shard_size gets a shard of its own."""
    total = sum(t.nbytes for t in tensors.values())
    if shard_size is None or total <= shard_size:
        return [tensors]
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > shard_size:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    return shards


def save_hf_checkpoint(
    path: str,
    config: TransformerConfig,
    params: nnx.State,
    model_type: str = "qwen2",
    shard_size: int | None = None,
    extra_config: dict[str, Any] | None = None,
) -> None:
    """Write params as a Hugging Face checkpoint directory that transformers can load.

    Args:
      path: output directory (created if needed). Old model*.safetensors files and the index
        in it are removed first, so a stale single file can never shadow new shards.
      config: the model's config.
      params: an `nnx.State` (or its pure dict) of that config.
      model_type: "qwen2" (q/k/v biases, no output bias), "llama" (attention_bias sets both),
        "qwen3" (q/k norms; attention_bias as Llama) or "qwen3_moe" (Qwen3 with experts).
      shard_size: maximum bytes per file; when the weights exceed it they are written as
        model-0000i-of-0000N.safetensors shards plus model.safetensors.index.json.
      extra_config: additional config.json fields (e.g. bos_token_id, max_position_embeddings).
    """
    hf_config = config_to_hf(config, model_type)
    hf_config.update(extra_config or {})
    pure = params if isinstance(params, dict) else nnx.to_pure_dict(params)
    tensors: dict[str, np.ndarray] = {}
    for spec in _specs(config):
        try:
            value = np.asarray(jax.device_get(_get_path(pure, spec.path)))
            if spec.expert is not None:
                value = value[spec.expert]
        except (KeyError, TypeError, IndexError):
            raise ValueError(
                f"params lack {'/'.join(map(str, spec.path))} (for {spec.hf_name}); "
                "pass params created for this config"
            ) from None
        hf_value = np.ascontiguousarray(spec.to_hf(value))
        if hf_value.shape != spec.hf_shape:
            raise ValueError(
                f"param {'/'.join(map(str, spec.path))} has shape {value.shape}, which "
                f"does not give {spec.hf_name} {spec.hf_shape}; pass params of this config"
            )
        tensors[spec.hf_name] = hf_value

    os.makedirs(path, exist_ok=True)
    stale = [os.path.join(path, _SINGLE_FILE), os.path.join(path, _INDEX_FILE)]
    stale += glob.glob(os.path.join(path, "model-*-of-*.safetensors"))
    for file in stale:
        if os.path.isfile(file):
            os.remove(file)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(hf_config, fh, indent=2, sort_keys=True)
    metadata = {"format": "pt"}
    shards = _shards(tensors, shard_size)
    if len(shards) == 1:
        safetensors.numpy.save_file(tensors, os.path.join(path, _SINGLE_FILE), metadata=metadata)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(shard, os.path.join(path, name), metadata=metadata)
        weight_map.update({tensor: name for tensor in shard})
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
        "weight_map": weight_map,
    }
    with open(os.path.join(path, _INDEX_FILE), "w", encoding="utf-8") as fh:
        json.dump(index, fh, indent=2, sort_keys=True)
