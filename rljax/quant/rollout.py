"""The sampler's copy of the weights: full precision, or fake-quantized for low-precision
rollouts while the trainer keeps float32/bfloat16 weights.

Quantized rollouts (MXFP4, MXFP8, FP8) make the sampler's policy differ from the trainer's;
`rljax.quant.mismatch` measures the gap every step and corrects for it, and
`rollout_error_metrics` logs how far the quantized kernels are from the trainer's, per kind
of kernel and split into the three MX error components.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rljax.quant.corrections import (
    add_norm_noise,
    aqn_sigma,
    check_aqn_schedule,
    kernel_batch,
    macro_block_quantize_mx,
    outlier_fallback_mx,
    path_names,
    quantize_params,
    transformer_batch_axes,
    transformer_reduction_axes,
)
from rljax.quant.decompose import mx_error_metrics
from rljax.quant.fp8 import quantize_fp8
from rljax.quant.mx import quantize_mx

WEIGHT_FORMATS = ("none", "mxfp4", "mxfp8", "fp8")
# Corrections of MX fake quantization (`rljax.quant.corrections`); "none" is plain MX.
WEIGHT_CORRECTIONS = ("none", "macro_block", "outlier_fallback")


def check_weight_format(weight_format: str) -> None:
    """Raises ValueError unless `weight_format` is one of `WEIGHT_FORMATS`."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(
            f"rollout weight_format={weight_format!r} is unknown; use one of {WEIGHT_FORMATS}"
        )


@dataclasses.dataclass(frozen=True)
class RolloutWeights:
    """How the sampler's weights are made from the trainer's (static: changes recompile).

    Attributes:
      format: one of `WEIGHT_FORMATS`; "none" samples with the trainer's weights.
      correction: one of `WEIGHT_CORRECTIONS`, MX formats only: "macro_block" adds a float32
        scale per `macro_block` entries (`macro_block_quantize_mx`), "outlier_fallback"
        keeps the `outlier_fraction` largest entries of each kernel in full precision
        (`outlier_fallback_mx`).
      macro_block: entries per macro-block scale, a multiple of 32.
      outlier_fraction: share of each kernel's entries kept in full precision, in [0, 1).
      aqn_sigma_start: QeRL's adaptive quantization noise: Gaussian noise of standard
        deviation `aqn_sigma(step, total_steps, aqn_sigma_start, aqn_sigma_end, aqn_stages)`
        added to the sampler's RMSNorm weights, fresh at every rollout (`add_norm_noise`);
        0 turns it off.
      aqn_sigma_end: the noise level of the last stage.
      aqn_stages: the number of stages of the decay (>= 2; the first has no noise).
      total_steps: the run's length in steps, which the AQN stages divide.
    """

    format: str = "none"
    correction: str = "none"
    macro_block: int = 128
    outlier_fraction: float = 0.01
    aqn_sigma_start: float = 0.0
    aqn_sigma_end: float = 1e-4
    aqn_stages: int = 10
    total_steps: int = 1

    def __post_init__(self):
        check_weight_format(self.format)
        if self.correction not in WEIGHT_CORRECTIONS:
            raise ValueError(
                f"rollout weight_correction={self.correction!r} is unknown; use one of "
                f"{WEIGHT_CORRECTIONS}"
            )
        if self.correction != "none" and not self.format.startswith("mx"):
            raise ValueError(
                f"rollout weight_correction={self.correction!r} corrects MX quantization; "
                f"it needs weight_format mxfp4 or mxfp8, not {self.format!r}"
            )
        if self.macro_block < 32 or self.macro_block % 32:
            raise ValueError(f"rollout macro_block={self.macro_block} must be a multiple of 32")
        if not 0.0 <= self.outlier_fraction < 1.0:
            raise ValueError(f"rollout outlier_fraction={self.outlier_fraction} must be in [0, 1)")
        if self.aqn_sigma_start < 0:
            raise ValueError(f"rollout aqn_sigma_start={self.aqn_sigma_start} must be >= 0")
        if self.aqn_sigma_start > 0:
            check_aqn_schedule(
                self.total_steps, self.aqn_sigma_start, self.aqn_sigma_end, self.aqn_stages
            )

    def quantizer(self):
        """The fake-quantizer of one kernel, `fn(w, axis=...)`, or None for "none"."""
        if self.format == "none":
            return None
        if self.format == "fp8":
            return functools.partial(quantize_fp8, granularity="tensor")
        if self.correction == "macro_block":
            return functools.partial(
                macro_block_quantize_mx, fmt=self.format, macro_block=self.macro_block
            )
        if self.correction == "outlier_fallback":
            return functools.partial(
                outlier_fallback_mx, fmt=self.format, fraction=self.outlier_fraction
            )
        return functools.partial(quantize_mx, fmt=self.format)

    def sigma(self, step) -> jax.Array:
        """The AQN noise level at `step` (0 when AQN is off)."""
        if self.aqn_sigma_start == 0:
            return jnp.float32(0)
        return aqn_sigma(
            step, self.total_steps, self.aqn_sigma_start, self.aqn_sigma_end, self.aqn_stages
        )


