"""Low-precision formats as fake quantisation: OCP MX block formats (MXFP4, MXFP8) and an
exact decomposition of the MX quantisation error into scale bias, deadzone and grid noise; FP8
absmax quantisation; MX corrections (macro-block scales, outlier fallback), applying a quantiser
to a params pytree, and QeRL's adaptive quantisation noise; rollout/trainer mismatch
diagnostics and corrections (truncated, masked and adaptive importance sampling)."""

from rljax.quant.corrections import (
    add_norm_noise,
    aqn_sigma,
    is_norm_weight,
    macro_block_quantize_mx,
    outlier_fallback_mx,
    quantize_params,
    transformer_batch_axes,
    transformer_reduction_axes,
)
from rljax.quant.decompose import MXError, decompose_mx, mx_error_metrics
from rljax.quant.fp8 import FP8_FORMATS, quantize_fp8
from rljax.quant.mismatch import (
    adaptive_is,
    ais_lambda,
    divergence_rejection,
    effective_sample_size,
    icepop,
    masked_is,
    mismatch_metrics,
    sequence_log_ratio,
    token_log_ratio,
    truncated_is,
)
from rljax.quant.mx import MX_FORMATS, quantize_mx
from rljax.quant.rollout import (
    WEIGHT_CORRECTIONS,
    WEIGHT_FORMATS,
    RolloutWeights,
    rollout_error_metrics,
    rollout_weights,
)

__all__ = [
    "FP8_FORMATS",
    "MX_FORMATS",
    "MXError",
    "decompose_mx",
    "mx_error_metrics",
    "quantize_mx",
    "add_norm_noise",
    "aqn_sigma",
    "is_norm_weight",
    "macro_block_quantize_mx",
    "outlier_fallback_mx",
    "quantize_fp8",
    "quantize_params",
    "transformer_batch_axes",
    "transformer_reduction_axes",
    "adaptive_is",
    "ais_lambda",
    "divergence_rejection",
    "icepop",
    "effective_sample_size",
    "masked_is",
    "mismatch_metrics",
    "sequence_log_ratio",
    "token_log_ratio",
    "truncated_is",
    "WEIGHT_CORRECTIONS",
    "WEIGHT_FORMATS",
    "RolloutWeights",
    "rollout_error_metrics",
    "rollout_weights",
]
