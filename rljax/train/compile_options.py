"""XLA compile options for the update program: on XLA:CPU, matmuls fused with their operands.

By default XLA:CPU hands each matmul to its YNNPACK library alone and computes the elementwise
work around it (the SiLU backward, RMSNorm, the transposes a weight gradient needs) in separate
loop fusions, which in the backward pass write transposed copies of [tokens, d_ff] activations
on every layer. `xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT` lets a YNNPACK
fusion take a matmul together with the elementwise work feeding it. Measured on 2 cores with
the SmolLM2-135M recipe's update (32 rows x 120 positions, 4 micro-batches, alternating in one
process): 23.9 -> 20.6 s, update MFU 0.60 -> 0.65 (a scanned SwiGLU stack's forward + backward
alone: 3.50 -> 2.61 s). Only the update gets it: forward-only programs (scoring, decoding)
measured no gain.

The option is experimental in XLA, so it is checked once by compiling a tiny program; where the
installed jaxlib lacks it, or where the user sets the option in `XLA_FLAGS` themselves, the
update compiles with XLA's defaults.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

CPU_DOT_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}


@functools.cache
def _accepted(options: tuple[tuple[str, str], ...]) -> bool:
    """Whether this jaxlib's CPU compiler takes these options (a tiny program compiles)."""
    x = jnp.ones((2, 2), jnp.float32, device=jax.devices("cpu")[0])
    try:
        jax.jit(lambda a: a @ a, compiler_options=dict(options)).lower(x).compile()
    except jax.errors.JaxRuntimeError:
        return False
    return True


def update_compiler_options(platform: str) -> dict[str, str] | None:
    """The compile options for the update step on `platform` ("cpu", "gpu", "tpu"): the CPU
    dot fusions above on "cpu" when the compiler takes them and `XLA_FLAGS` does not set them,
    else None (XLA's defaults)."""
    if platform != "cpu":
        return None
    if any(key in os.environ.get("XLA_FLAGS", "") for key in CPU_DOT_FUSIONS):
        return None
    if not _accepted(tuple(CPU_DOT_FUSIONS.items())):
        return None
    return dict(CPU_DOT_FUSIONS)
