"""Hugging Face Llama, Qwen2/3, Mistral, Mixtral and Gemma 3 text checkpoints (config.json +
safetensors).

Everything is read from and written to a local directory; nothing is fetched from a hub.
Tensors are read on the host (numpy, bf16 through ml_dtypes) and converted to our layouts:
HF `nn.Linear` weights are [out, in], ours are [in, ...] with the heads split out, e.g.
`q_proj.weight [H*hd, D]` -> `q_proj [D, H, hd]`. RoPE uses the same rotate-half layout as HF,
so q/k need no permutation. Mixtral's experts are stored one tensor per expert
(`block_sparse_moe.experts.{e}.w1/w2/w3`, the layout transformers writes and real checkpoints
use) and stacked into our [expert, ...] MoE parameters. Gemma 3's norm weights w (scale
1 + w) are kept as stored: our RMSNorm applies the offset (`norm_unit_offset`).
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
from rljax.models.transformer import abstract_model, stack_layers, unstack_layers

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
_GEMMA3 = "gemma3_text"
# The TransformerConfig fields only Gemma 3 sets, with the values a Gemma 3 config has.
_GEMMA3_FIELDS = dict(
    norm_unit_offset=True,
    sandwich_norms=True,
    scale_embeddings=True,
    mlp_activation="gelu_tanh",
    qk_norm=True,
)
_GEMMA3_ACTIVATION = "gelu_pytorch_tanh"  # HF's name for GELU with the tanh approximation
_QWEN3 = ("qwen3", "qwen3_moe")  # per-head q/k RMSNorm; attention_bias sets all four biases
_MOE = ("mixtral", "qwen3_moe")  # the families with experts
# Families whose every layer has the sliding window of config.json's `sliding_window` (null: off).
_WINDOW_EVERY_LAYER = ("mistral", "mixtral")
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


def _windows_from_hf(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
    """TransformerConfig's `sliding_window` and `layer_types`, as transformers 5 reads them.

    Mistral/Mixtral window every layer by `sliding_window` (null: none) and, like transformers,
    ignore `layer_types`. Qwen2 windows only with `use_sliding_window`, then the layers given by
    `layer_types` or, without it, those with index >= `max_window_layers` (default 28).
    """
    types = hf.get("layer_types")
    if model_type in _WINDOW_EVERY_LAYER:
        return dict(sliding_window=hf.get("sliding_window"), layer_types=None)
    if model_type != "qwen2":
        if hf.get("use_sliding_window", False) or "sliding_attention" in (types or []):
            raise ValueError(
                f"sliding-window attention is not supported for model_type {model_type!r}; "
                f"windowed families: qwen2 (use_sliding_window), {list(_WINDOW_EVERY_LAYER)}"
            )
        return dict(sliding_window=None, layer_types=None)
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    if window is None:
        if "sliding_attention" in (types or []):
            raise ValueError(
                "config.json has sliding_attention layer_types but no window "
                "(use_sliding_window false or sliding_window null); fix config.json"
            )
        return dict(sliding_window=None, layer_types=None)
    n = hf.get("num_hidden_layers", 0)
    if types is None:
        first = hf.get("max_window_layers", 28)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(
            f"config.json layer_types has {unknown}; rljax supports full_attention and "
            "sliding_attention layers"
        )
    if "sliding_attention" not in types:
        return dict(sliding_window=None, layer_types=None)
    if "full_attention" not in types:
        return dict(sliding_window=window, layer_types=None)
    return dict(sliding_window=window, layer_types=tuple(types))


def _qwen3_moe_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
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


def _moe_from_hf(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
    """TransformerConfig's MoE fields (Mixtral: softmax over the top-k = renormalised)."""
    if model_type == "qwen3_moe":
        try:
            return _qwen3_moe_from_hf(hf)
        except KeyError as e:
            raise ValueError(f"config.json lacks required field {e.args[0]!r}") from None
    if model_type != "mixtral":
        return {}
    try:
        return dict(
            num_experts=hf["num_local_experts"],
            experts_per_token=hf["num_experts_per_tok"],
            norm_topk_prob=True,
        )
    except KeyError as e:
        raise ValueError(f"config.json lacks required field {e.args[0]!r}") from None


