"""GGUF files (llama.cpp's format) -> rljax config and params (tokenizer: gguf_tokenizer.py),
and trained params back into a GGUF laid out like the one they came from (`save_gguf`).

A GGUF file holds the whole model: metadata (shape, RoPE, the tokenizer's vocabulary, merges and
chat template) and the weights, often block-quantized (Q4_1, Q8_0, ...). We dequantize every
tensor on the host with the `gguf` package and reuse `rljax.models.hf`'s layout conversions by
first renaming the tensors to their Hugging Face names.

Two things differ from a Hugging Face checkpoint:
- GGUF lists dims fastest-first, but `GGUFReader` already gives numpy arrays in row-major
  [out, in] order, the same as HF's `nn.Linear` weights (for quantized types the last axis is
  bytes, which `gguf.quants.dequantize` expands to values).
- llama.cpp's converter permutes the rows of a *llama* model's q/k projections from HF's
  rotate-half RoPE layout to its interleaved one; rows (h, s, j) -- head h, half s, index j --
  are stored at (h, j, s). We undo it, since our RoPE uses rotate-half. Qwen2 files are written
  unpermuted, as are Qwen3 files (whose per-head q/k norms are attn_q_norm / attn_k_norm).
- Gemma 3 files store every norm weight as 1 + w (llama.cpp's converter, `norm_shift`), where
  HF and our (unit-offset) RMSNorm hold w: we subtract 1. Their metadata has no local RoPE base,
  no local/global pattern and no query scalar; llama.cpp fixes them (base 10000, every 6th layer
  global, scores scaled by head_dim**-0.5 except the 27B's (d_model / heads)**-0.5), as do we.
"""

from __future__ import annotations

import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.hf import _GEMMA3_FIELDS, _NP_DTYPES, _set_path, _specs, hf_tensors
from rljax.models.transformer import abstract_model, stack_layers

_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
_PERMUTED_QK = ("llama",)  # architectures whose q/k rows llama.cpp interleaves

# GGUF tensor name (per block: "blk.{i}." + name) -> HF name (per layer: "model.layers.{i}.").
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# Gemma 3's sandwich norms (ffn_norm is the pre-feedforward norm there).
_GEMMA3_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# llama.cpp's fixed Gemma 3 hyperparameters (llama-model.cpp, LLM_ARCH_GEMMA3).
_GEMMA3_GLOBAL_EVERY = 6
_GEMMA3_LOCAL_THETA = 10000.0
_GEMMA3_27B_LAYERS = 62

# ----------------------------------------------------------------------------------------------
# Reading


def _reader(path: str):
    """A `gguf.GGUFReader` of `path`, with clear errors for a missing or non-GGUF file."""
    import gguf  # imported here so the rest of rljax does not need the package

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"GGUF file {path!r} does not exist; pass the path of a .gguf file "
            "(for SmolLM2, rljax.models.fetch_smollm2() downloads and caches one)"
        )
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, OverflowError) as e:  # bad magic, cut off, flipped bytes
        raise ValueError(
            f"{path} is damaged (truncated?) or not a GGUF file: {e}; re-download it"
        ) from None


_MISSING = object()


