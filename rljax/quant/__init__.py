"""Low-precision formats as fake quantisation: OCP MX block formats (MXFP4, MXFP8) and an
exact decomposition of the MX quantisation error into scale bias, deadzone and grid noise."""

from rljax.quant.decompose import MXError, decompose_mx, mx_error_metrics
from rljax.quant.mx import MX_FORMATS, quantize_mx

__all__ = [
    "MX_FORMATS",
    "MXError",
    "decompose_mx",
    "mx_error_metrics",
    "quantize_mx",
]