def rollout_weights(params, weights: RolloutWeights, step=0, rng: jax.Array | None = None):
    """The weights the sampler uses: `params`, or every kernel fake-quantized (+ AQN noise).

    "mxfp4" / "mxfp8": OCP MX blocks of 32 along each kernel's reduction axis
    (`quantize_params`), with the chosen correction; "fp8": E4M3 with one absmax scale per
    tensor. Norms, biases and the embedding stay in full precision, except that AQN adds noise
    to the norm weights. Jittable (`step` may be traced).

    Args:
      params: the policy's parameters (an `nnx.State` or pytree of arrays).
      weights: the format, correction and noise schedule.
      step: the training step (for the AQN schedule).
      rng: PRNG key for the AQN noise; required when `weights.aqn_sigma_start > 0`.

    Returns:
      A pytree with params' structure and dtypes; `params` itself when the format is "none"
      and AQN is off.
    """
    fn = weights.quantizer()
    out = params if fn is None else quantize_params(params, fn)
    if weights.aqn_sigma_start > 0:
        if rng is None:
            raise ValueError("rollout_weights with AQN noise needs an rng key")
        out = add_norm_noise(out, rng, weights.sigma(step))
    return out


def rollout_error_metrics(params, weights: RolloutWeights, prefix: str = "quant") -> dict:
    """How far the sampler's kernels are from the trainer's, per kind of kernel.

    Kernels are grouped by name (q_proj, k_proj, ..., down_proj: one group holds that
    kernel of every layer). Per group, with the quantizer of `weights` (correction
    included, AQN noise excluded):
      "{prefix}/{kind}/rel_error": ||Q(W) - W|| / ||W|| over the group;
    and for MX formats the exact decomposition of plain MX quantization (`decompose_mx`,
    before any correction), as norms relative to ||W||:
      "{prefix}/{kind}/scale_bias", "/deadzone", "/grid_noise" (the three components, which
      add up to the error but are not orthogonal: the scale bias and the grid noise partly
      cancel), "/mx_error" (their sum, the plain MX error; equal to rel_error without a
      correction) and "/deadzone_frac" (the share of entries in the deadzone, weighted by
      kernel size).
    The same keys without the kind ("{prefix}/rel_error", ...) cover all kernels together.
    Returns {} for format "none". Jittable.

    Args:
      params: the trainer's parameters (the weights the sampler quantized).
      weights: the sampler's format and correction.
      prefix: the metric-name prefix.
    """
    fn = weights.quantizer()
    if fn is None:
        return {}
    squares: dict[str, dict[str, jax.Array]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = path_names(path)
        r = transformer_reduction_axes(names, leaf)
        if r is None:
            continue
        w = kernel_batch(leaf, transformer_batch_axes(names, leaf), r).astype(jnp.float32)
        parts = {
            "weight": jnp.sum(jnp.square(w)),
            "rel_error": jnp.sum(jnp.square(jax.lax.map(lambda k: fn(k, axis=0), w) - w)),
        }
        if weights.format.startswith("mx"):
            m = jax.lax.map(lambda k: mx_error_metrics(k, fmt=weights.format, axis=0), w)
            for key in ("scale_bias", "deadzone", "grid_noise", "error"):
                parts["mx_error" if key == "error" else key] = jnp.sum(jnp.square(m[f"{key}_norm"]))
            parts["deadzone_frac"] = jnp.sum(m["deadzone_frac"]) * w[0].size
            parts["size"] = jnp.float32(w.size)
        for kind in (names[-1], None):
            group = squares.setdefault(kind, {})
            for key, value in parts.items():
                group[key] = group.get(key, 0.0) + value
    metrics = {}
    for kind, group in squares.items():
        name = prefix if kind is None else f"{prefix}/{kind}"
        norm = jnp.sqrt(group.pop("weight"))
        safe = jnp.where(norm > 0, norm, 1.0)
        size = group.pop("size", None)
        for key, value in group.items():
            if key == "deadzone_frac":
                metrics[f"{name}/{key}"] = value / size
            else:
                metrics[f"{name}/{key}"] = jnp.sqrt(value) / safe
    return metrics
