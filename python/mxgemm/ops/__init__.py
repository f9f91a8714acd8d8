"""Public ops, one kernel family per module. Importing registers each op's planner."""
from .dequant import mxfp8_dequantize  # noqa: F401
from .moe_a4w4 import moe_gemm2_a4w4  # noqa: F401
from .smallm_mxfp8 import moe_mxfp8_grouped_gemm, smallm_mxfp8_gemm  # noqa: F401
