"""The timing model's calibration kernels: the FP8 GEMM stages of AMD's CDNA4 GEMM blog, written
here from the blog's description of each stage (csrc/calibration/cdna4_fp8_gemm.hip), with the
MI355X throughput the blog publishes for each (docs/calibration_kernels.md). C[M, N] (bf16) = A[M, K]
B[N, K]^T, E4M3 inputs, fp32 accumulation; M, N multiples of the stage's tile, K of 128."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from . import toolchain
from .registry import source_root

SOURCE = "csrc/calibration/cdna4_fp8_gemm.hip"


@dataclass(frozen=True)
class Stage:
    symbol: str
    block: tuple        # workgroup size (x, y)
    tile: tuple         # outputs per workgroup (BM, BN); the grid is (N / BN, M / BM)
    tflops_4096: float  # published MI355X result at M = N = K = 4096
    tflops_8192: float | None = None   # at M = N = K = 8192, where the blog publishes one


# Published: ROCm blog "FP8 GEMM Optimization on AMD CDNA4 Architecture" (2026-03-10), Tables 3,
# 4 and 5 and the swizzle / double-buffer paragraphs.
STAGES = {s.symbol: s for s in (
    Stage("fp8_gemm_naive", (16, 16), (16, 16), 1.15),
    Stage("fp8_gemm_lds_tiled", (16, 16), (16, 16), 4.80),
    Stage("fp8_gemm_mfma", (256, 1), (64, 64), 30.05),
    Stage("fp8_gemm_vector_loads", (256, 1), (64, 64), 336.88),
    Stage("fp8_gemm_direct_to_lds", (256, 1), (64, 64), 506.70),
    Stage("fp8_gemm_swizzled", (256, 1), (64, 64), 497.43),
    Stage("fp8_gemm_double_buffer", (256, 1), (64, 64), 1166.41),
    Stage("fp8_gemm_128x128_8wave", (512, 1), (128, 128), 1828.74),
    Stage("fp8_gemm_256x256_8wave", (512, 1), (256, 256), 2288.16),
    Stage("fp8_gemm_256x256_16wave", (1024, 1), (256, 256), 2228.01),
    Stage("fp8_gemm_256x256_pingpong", (512, 1), (256, 256), 2680.33, 3204.15),
)}


@functools.lru_cache(maxsize=None)
def assembly(arch: str = "gfx950") -> str:
    """The stages' assembly (one code object holds them all), compiled once and cached."""
    return toolchain.compile_hip_source((source_root() / SOURCE).read_text(), arch)


def launch(emu, prog, stage: Stage, a, b, c) -> None:
    """Run ``stage`` on the emulator: a [M, K] and b [N, K] e4m3, c [M, N] bf16 (written)."""
    M, N = c.shape
    K = a.shape[1]
    grid = (N // stage.tile[1], M // stage.tile[0], 1)
    emu.launch(prog, stage.symbol, grid=grid, block=(*stage.block, 1), args=[a, b, c, M, N, K])