def hf_model_type(hf: dict[str, Any]) -> str | None:
    """A `config.json`'s model_type, or the one its architecture names imply (None: neither)."""
    model_type = hf.get("model_type")
    if model_type is None:  # fall back on the architecture name
        by_arch = {arch: mt for mt, arch in _ARCHITECTURES.items()}
        model_type = next((by_arch[a] for a in hf.get("architectures") or [] if a in by_arch), None)
    return model_type


def config_from_hf(hf_config: dict[str, Any]) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral or Mixtral
    `config.json`.

    Raises:
      ValueError: for a model type or feature rljax does not implement (sliding windows on
        Llama or Qwen3, MLP biases, a non-SiLU activation, an unsupported RoPE scaling).
    """
    hf = hf_config
    model_type = hf_model_type(hf)
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
    if model_type == _GEMMA3:
        return _gemma3_from_hf(hf)
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported: rljax's MLP is SwiGLU with silu")
    if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported: rljax's MLP has no biases")
    windows = _windows_from_hf(hf, model_type)
    moe = _moe_from_hf(hf, model_type)
    if model_type == "qwen2":
        qkv_bias, o_bias = True, False
    elif model_type in _WINDOW_EVERY_LAYER:  # Mistral/Mixtral attention has no biases
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = bool(hf.get("attention_bias", False))
    theta, scaling = _rope_from_hf(hf)
    try:
        heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
        head_dim = hf.get("head_dim", 128 if model_type == "qwen3" else None)  # HF's defaults
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
            **windows,
            **moe,
        )
    except KeyError as e:
        raise ValueError(f"config.json lacks required field {e.args[0]!r}") from None


def _gemma3_rope_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """rope_theta, rope_scaling (full-attention layers) and rope_local_theta of a Gemma 3
    config.json: transformers 5's per-layer-type `rope_parameters`, or 4.x's `rope_theta`,
    `rope_scaling` and `rope_local_base_freq` (defaults 1e6 and 1e4, as Gemma3TextConfig)."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or {
        "rope_theta": hf.get("rope_theta", 1_000_000.0),
        **(hf.get("rope_scaling") or {}),
    }
    local = params.get("sliding_attention") or {
        "rope_theta": hf.get("rope_local_base_freq", 10_000.0)
    }
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ValueError(
            f"sliding_attention rope_parameters {local} are not supported: rljax rotates "
            "Gemma 3's local layers with the default RoPE of base rope_local_base_freq"
        )
    theta, scaling = _rope_from_hf({"rope_parameters": full})
    return dict(rope_theta=theta, rope_scaling=scaling, rope_local_theta=float(local["rope_theta"]))


