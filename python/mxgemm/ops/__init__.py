"""Public ops, one kernel family per module. Importing registers each op's planner."""
from .dequant import mxfp8_dequantize  # noqa: F401
from .moe_gemm2_a4w4 import moe_gemm2_a4w4  # noqa: F401
