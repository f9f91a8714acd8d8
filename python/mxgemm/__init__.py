"""mxgemm: low-precision (MXFP8 / MXFP4 / FP8) GEMM kernels for AMD Instinct GPUs (gfx950, gfx1250).

Ops take torch tensors: CPU tensors run the kernels' gfx950 assembly on the emulator
(mxgemm.emu), tensors on a gfx950 GPU run on the GPU. ``explain(op, ...)`` says which kernel
and config a call would use and why. See README.md for the layout.

The ops (and their torch.library registrations) load at the first use of one of them, so that
the emulator (``import mxgemm.emu``) and the other numpy-only modules load without torch.
"""
import importlib

__version__ = "0.1.0"

OP_NAMES = ("deep_gemm_fp8_grouped_gemm", "explain", "grouped_gemm", "grouped_gemm_bf16_kernel",
            "grouped_gemm_bf16_variable_k", "grouped_gemm_fp4_kernel", "grouped_gemm_fp4_variable_k",
            "grouped_gemm_fp4", "grouped_gemm_fp8", "grouped_gemm_fp8_kernel",
            "grouped_gemm_fp8_variable_k", "moe_gemm2_a4w4", "moe_mxfp8_grouped_gemm", "mx_gemm", "mxfp8_dequantize",
            "smallm_mxfp8_gemm")
__all__ = list(OP_NAMES)


def __getattr__(name: str):
    if name in OP_NAMES:
        from . import ops
        return getattr(ops, name)
    try:                       # mxgemm.quant etc. without an explicit import, as before
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted([*globals(), *OP_NAMES])
