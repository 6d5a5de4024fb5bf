"""The sampler's copy of the weights: full precision, or fake-quantized for low-precision
rollouts while the trainer keeps float32/bfloat16 weights.

Quantized rollouts (MXFP4, MXFP8, FP8) make the sampler's policy differ from the trainer's;
`rljax.quant.mismatch` measures the gap every step and corrects for it.
"""

import functools

from rljax.quant.corrections import quantize_params
from rljax.quant.fp8 import quantize_fp8
from rljax.quant.mx import quantize_mx

WEIGHT_FORMATS = ("none", "mxfp4", "mxfp8", "fp8")


def check_weight_format(weight_format: str) -> None:
    """Raises ValueError unless `weight_format` is one of `WEIGHT_FORMATS`."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(
            f"rollout weight_format={weight_format!r} is unknown; use one of {WEIGHT_FORMATS}"
        )


def rollout_weights(params, weight_format: str = "none"):
    """The weights the sampler uses: `params`, or every kernel fake-quantized.

    "mxfp4" / "mxfp8": OCP MX blocks of 32 along each kernel's reduction axis
    (`quantize_params` with `quantize_mx`); "fp8": E4M3 with one absmax scale per tensor.
    Norms, biases and the embedding stay in full precision. Jittable.

    Args:
      params: the policy's parameters (an `nnx.State` or pytree of arrays).
      weight_format: one of `WEIGHT_FORMATS`; "none" returns `params` itself.

    Returns:
      A pytree with params' structure and dtypes.

    Raises:
      ValueError: for an unknown format.
    """
    check_weight_format(weight_format)
    if weight_format == "none":
        return params
    if weight_format == "fp8":
        fn = functools.partial(quantize_fp8, granularity="tensor")
    else:
        fn = functools.partial(quantize_mx, fmt=weight_format)
    return quantize_params(params, fn)
