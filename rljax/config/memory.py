"""Does a run fit? The context length and a lower bound of the memory its rollouts need.

A `max_new_tokens` far beyond what fits used to surface as an XLA allocation traceback (71.8 TB
asked for) after the model was built and the sampler compiled. Validation refuses it first, from
the model's sizes alone: the sampler's preallocated KV cache and the trainer's chunked logits are
a lower bound of what a step needs, so a refusal is never wrong; a run that passes can still run
out of memory on what the bound leaves out (weights, optimizer state, activations).
"""

from __future__ import annotations

import math
import os

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax.models.config import TransformerConfig

_LENGTH_KEYS = "task.max_prompt_len + rollout.max_new_tokens"
_SIZE_KEYS = (
    "lower rollout.max_new_tokens, task.max_prompt_len, train.prompts_per_step or rollout.n_samples"
)


def _size(n: float) -> str:
    """Bytes as a short decimal size: 712 B, 3.4 GB, 71.8 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def rollout_bytes(config: ConfigDict, model: TransformerConfig) -> tuple[int, int]:
    """(KV-cache bytes, trainer logits-chunk bytes) of one step, summed over all devices.

    The sampler preallocates keys and values for every layer, row (`train.prompts_per_step *
    rollout.n_samples`) and position (`task.max_prompt_len + rollout.max_new_tokens`); the
    trainer's log-softmax holds [micro-batch rows, completion tokens, vocabulary chunk] float32.
    """
    rows = config.train.prompts_per_step * config.rollout.n_samples
    length = config.task.max_prompt_len + config.rollout.max_new_tokens
    itemsize = np.dtype(model.compute_dtype).itemsize
    kv = 2 * model.n_layers * rows * length * model.n_kv_heads * model.resolved_head_dim * itemsize
    micro = math.ceil(rows / (config.train.minibatches * config.train.microbatches))
    chunk = min(model.vocab_size, config.train.vocab_chunk)
    return kv, micro * config.rollout.max_new_tokens * chunk * 4


def available_bytes() -> tuple[int, str]:
    """(bytes, "who has them") of the memory the run's arrays can use: the accelerators' limits
    (jax's memory_stats of this process's first device: another process's devices have
    none), or the host's physical memory for CPU devices, which share it."""
    devices = jax.devices()
    limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
    if limit:
        return int(limit) * len(devices), f"the {len(devices)} {devices[0].platform} device(s) have"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "the host has"


def check_fits(
    config: ConfigDict, model: TransformerConfig | None, context: tuple[str, int | None]
) -> None:
    """One-line ValueError when prompt + completion exceed the model's context length
    (`context`: its name and value in tokens, None: unknown) or a step's KV cache and logits
    exceed the memory (`model` None: its sizes are unknown before loading)."""
    name, length = context
    need = config.task.max_prompt_len + config.rollout.max_new_tokens
    if length is not None and need > length:
        raise ValueError(
            f"{_LENGTH_KEYS} = {config.task.max_prompt_len} + {config.rollout.max_new_tokens} = "
            f"{need} tokens exceed {name}={length}; lower one of them"
        )
    if model is None or config.model.kind != "causal":  # the diffusion sampler has no KV cache
        return
    kv, logits = rollout_bytes(config, model)
    have, where = available_bytes()
    if kv + logits > have:
        rows = config.train.prompts_per_step * config.rollout.n_samples
        raise ValueError(
            f"a step needs at least {_size(kv + logits)} (KV cache of {rows} rows x {need} tokens:"
            f" {_size(kv)}; logits: {_size(logits)}) but {where} {_size(have)}; {_SIZE_KEYS}"
        )
