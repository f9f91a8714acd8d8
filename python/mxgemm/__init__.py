"""mxgemm: low-precision (MXFP8 / MXFP4 / FP8) GEMM kernels for AMD Instinct GPUs (gfx950, gfx1250).

Public ops are exported here as they land; see README.md for the layout.
"""
__version__ = "0.1.0"
from .ops import mxfp8_dequantize  # noqa: E402,F401
from .dispatch import explain  # noqa: E402,F401
from .ops import moe_gemm2_a4w4  # noqa: E402,F401
from .ops import moe_mxfp8_grouped_gemm, smallm_mxfp8_gemm  # noqa: E402,F401
