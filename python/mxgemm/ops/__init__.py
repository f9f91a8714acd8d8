"""Public ops, one op per module, all built on the framework in ``_op.py``."""
from ._op import explain  # noqa: F401
from .blockscale_grouped_gemm import deep_gemm_fp8_grouped_gemm  # noqa: F401
from .dense_mx import mx_gemm  # noqa: F401
from .dequant import mxfp8_dequantize  # noqa: F401
from .grouped_bf16 import grouped_gemm  # noqa: F401
from .moe_a4w4 import moe_gemm2_a4w4  # noqa: F401
from .moe_mxfp8 import moe_mxfp8_grouped_gemm  # noqa: F401
from .smallm_mxfp8 import smallm_mxfp8_gemm  # noqa: F401
from .train_grouped_gemm import (  # noqa: F401
    grouped_gemm_bf16_kernel,
    grouped_gemm_bf16_variable_k,
    grouped_gemm_fp4,
    grouped_gemm_fp4_kernel,
    grouped_gemm_fp4_variable_k,
    grouped_gemm_fp8,
    grouped_gemm_fp8_kernel,
    grouped_gemm_fp8_variable_k,
)