def _gemma3_from_hf(hf: dict[str, Any]) -> TransformerConfig:
    """A TransformerConfig from a Gemma 3 text (`gemma3_text`) config.json, with
    Gemma3TextConfig's defaults for the fields it omits."""
    act = hf.get("hidden_activation", hf.get("hidden_act", _GEMMA3_ACTIVATION))
    if act != _GEMMA3_ACTIVATION:
        raise ValueError(
            f"hidden_activation={act!r} is not supported for gemma3_text: rljax's GeGLU uses "
            f"{_GEMMA3_ACTIVATION!r}"
        )
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError(
            f"attn_logit_softcapping={hf['attn_logit_softcapping']} is not supported: "
            "transformers' Gemma 3 ignores it and Gemma 3 checkpoints set null; set it to null"
        )
    if hf.get("use_bidirectional_attention"):
        raise ValueError(
            "use_bidirectional_attention=true is not supported: rljax's Gemma 3 is causal"
        )
    n = hf.get("num_hidden_layers", 0)
    types = hf.get("layer_types")
    if types is None:  # Gemma3TextConfig's default: every `sliding_window_pattern`-th is global
        pattern = hf.get("sliding_window_pattern", 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    windows = _windows_from_hf(
        {
            "use_sliding_window": True,
            "sliding_window": hf.get("sliding_window", 4096),
            "layer_types": types,
        },
        "qwen2",
    )
    try:
        heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
        head_dim = hf.get("head_dim", 256)
        scalar = hf.get("query_pre_attn_scalar", 256)
        return TransformerConfig(
            vocab_size=hf.get("vocab_size", 262_208),
            d_model=d_model,
            n_layers=hf["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            d_ff=hf["intermediate_size"],
            head_dim=None if head_dim * heads == d_model else head_dim,
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            qkv_bias=bool(hf.get("attention_bias", False)),
            o_bias=bool(hf.get("attention_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
            query_pre_attn_scalar=None if scalar == head_dim else int(scalar),
            final_logit_softcap=hf.get("final_logit_softcapping"),
            **_gemma3_rope_from_hf(hf),
            **windows,
            **_GEMMA3_FIELDS,
        )
    except KeyError as e:
        raise ValueError(f"config.json lacks required field {e.args[0]!r}") from None


def _gemma3_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The config.json fields of a Gemma 3 text model (both transformers 4 and 5 rope fields).

    Raises:
      ValueError: a config Gemma 3 cannot express (no local RoPE base, unequal biases).
    """
    if config.rope_local_theta is None:
        raise ValueError(
            "gemma3_text needs TransformerConfig.rope_local_theta (rope_local_base_freq); set it "
            "to save this config as Gemma 3"
        )
    if config.qkv_bias != config.o_bias:
        raise ValueError(
            "Gemma3ForCausalLM's attention_bias sets q/k/v and output biases together, but "
            f"this config has qkv_bias={config.qkv_bias}, o_bias={config.o_bias}; save it as "
            "'qwen2'"
        )
    scaling = config.rope_scaling_dict
    local = {"rope_type": "default", "rope_theta": config.rope_local_theta}
    windows = config.layer_windows
    return {
        "hidden_activation": _GEMMA3_ACTIVATION,
        "attention_bias": config.qkv_bias,
        "query_pre_attn_scalar": config.query_pre_attn_scalar or config.resolved_head_dim,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": config.final_logit_softcap,
        "rope_local_base_freq": config.rope_local_theta,
        "rope_parameters": {
            "full_attention": {
                "rope_type": "default",
                **(scaling or {}),
                "rope_theta": config.rope_theta,
            },
            "sliding_attention": local,
        },
        "sliding_window": config.sliding_window,
        "layer_types": ["sliding_attention" if w else "full_attention" for w in windows],
        "use_bidirectional_attention": False,
    }


def _check_gemma3_fields(config: TransformerConfig, model_type: str) -> None:
    """Gemma 3's numerics are saved as gemma3_text and only there (a one-line error else)."""
    gemma = model_type == _GEMMA3
    for field, value in _GEMMA3_FIELDS.items():
        if field == "qk_norm" and not gemma:
            continue  # Qwen3 has q/k norms too
        if (getattr(config, field) == value) != gemma:
            raise ValueError(
                f"model_type={model_type!r} cannot hold a config with {field}="
                f"{getattr(config, field)!r}; "
                + ("Gemma 3 always has it" if gemma else "save it with model_type='gemma3_text'")
            )
    if not gemma:
        for field in (
            "query_pre_attn_scalar",
            "rope_local_theta",
            "final_logit_softcap",
        ):
            if getattr(config, field) is not None:
                raise ValueError(
                    f"model_type={model_type!r} cannot hold a config with {field}="
                    f"{getattr(config, field)}; save it with model_type='gemma3_text'"
                )


def _family_to_hf(config: TransformerConfig, model_type: str) -> dict[str, Any]:
    """The config.json fields of the window and the experts, for a family that can hold them."""
    if model_type in _WINDOW_EVERY_LAYER and (config.qkv_bias or config.o_bias):
        raise ValueError(
            f"{model_type} attention has no biases, but this config has "
            f"qkv_bias={config.qkv_bias}, o_bias={config.o_bias}; save it as 'qwen2' or 'llama'"
        )
    windows = config.layer_windows
    fields: dict[str, Any] = {}
    if model_type == "qwen3_moe":
        fields.update(
            num_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            moe_intermediate_size=config.resolved_expert_d_ff,
            norm_topk_prob=config.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    elif config.num_experts:
        if not config.norm_topk_prob:
            raise ValueError(
                "Mixtral renormalises the top-k routing weights; this config has "
                "norm_topk_prob=False, which it cannot express"
            )
        fields.update(
            num_local_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            intermediate_size=config.resolved_expert_d_ff,
        )
    if model_type in _WINDOW_EVERY_LAYER:
        if len(set(windows)) > 1:
            raise ValueError(
                f"{model_type} windows every layer alike, but this config's layer_types mix "
                "full and sliding layers; save it as 'qwen2' (dense) or drop layer_types"
            )
        return {**fields, "sliding_window": windows[0]}
    if model_type == "llama" or model_type in _QWEN3:
        if any(windows):
            raise ValueError(
                f"{'Llama' if model_type == 'llama' else 'Qwen3'} has no sliding-window "
                "attention; save this config as "
                "'mistral' (every layer windowed) or 'qwen2'"
            )
        return fields if model_type == "llama" else {**fields, "use_sliding_window": False}
    sliding = [w is not None for w in windows]
    return {
        **fields,
        "use_sliding_window": any(sliding),
        "sliding_window": config.sliding_window if any(sliding) else None,
        "max_window_layers": sliding.index(True) if any(sliding) else config.n_layers,
        "layer_types": ["sliding_attention" if w else "full_attention" for w in sliding],
    }


def fitting_model_type(config: TransformerConfig) -> str:
    """The Hugging Face family whose checkpoint holds `config` (`config_to_hf` still refuses
    what none can express, e.g. an output bias without q/k/v biases)."""
    if any(getattr(config, field) for field in ("norm_unit_offset", "sandwich_norms")):
        return _GEMMA3
    if config.qk_norm:
        return "qwen3_moe" if config.num_experts else "qwen3"
    if config.num_experts:
        return "mixtral"
    windows = config.layer_windows
    if (config.qkv_bias and not config.o_bias) or len(set(windows)) > 1:
        return "qwen2"
    return "mistral" if any(windows) else "llama"


def config_to_hf(config: TransformerConfig, model_type: str = "qwen2") -> dict[str, Any]:
    """A `config.json` dict transformers can load (both its 4.x and 5.x rope fields are written)."""
    if model_type not in _ARCHITECTURES:
        raise ValueError(f"model_type={model_type!r}; use one of {sorted(_ARCHITECTURES)}")
    if config.num_experts and model_type not in _MOE:
        raise ValueError(
            f"model_type={model_type!r} cannot hold a config with num_experts="
            f"{config.num_experts}; save mixture-of-experts models as 'mixtral' or 'qwen3_moe'"
        )
    if not config.num_experts and model_type in _MOE:
        raise ValueError(
            f"model_type={model_type!r} cannot hold a config with num_experts=0; save dense "
            "models as 'llama', 'qwen2', 'qwen3' or 'mistral'"
        )
    _check_gemma3_fields(config, model_type)
    if model_type != _GEMMA3 and config.qk_norm != (model_type in _QWEN3):
        raise ValueError(
            f"model_type={model_type!r} cannot hold a config with qk_norm={config.qk_norm}; "
            + (
                "save it with model_type='qwen3' or 'qwen3_moe'"
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
    if model_type in ("llama", *_QWEN3) and config.qkv_bias != config.o_bias:
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
    if model_type == _GEMMA3:
        del hf["hidden_act"]  # Gemma names it hidden_activation
        hf.update(_gemma3_to_hf(config))
        return hf
    if model_type == "llama":
        hf.update(attention_bias=config.qkv_bias, mlp_bias=False)
    elif model_type in _QWEN3:
        hf.update(attention_bias=config.qkv_bias)
    hf.update(_family_to_hf(config, model_type))
    return hf


# ----------------------------------------------------------------------------------------------
# Tensor name and layout mapping


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One HF tensor: its name, our param path, its HF shape, and the layout conversions.

    With `experts` > 0 the spec stands for one tensor per expert (`hf_name` holds "{e}"), each
    of shape `hf_shape`; the conversions see them stacked on a new leading expert axis.
    """

    hf_name: str
    path: tuple[Any, ...]
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    experts: int = 0

    @property
    def hf_names(self) -> list[str]:
        """The checkpoint tensors this spec reads and writes."""
        if not self.experts:
            return [self.hf_name]
        return [self.hf_name.format(e=e) for e in range(self.experts)]


def _linear(shape_ours: tuple[int, ...]):
    """HF [out, in] <-> ours [in, *out_split] (q/k/v/gate/up/lm_head)."""
    return (lambda w: w.T.reshape(shape_ours)), (lambda p: p.reshape(shape_ours[0], -1).T)


def _linear_in_split(shape_ours: tuple[int, ...]):
    """HF [out, in] <-> ours [*in_split, out] (o_proj, down_proj)."""
    return (lambda w: w.T.reshape(shape_ours)), (lambda p: p.reshape(-1, shape_ours[-1]).T)


def _reshape(shape_ours: tuple[int, ...]):
    return (lambda w: w.reshape(shape_ours)), (lambda p: p.reshape(-1))


# Each MoE family's names for its block, router and SwiGLU experts' (gate, up, down) tensors.
_MOE_NAMES = {
    "mixtral": ("block_sparse_moe.", "gate", ("w1", "w3", "w2")),
    "qwen3_moe": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
}


def _moe_specs(config: TransformerConfig, model_type: str, pre: str, i: int) -> list[_Spec]:
    """Layer i's sparse-MoE block: the router [E, D] and the per-expert SwiGLU gate and up
    [F, D] and down [D, F] tensors, stacked into our [E, ...] params."""
    d, e, f = config.d_model, config.num_experts, config.resolved_expert_d_ff
    if model_type not in _MOE_NAMES:
        raise ValueError(f"model_type={model_type!r} has no experts; MoE types: {list(_MOE_NAMES)}")
    block, router, (gate, up, down) = _MOE_NAMES[model_type]
    moe, path = pre + block, ("layers", i, "mlp")
    swap = (lambda w: np.swapaxes(w, 1, 2)), (lambda p: np.swapaxes(p, 1, 2))
    return [
        _Spec(f"{moe}{router}.weight", (*path, "router"), (e, d), *_linear((d, e))),
        _Spec(f"{moe}experts.{{e}}.{gate}.weight", (*path, "gate_proj"), (f, d), *swap, experts=e),
        _Spec(f"{moe}experts.{{e}}.{up}.weight", (*path, "up_proj"), (f, d), *swap, experts=e),
        _Spec(f"{moe}experts.{{e}}.{down}.weight", (*path, "down_proj"), (d, f), *swap, experts=e),
    ]


def _specs(config: TransformerConfig, model_type: str | None = None) -> list[_Spec]:
    """Every tensor a checkpoint of this config and model type holds (an MoE config needs
    its model type: the families name their experts differently)."""
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
        ]
        if config.sandwich_norms:  # Gemma: post_attention_layernorm norms the attention output
            specs += [
                _Spec(pre + f"{n}.weight", ("layers", i, ours, "weight"), (d,), *same)
                for n, ours in (
                    ("post_attention_layernorm", "post_attn_norm"),
                    ("pre_feedforward_layernorm", "mlp_norm"),
                    ("post_feedforward_layernorm", "post_mlp_norm"),
                )
            ]
        else:
            specs.append(
                _Spec(
                    pre + "post_attention_layernorm.weight",
                    ("layers", i, "mlp_norm", "weight"),
                    (d,),
                    *same,
                )
            )
        if config.qk_norm:
            specs += [
                _Spec(attn + f"{n}.weight", ("layers", i, "attn", n, "weight"), (hd,), *same)
                for n in ("q_norm", "k_norm")
            ]
        if config.num_experts:
            specs += _moe_specs(config, model_type, pre, i)
        else:
            mlp = ("layers", i, "mlp")
            specs += [
                _Spec(pre + "mlp.gate_proj.weight", (*mlp, "gate_proj"), (f, d), *_linear((d, f))),
                _Spec(pre + "mlp.up_proj.weight", (*mlp, "up_proj"), (f, d), *_linear((d, f))),
                _Spec(
                    pre + "mlp.down_proj.weight",
                    (*mlp, "down_proj"),
                    (d, f),
                    *_linear_in_split((f, d)),
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


def tensor_names(config: TransformerConfig, model_type: str) -> dict[tuple[str, ...], list[str]]:
    """Our param path (as names) -> the HF tensor names it is saved as (one per expert for
    stacked experts): what an exporter of per-parameter extras (LoRA adapters) maps through."""
    return {tuple(map(str, s.path)): s.hf_names for s in _specs(config, model_type)}


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
    """Load a local Llama/Qwen2/Mistral/Mixtral checkpoint directory as (config, graphdef, params).

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
    hf_config = _read_json(config_file)
    config = config_from_hf(hf_config).replace(dtype=dtype, param_dtype=param_dtype)
    tensors = _read_tensors(_weight_files(path))

    graphdef, params = abstract_model(config)
    target = _NP_DTYPES[config.param_dtype]
    pure: dict = {}
    specs = _specs(config, hf_model_type(hf_config))
    missing = [name for s in specs for name in s.hf_names if name not in tensors]
    if missing:
        raise ValueError(
            f"checkpoint {path} lacks {len(missing)} tensor(s) this config needs, e.g. "
            f"{missing[:5]}; check that config.json matches the weights"
        )
    for spec in specs:
        weights = [tensors.pop(name) for name in spec.hf_names]
        for name, weight in zip(spec.hf_names, weights):
            if tuple(weight.shape) != spec.hf_shape:
                raise ValueError(
                    f"tensor {name!r} has shape {tuple(weight.shape)}, expected "
                    f"{spec.hf_shape} from config.json; check that config and weights match"
                )
        weight = np.stack(weights) if spec.experts else weights[0]
        value = np.ascontiguousarray(spec.to_ours(weight).astype(target))
        _set_path(pure, spec.path, jnp.asarray(value))
    extra = sorted(n for n in tensors if not _ignorable(n, config))
    if extra:
        raise ValueError(
            f"checkpoint {path} has {len(extra)} tensor(s) that the model described by "
            f"its config.json does not use, e.g. {extra[:5]}; the weights probably "
            "belong to another architecture or config"
        )
    nnx.replace_by_pure_dict(params, stack_layers(pure))
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


def hf_tensors(
    config: TransformerConfig, params: nnx.State | dict, model_type: str | None = None
) -> dict[str, np.ndarray]:
    """Params as the tensors of a `model_type` Hugging Face checkpoint, by HF name (numpy,
    HF layout and dtype as stored): what `save_hf_checkpoint` writes and the GGUF export
    renames.

    Raises:
      ValueError: params that lack a tensor of the config or have another shape.
    """
    pure = params if isinstance(params, dict) else nnx.to_pure_dict(params)
    if "layers" in pure:  # the spec paths name layers one by one
        pure = unstack_layers(pure)
    tensors: dict[str, np.ndarray] = {}
    for spec in _specs(config, model_type):
        try:
            value = np.asarray(jax.device_get(_get_path(pure, spec.path)))
        except (KeyError, TypeError):
            raise ValueError(
                f"params lack {'/'.join(map(str, spec.path))} (for {spec.hf_name}); "
                "pass params created for this config"
            ) from None
        hf_value = np.ascontiguousarray(spec.to_hf(value))
        hf_shape = (spec.experts, *spec.hf_shape) if spec.experts else spec.hf_shape
        if hf_value.shape != hf_shape:
            raise ValueError(
                f"param {'/'.join(map(str, spec.path))} has shape {value.shape}, which "
                f"does not give {spec.hf_name} {hf_shape}; pass params of this config"
            )
        if spec.experts:
            tensors.update(zip(spec.hf_names, map(np.ascontiguousarray, hf_value)))
        else:
            tensors[spec.hf_name] = hf_value
    return tensors


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
      model_type: "qwen2" (q/k/v biases, no output bias; sliding windows on any layers),
        "llama" (attention_bias sets both), "qwen3" (q/k norms; attention_bias as Llama),
        "qwen3_moe" (Qwen3 with experts), "mistral" (no biases; one window on every layer
        or none), "mixtral" (Mistral with a mixture of experts, norm_topk_prob=True) or
        "gemma3_text" (`fitting_model_type` picks one for a config).
      shard_size: maximum bytes per file; when the weights exceed it they are written as
        model-0000i-of-0000N.safetensors shards plus model.safetensors.index.json.
      extra_config: additional config.json fields (e.g. bos_token_id, max_position_embeddings).
    """
    hf_config = config_to_hf(config, model_type)
    hf_config.update(extra_config or {})
    tensors = hf_tensors(config, params, model_type)
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
