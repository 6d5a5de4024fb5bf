"""LoRA: low-rank adapters on chosen projections, merged into the frozen base by a pure function.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models": a kernel W [in, out]
is trained as W + scale * A @ B with A [in, r], B [r, out] and scale = alpha / r; B starts at
zero, so the adapted policy starts equal to the base. Only A and B are trained: the train
state keeps them as its `params` (so the optimizer holds their moments only) and the frozen
base once, in `TrainState.base` (`rljax.core.state.FrozenBase`), which is also the KL
reference policy (the base without adapters).

Our kernels are einsum weights: q/k/v_proj [d, heads, head_dim] (one input axis, two output
axes), o_proj [heads, head_dim, d] (two input axes), gate/up/down_proj [in, out]. Axes before
those are batch axes with their own adapters (MoE experts [E, in, out], stacked layers).

Why our own transform and not `qwix` (Tunix's and MaxText's LoRA): qwix adds the adapters as
new variables inside the nnx module and injects them by intercepting the model's dot_general
calls at trace time, so the graphdef, the state layout and every forward would change; here
the model, its graphdef and the sampler stay as they are, and LoRA is one pure function
(`merge`) over the one train-state pytree.

Also here: the unmerged form for the sampler (`unmerged`, config `lora.sampler`), QLoRA's int8
base (`quantize_base`, config `lora.base_quant`) and the PEFT adapter export
(`save_peft_adapter`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx

from rljax.core.state import FrozenBase, TrainState
from rljax.models.config import TransformerConfig
from rljax.models.hf import tensor_names
from rljax.models.int8 import dequantized, is_int8, quantize
from rljax.models.low_rank import LoraKernel
from rljax.models.transformer import unstack_layers
from rljax.parallel.distributed import fetch

# Target name (config `lora.targets`) -> (kernel name, input axes, output axes).
TARGETS: dict[str, tuple[str, int, int]] = {
    "q": ("q_proj", 1, 2),
    "k": ("k_proj", 1, 2),
    "v": ("v_proj", 1, 2),
    "o": ("o_proj", 2, 1),
    "gate": ("gate_proj", 1, 1),
    "up": ("up_proj", 1, 1),
    "down": ("down_proj", 1, 1),
}
_FINGERPRINT_VALUES = 8  # leading values of each base tensor that the fingerprint reads

Adapters = dict[str, Any]  # nested dicts mirroring the base's paths, leaves {"a": .., "b": ..}


def _names(path: tuple[Any, ...]) -> tuple[str, ...]:
    """A pytree path as plain names (nnx's `.value` wrapper dropped)."""
    names = (str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    return tuple(n for n in names if n != "value")


def _kernels(base: nnx.State, targets: Sequence[str]) -> list[tuple[tuple[str, ...], Any, str]]:
    """(path names, kernel, target) of every kernel of `base` that a target names (an int8
    kernel's codes stand for it)."""
    by_kernel = {TARGETS[t][0]: t for t in targets}
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(base, is_leaf=is_int8)[0]:
        names = _names(path)
        if names and names[-1] in by_kernel:
            found.append((names, leaf.q if is_int8(leaf) else leaf, by_kernel[names[-1]]))
    return found


def _split(shape: tuple[int, ...], target: str) -> tuple[tuple[int, ...], int, int]:
    """(batch axes, fan-in, fan-out) of a kernel of `shape` for `target`."""
    _, n_in, n_out = TARGETS[target]
    lead = len(shape) - n_in - n_out
    return shape[:lead], math.prod(shape[lead : lead + n_in]), math.prod(shape[lead + n_in :])


def init_adapters(base: nnx.State, rank: int, targets: Sequence[str], rng: jax.Array) -> Adapters:
    """Fresh adapters for the kernels of `base` that `targets` name.

    A [..., in, r] ~ N(0, 1 / in) (seeded per kernel from `rng`), B [..., r, out] = 0, both
    float32: the merged policy equals the base bit for bit.

    Raises:
      ValueError: an unknown target, or none of the targets names a kernel of `base`.
    """
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"lora.targets has unknown {unknown}; choose from {sorted(TARGETS)}")
    kernels = _kernels(base, targets)
    if not kernels:
        raise ValueError(f"lora.targets={tuple(targets)} names no kernel of this model")
    adapters: Adapters = {}
    for i, (names, kernel, target) in enumerate(kernels):
        lead, fan_in, fan_out = _split(kernel.shape, target)
        a = jax.random.normal(jax.random.fold_in(rng, i), (*lead, fan_in, rank), jnp.float32)
        node = adapters
        for name in names[:-1]:
            node = node.setdefault(name, {})
        node[names[-1]] = {
            "a": a / math.sqrt(fan_in),
            "b": jnp.zeros((*lead, rank, fan_out), jnp.float32),
        }
    return adapters


def _flat(adapters: Adapters) -> dict[tuple[str, ...], dict[str, jax.Array]]:
    """{path names: {"a", "b"}} of a nested adapters tree."""
    out: dict[tuple[str, ...], dict[str, jax.Array]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(adapters)[0]:
        names = _names(path)
        out.setdefault(names[:-1], {})[names[-1]] = leaf
    return out


def delta(adapter: dict[str, jax.Array], shape: tuple[int, ...]) -> jax.Array:
    """A @ B (float32) in the layout of a kernel of `shape` (before the scale)."""
    product = jnp.einsum("...ir,...ro->...io", adapter["a"], adapter["b"])
    return product.reshape(shape)


def merge(base: nnx.State, adapters: Adapters, scale: jax.Array | float) -> nnx.State:
    """The adapted policy: each targeted kernel W -> W + scale * A @ B (in float32, stored in
    W's dtype); every other parameter is the base's own array. Pure and differentiable in
    `adapters`, so under `jax.grad` only A and B get gradients. An int8 base
    (`quantize_base`) is dequantized first."""
    base, flat = dequantized(base), _flat(adapters)

    def one(path, kernel):
        adapter = flat.get(_names(path))
        if adapter is None:
            return kernel
        update = scale * delta(adapter, kernel.shape)
        return (kernel.astype(jnp.float32) + update).astype(kernel.dtype)

    return jax.tree_util.tree_map_with_path(one, base)


def unmerged(base: nnx.State, adapters: Adapters, scale: jax.Array | float) -> nnx.State:
    """The adapted policy without merged weights: each targeted dense kernel becomes a
    `LoraKernel` (W, A, B, scale) that the model's projections apply as x W + scale (x A) B
    (`rljax.models.low_rank.dense`); MoE expert kernels (an expert axis before their in/out
    axes) are merged as in `merge`. Same function as `merge` up to rounding."""
    base, flat = dequantized(base), _flat(adapters)
    scale = jnp.asarray(scale, jnp.float32)

    def one(path, kernel):
        names = _names(path)
        adapter = flat.get(names)
        if adapter is None:
            return kernel
        target = next(t for t, spec in TARGETS.items() if spec[0] == names[-1])
        _, n_in, n_out = TARGETS[target]
        layers = kernel.shape[: int(names[0] == "layers")]  # the stacked blocks' axis
        if kernel.ndim > len(layers) + n_in + n_out:  # experts
            return (kernel.astype(jnp.float32) + scale * delta(adapter, kernel.shape)).astype(
                kernel.dtype
            )
        # scale per layer, so that the layer scan slices every leaf of the kernel alike
        per_layer = jnp.broadcast_to(scale, layers)
        return LoraKernel(w=kernel, a=adapter["a"], b=adapter["b"], scale=per_layer, n_in=n_in)

    return jax.tree_util.tree_map_with_path(one, base)


def full_params(base: FrozenBase | None, params: Any) -> nnx.State:
    """The policy's parameters from a train state's (`base`, `params`): `params` themselves
    without LoRA, the base merged with the adapters `params` with it."""
    if base is None:
        return params
    return merge(base.params, params, base.scale)


def merged_params(state: TrainState) -> nnx.State:
    """The policy's full parameters of a train state (adapters merged in under LoRA): what the
    sampler, evaluation and the Hugging Face export (`save_hf_checkpoint`) take."""
    return full_params(state.base, state.params)


def sampler_params(state: TrainState, unmerged_adapters: bool) -> nnx.State:
    """The sampler's parameters: `merged_params`, or under LoRA with `unmerged_adapters` the
    base with `LoraKernel`s (`unmerged`; config `lora.sampler`)."""
    if state.base is None or not unmerged_adapters:
        return merged_params(state)
    return unmerged(state.base.params, state.params, state.base.scale)


def reference_params(state: TrainState, needs_reference: bool) -> nnx.State | None:
    """The KL reference policy: under LoRA the frozen base itself (no second copy of the
    weights; dequantized if stored in int8) when the algorithm reads a reference, else
    `state.ref_params`."""
    if state.base is None:
        return state.ref_params
    return dequantized(state.base.params) if needs_reference else None


def fingerprint(base: nnx.State) -> jax.Array:
    """[8] int32 digest of the base's paths, shapes, dtypes and each tensor's first values: a
    checkpoint of adapters refuses to resume on another base."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(base)[0]:
        head = fetch(jnp.ravel(leaf)[:_FINGERPRINT_VALUES])
        digest.update(repr((_names(path), leaf.shape, str(leaf.dtype))).encode())
        digest.update(np.ascontiguousarray(head).tobytes())
    return jnp.asarray(np.frombuffer(digest.digest(), np.int32))


def quantize_base(base: nnx.State) -> nnx.State:
    """QLoRA's frozen base: every projection kernel (q/k/v/o, gate/up/down, experts too) as an
    `Int8Kernel` with per-output-channel scales (`rljax.models.int8`); embeddings, norms, biases
    and routers stay as they are. `merge`, `unmerged` and `reference_params` dequantize it."""
    kinds = {kernel: (n_in, n_out) for kernel, n_in, n_out in TARGETS.values()}

    def one(path, leaf):
        names = _names(path)
        if not names or names[-1] not in kinds:
            return leaf
        n_in, n_out = kinds[names[-1]]
        lead = leaf.ndim - n_in - n_out
        return quantize(leaf, tuple(range(lead, lead + n_in)))

    return jax.tree_util.tree_map_with_path(one, base)


def frozen_base(base: nnx.State, rank: int, alpha: float, quant: str = "none") -> FrozenBase:
    """The train state's frozen base for adapters of `rank` scaled by alpha / rank, stored as
    it is (quant "none") or with its kernels in int8 (`quantize_base`)."""
    if quant not in ("none", "int8"):
        raise ValueError(f"lora.base_quant={quant!r}; use 'none' or 'int8'")
    if quant == "int8":
        base = quantize_base(base)
    return FrozenBase(params=base, scale=jnp.float32(alpha / rank), fingerprint=fingerprint(base))


def count(tree: Any) -> int:
    """Number of parameters in a pytree (trainable parameters of adapters or a full policy; an
    int8 kernel counts its codes, not its scales)."""
    leaves = jax.tree.leaves(tree, is_leaf=is_int8)
    return sum(math.prod(x.q.shape if is_int8(x) else x.shape) for x in leaves)


PEFT_PREFIX = "base_model.model."  # PEFT's wrappers (PeftModel, LoraModel) around the HF model


def save_peft_adapter(
    path: str,
    config: TransformerConfig,
    adapters: Adapters,
    scale: float | jax.Array,
    model_type: str = "qwen2",
    base_model_name_or_path: str | None = None,
) -> None:
    """Write adapters as a PEFT LoRA directory (`peft.PeftModel.from_pretrained` loads it onto
    the base saved by `save_hf_checkpoint` with the same `model_type`); for one merged
    checkpoint instead, `save_hf_checkpoint(path, config, merged_params(state))`.

    adapter_model.safetensors holds, per adapted HF linear `{name}.weight` [out, in],
    `base_model.model.{name}.lora_A.weight` = A^T [r, in] and `lora_B.weight` = B^T [out, r]
    (float32): our kernels flatten to [in, out] in HF's index order, so
    W_hf + (lora_alpha / r) B^T A^T is the transpose of the merged kernel. adapter_config.json
    has r, lora_alpha = scale * r, target_modules (HF names) and base_model_name_or_path.

    Raises:
      ValueError: adapters on MoE experts (PEFT adapts per-module linears, not stacked
        experts), or on a kernel the model type's checkpoint has no tensor for.
    """
    names = tensor_names(config, model_type)
    tensors: dict[str, np.ndarray] = {}
    modules, ranks = set(), set()
    per_layer = unstack_layers(adapters) if "layers" in adapters else adapters
    for path_names, adapter in _flat(per_layer).items():
        hf = names.get(path_names)
        if hf is None or len(hf) != 1 or adapter["a"].ndim != 2:
            raise ValueError(
                f"adapter on {'/'.join(path_names)} has no single {model_type} linear to "
                "export to PEFT (MoE expert adapters are not supported); export merged "
                "weights with save_hf_checkpoint(path, config, merged_params(state))"
            )
        module = hf[0].removesuffix(".weight")
        a, b = np.asarray(fetch(adapter["a"]), np.float32), np.asarray(fetch(adapter["b"]))
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(
            b.astype(np.float32).T
        )
        modules.add(module.rsplit(".", 1)[-1])
        ranks.add(a.shape[-1])
    (rank,) = ranks
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": float(scale) * rank,
        "target_modules": sorted(modules),
        "base_model_name_or_path": base_model_name_or_path,
        "bias": "none",
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w", encoding="utf-8") as fh:
        json.dump(adapter_config, fh, indent=2, sort_keys=True)
    safetensors.numpy.save_file(
        tensors, os.path.join(path, "adapter_model.safetensors"), metadata={"format": "pt"}
    )
