"""mxgemm: low-precision (MXFP8 / MXFP4 / FP8) GEMM kernels for AMD Instinct GPUs (gfx950, gfx1250).

Ops take torch tensors: CPU tensors run the kernels' gfx950 assembly on the emulator
(mxgemm.emu), tensors on a gfx950 GPU run on the GPU. ``explain(op, ...)`` says which kernel
and config a call would use and why. See README.md for the layout.
"""
__version__ = "0.1.0"

from .ops import (  # noqa: F401
    deep_gemm_fp8_grouped_gemm,
    explain,
    grouped_gemm_fp8,
    grouped_gemm_fp8_kernel,
    grouped_gemm_fp8_variable_k,
    moe_gemm2_a4w4,
    moe_mxfp8_grouped_gemm,
    mx_gemm,
    mxfp8_dequantize,
    smallm_mxfp8_gemm,
)