def _field(reader, key: str, default: Any = _MISSING) -> Any:
    """A metadata value as a Python scalar, string or list; required unless `default` is given."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(
                f"GGUF metadata lacks {key!r}; the file was written by an incompatible converter"
            )
        return default
    return field.contents()


def _tensor_infos(reader) -> dict[str, Any]:
    return {t.name: t for t in reader.tensors}


def _dequantize(tensor) -> np.ndarray:
    """One tensor as float32 in numpy (row-major, HF) order."""
    import gguf

    kind = gguf.GGMLQuantizationType(tensor.tensor_type)
    integer = {gguf.GGMLQuantizationType[n] for n in ("I8", "I16", "I32", "I64")}
    if kind in integer:
        raise ValueError(
            f"tensor {tensor.name!r} has integer type {kind.name}; model weights must be float "
            "or block-quantized (F32, F16, BF16, Q8_0, Q4_0, Q4_1, K-quants, ...)"
        )
    if kind == gguf.GGMLQuantizationType.F64:
        return np.asarray(tensor.data, np.float32)
    try:
        values = gguf.quants.dequantize(np.asarray(tensor.data), kind)
    except NotImplementedError:
        raise ValueError(
            f"tensor {tensor.name!r} has type {kind.name}, which the gguf package cannot "
            "dequantize; re-quantize the model with llama.cpp's llama-quantize to a "
            "supported type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, K-quants) or "
            "upgrade the gguf package"
        ) from None
    return np.asarray(values, np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))


def _unpermute_qk(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: rows (head, j, half) back to (head, half, j)."""
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"q/k projection with {rows} rows cannot split into {heads} heads")
    w = weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def _config_from_reader(reader, path: str, dtype: str, param_dtype: str) -> TransformerConfig:
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(
            f"{path}: general.architecture={arch!r} is not supported; rljax loads GGUF "
            f"architectures {list(_ARCHITECTURES)} (Llama/Qwen2/Qwen3/Gemma 3 decoders)"
        )
    tensors = _tensor_infos(reader)
    if "rope_freqs.weight" in tensors:
        raise ValueError(
            f"{path} has a rope_freqs.weight tensor (llama3-style per-frequency RoPE factors), "
            "which rljax cannot map to a rope_scaling config; load the HF checkpoint instead"
        )
    if _field(reader, f"{arch}.expert_count", 0):
        raise ValueError(
            f"{path} is a mixture-of-experts GGUF, which rljax does not load; "
            "load the Hugging Face checkpoint instead"
        )

    def count(key: str, default: Any = _MISSING) -> int:
        value = _field(reader, f"{arch}.{key}", default)
        if isinstance(value, list):  # per-layer values (hybrid models)
            if len(set(value)) != 1:
                raise ValueError(f"{path}: per-layer {arch}.{key}={value} is not supported")
            value = value[0]
        return int(value)

    n_heads = count("attention.head_count")
    d_model = count("embedding_length")
    head_dim = count("attention.key_length", d_model // n_heads)
    if count("attention.value_length", head_dim) != head_dim:
        raise ValueError(f"{path}: key and value head widths differ; rljax needs them equal")
    rotary = count("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"{path}: {arch}.rope.dimension_count={rotary} < head_dim={head_dim} (partial "
            "rotary embedding) is not supported: rljax rotates the full head"
        )
    scaling = None
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "linear":
        factor = float(_field(reader, f"{arch}.rope.scaling.factor"))
        scaling = {"rope_type": "linear", "factor": factor}
    elif kind != "none":
        raise ValueError(
            f"{path}: {arch}.rope.scaling.type={kind!r} is not supported; supported: none, linear"
        )
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise ValueError(f"{path} has no token_embd.weight tensor; it is not a complete model")
    vocab = int(embed.shape[1])  # GGUF shape is [d_model, vocab] (fastest dim first)
    declared = _field(reader, f"{arch}.vocab_size", None)
    if declared is not None and int(declared) != vocab:
        raise ValueError(
            f"{path}: {arch}.vocab_size={declared} but token_embd.weight has {vocab} rows"
        )
    gemma = {}
    if arch == "gemma3":
        gemma = _gemma3_fields(reader, count("block_count"), d_model, n_heads, head_dim)
    return TransformerConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_layers=count("block_count"),
        n_heads=n_heads,
        n_kv_heads=count("attention.head_count_kv", n_heads),
        d_ff=count("feed_forward_length"),
        head_dim=None if head_dim * n_heads == d_model else head_dim,
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        qkv_bias="blk.0.attn_q.bias" in tensors,
        o_bias="blk.0.attn_output.bias" in tensors,
        qk_norm=arch in ("qwen3", "gemma3"),
        tie_embeddings="output.weight" not in tensors,
        dtype=dtype,
        param_dtype=param_dtype,
        **gemma,
    )


def _gemma3_fields(reader, n_layers: int, d_model: int, heads: int, head_dim: int) -> dict:
    """The Gemma 3 TransformerConfig fields of a gemma3 GGUF (metadata + llama.cpp's fixed
    hyperparameters)."""
    scalar = d_model // heads if n_layers == _GEMMA3_27B_LAYERS else head_dim
    cap = _field(reader, "gemma3.final_logit_softcapping", None)
    types = [
        "full_attention" if (i + 1) % _GEMMA3_GLOBAL_EVERY == 0 else "sliding_attention"
        for i in range(n_layers)
    ]
    return dict(
        {k: v for k, v in _GEMMA3_FIELDS.items() if k != "qk_norm"},
        query_pre_attn_scalar=None if scalar == head_dim else scalar,
        rope_local_theta=_GEMMA3_LOCAL_THETA,
        final_logit_softcap=None if cap is None else float(cap),
        sliding_window=int(_field(reader, "gemma3.attention.sliding_window")),
        layer_types=tuple(types) if "full_attention" in types else None,
    )


def _hf_name(name: str, n_layers: int, arch: str) -> str | None:
    """The HF name of a GGUF tensor, or None if rljax has no such tensor."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layers:
        hf = (_GEMMA3_BLOCK_NAMES if arch == "gemma3" else _BLOCK_NAMES).get(parts[2])
        return None if hf is None else f"model.layers.{parts[1]}.{hf}"
    return None


def gguf_config(path: str, dtype: str = "float32", param_dtype: str = "float32"):
    """The TransformerConfig a GGUF file describes, read from its metadata (no weights loaded)."""
    path = os.fspath(path)
    return _config_from_reader(_reader(path), path, dtype, param_dtype)


def gguf_limits(
    path: str, dtype: str = "float32", param_dtype: str = "float32"
) -> tuple[TransformerConfig, int | None]:
    """The TransformerConfig of a GGUF file and its context length in tokens (None: not
    recorded), from the metadata alone: what validation needs to size a run."""
    path = os.fspath(path)
    reader = _reader(path)
    config = _config_from_reader(reader, path, dtype, param_dtype)
    length = _field(reader, f"{_field(reader, 'general.architecture')}.context_length", None)
    return config, None if length is None else int(length)


def load_gguf(
    path: str,
    dtype: str = "float32",
    param_dtype: str = "float32",
) -> tuple[TransformerConfig, nnx.GraphDef, nnx.State]:
    """Load a Llama/Qwen2/Qwen3/Gemma 3 GGUF file as (config, graphdef, params).

    Every tensor is dequantized to float32 on the host and then cast to `param_dtype`, so the
    params are a plain (unquantized) rljax model, ready for training.

    Args:
      path: the .gguf file.
      dtype: compute dtype of the returned config ("float32", "bfloat16", "float16").
      param_dtype: storage dtype of the params.

    Returns:
      The config (from the file's metadata), and (graphdef, params) as `create_model` returns.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: an unsupported architecture or feature, a tensor type that cannot be
        dequantized, or tensors missing, extra or of the wrong shape.
    """
    path = os.fspath(path)
    reader = _reader(path)
    config = _config_from_reader(reader, path, dtype, param_dtype)
    arch = _field(reader, "general.architecture")
    by_hf: dict[str, Any] = {}
    extra = []
    for tensor in reader.tensors:
        hf = _hf_name(tensor.name, config.n_layers, arch)
        if hf is None:
            extra.append(tensor.name)
        else:
            by_hf[hf] = tensor
    if extra:
        raise ValueError(
            f"{path} has {len(extra)} tensor(s) rljax's {arch} model does not use, e.g. "
            f"{extra[:5]}; the file holds another architecture or extra modules"
        )
    specs = _specs(config)
    missing = [s.hf_name for s in specs if s.hf_name not in by_hf]
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} tensor(s), e.g. {missing[:5]}")

    graphdef, params = abstract_model(config)
    target = _NP_DTYPES[config.param_dtype]
    heads = {"q_proj": config.n_heads, "k_proj": config.n_kv_heads}
    pure: dict = {}
    for spec in specs:
        tensor = by_hf[spec.hf_name]
        weight = _dequantize(tensor)
        if weight.shape != spec.hf_shape:
            raise ValueError(
                f"tensor {tensor.name!r} has shape {weight.shape} (as [out, in]), expected "
                f"{spec.hf_shape} from the file's metadata"
            )
        proj = spec.hf_name.split(".")[-2]
        if arch in _PERMUTED_QK and proj in heads:
            weight = _unpermute_qk(weight, heads[proj])
        if arch == "gemma3" and spec.hf_name.endswith("norm.weight"):
            weight = weight - 1.0  # stored as 1 + w
        value = np.ascontiguousarray(spec.to_ours(weight).astype(target))
        _set_path(pure, spec.path, jnp.asarray(value))
    nnx.replace_by_pure_dict(params, stack_layers(pure))
    return config, graphdef, params


# ----------------------------------------------------------------------------------------------
# Writing

# What `save_gguf` may store the matrices as (norms and other vectors stay F32, as llama.cpp
# keeps them), with the general.file_type each gives the file.
GGUF_TYPES = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
}
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}


def _permute_qk(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (the inverse of `_unpermute_qk`)."""
    w = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def save_gguf(
    path: str,
    source: str,
    config: TransformerConfig,
    params: nnx.State | dict,
    tensor_type: str = "f32",
) -> None:
    """Write params as a GGUF file laid out like `source`, the GGUF they were loaded from.

    The metadata (architecture, shape, RoPE, tokenizer, chat template) is copied from
    `source`, except general.file_type, which `tensor_type` sets; every tensor of `source` is
    written from `params`, with llama.cpp's conventions put back (`load_gguf` takes them off):
    a Llama's permuted q/k rows and Gemma 3's norms stored as 1 + w.

    Args:
      path: the .gguf file to write (its directory must exist).
      source: the GGUF file `params` were loaded from (`load_gguf`).
      config: the model's config (as `load_gguf` returned it).
      params: an `nnx.State` (or its pure dict) of that config, e.g. after training.
      tensor_type: the matrices' type, a key of GGUF_TYPES: "f32", "f16" or "q8_0" (llama.cpp's
        8-bit blocks of 32; matrices whose rows do not split into blocks stay F16).

    Raises:
      FileNotFoundError / ValueError: as `load_gguf` for `source`; an unknown `tensor_type`;
        params of another shape than the source's tensors.
    """
    import gguf

    if tensor_type not in GGUF_TYPES:
        raise ValueError(f"tensor_type={tensor_type!r}; use one of {sorted(GGUF_TYPES)}")
    source = os.fspath(source)
    reader = _reader(source)
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"{source}: general.architecture={arch!r} is not supported")
    tensors = hf_tensors(config, params, _HF_MODEL_TYPES[arch])
    qtype_name, file_type = GGUF_TYPES[tensor_type]
    qtype = gguf.GGMLQuantizationType[qtype_name]
    heads = {"q_proj": config.n_heads, "k_proj": config.n_kv_heads}

    writer = gguf.GGUFWriter(path, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the header's counts, and what the writer or tensor_type sets
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    writer.add_file_type(gguf.LlamaFileType[file_type])
    for tensor in reader.tensors:
        hf = _hf_name(tensor.name, config.n_layers, arch)
        if hf not in tensors:
            raise ValueError(f"{source}: tensor {tensor.name!r} has no counterpart in the params")
        weight = np.asarray(tensors[hf], np.float32)
        expected = tuple(int(d) for d in reversed(tensor.shape))
        if weight.shape != expected:
            raise ValueError(
                f"{hf} has shape {weight.shape}, but {source} stores {tensor.name} as {expected}"
            )
        proj = hf.split(".")[-2]
        if arch in _PERMUTED_QK and proj in heads:
            weight = _permute_qk(weight, heads[proj])
        if arch == "gemma3" and hf.endswith("norm.weight"):
            weight = weight + 1.0
        kind = qtype if weight.ndim > 1 else gguf.GGMLQuantizationType.F32
        if kind == gguf.GGMLQuantizationType.Q8_0 and weight.shape[-1] % 32:
            kind = gguf.GGMLQuantizationType.F16
        data = gguf.quants.quantize(np.ascontiguousarray(weight), kind)
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
