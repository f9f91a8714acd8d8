"""The one table of device kernels. Build, dispatch and tests all read it.

A kernel is one source file (one kernel family) compiled once per (variant, arch). A
variant is a dict of compile-time parameters: for HIP each becomes ``-D<KEY>=<value>``;
for FlyDSL they are passed as keyword arguments to the module's ``compile_for_build``.
Variant parameters are spelled in upper case (``BLOCK_M``, ``NT``) in both languages.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from pathlib import Path


@functools.lru_cache(maxsize=None)
def source_root() -> Path:
    """Directory holding csrc/ and flydsl_kernels/: the repo (editable install) or the
    copy shipped inside the installed package (python/mxgemm/_src)."""
    here = Path(__file__).resolve().parent
    for root in (here.parent.parent, here / "_src"):
        if (root / "csrc" / "include").is_dir():
            return root
    raise FileNotFoundError("mxgemm sources (csrc/) not found next to the package")


@dataclass(frozen=True)
class Kernel:
    name: str                       # what it is: "smallm_mxfp8_gemv", not "k2"
    language: str                   # "hip" | "flydsl"
    source: str                     # path relative to source_root()
    symbol: str                     # kernel symbol inside the code object
    archs: tuple = ("gfx950",)
    variants: tuple = ({},)         # tuple of dicts of compile-time parameters
    default: bool = True            # built on install / by `python -m mxgemm build`
    doc: str = ""

    @property
    def path(self) -> Path:
        return source_root() / self.source


KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    if kernel.name in KERNELS:
        raise ValueError(f"kernel {kernel.name!r} registered twice")
    if kernel.language not in ("hip", "flydsl"):
        raise ValueError(f"kernel {kernel.name!r}: language must be hip|flydsl, got {kernel.language!r}")
    KERNELS[kernel.name] = kernel
    return kernel


def get(name: str) -> Kernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; registered: {sorted(KERNELS)}") from None


def variant_grid(**params) -> tuple:
    """Cartesian product of parameter values: variant_grid(BM=(16, 32), NT=(0, 1))."""
    keys = list(params)
    return tuple(dict(zip(keys, vals)) for vals in itertools.product(*(params[k] for k in keys)))


def variant_id(variant: dict) -> str:
    """Canonical, filename-safe spelling of a variant: 'BM16_NT1' ('base' when empty)."""
    return "_".join(f"{k}{v}" for k, v in sorted(variant.items())) or "base"


def find_variant(kernel: Kernel, **params) -> dict:
    """The registered variant of ``kernel`` matching ``params`` exactly (no silent inventions)."""
    for v in kernel.variants:
        if v == params:
            return v
    raise KeyError(f"{kernel.name}: no registered variant {params}; have {list(kernel.variants)}")


# ---------------------------------------------------------------------------------------------
# The table. One entry per kernel family; keep entries grouped by the issue that owns them.
# ---------------------------------------------------------------------------------------------

# Sample kernels (foundation): e8m0-scaled MXFP8 dequantise, the same op in both languages.
register(Kernel(
    name="mxfp8_dequant", language="hip", source="csrc/kernels/mxfp8_dequant.hip",
    symbol="mxfp8_dequant", archs=("gfx950", "gfx1250"),
    doc="x[M,K] e4m3 * 2^(scale[M,K/32]-127) -> f32 [M,K]; sample of the HIP path"))
register(Kernel(
    name="mxfp8_dequant_flydsl", language="flydsl", source="flydsl_kernels/mxfp8_dequant.py",
    symbol="mxfp8_dequant", archs=("gfx950", "gfx1250"),
    doc="FlyDSL twin of mxfp8_dequant; sample of the FlyDSL path"))

# --- small-M MXFP8 (issue 6) ---
# One source, three kernels: each is emitted when its defining parameter is set (N_SUB: GEMV,
# SPLIT_K: MFMA, BLOCK_N: MoE), so every variant compiles exactly one kernel.
_SMALLM_SRC = "csrc/kernels/smallm_mxfp8.hip"
register(Kernel(
    name="smallm_mxfp8_gemv", language="hip", source=_SMALLM_SRC, symbol="smallm_mxfp8_gemv",
    # M_TILE=16 with N_SUB=2 needs > 256 VGPRs and spills, so it is not offered.
    variants=variant_grid(M_TILE=(1, 2, 4, 8), N_SUB=(1, 2)) + variant_grid(M_TILE=(16,), N_SUB=(1,)),
    doc="MXFP8 GEMV, M <= M_TILE per workgroup row, 16*N_SUB weight rows per workgroup; packed FMA"))
register(Kernel(
    name="smallm_mxfp8_mfma", language="hip", source=_SMALLM_SRC, symbol="smallm_mxfp8_mfma",
    variants=variant_grid(M_TILE=(16, 32, 64), SPLIT_K=(1, 2, 4)),
    doc="MXFP8 small-M GEMM on v_mfma_scale_f32_16x16x128_f8f6f4; in-workgroup split-K; K % 128"))
register(Kernel(
    name="smallm_mxfp8_moe_grouped_gemm", language="hip", source=_SMALLM_SRC,
    symbol="smallm_mxfp8_moe_grouped_gemm",
    variants=variant_grid(BLOCK_N=(8, 16), M_CHUNK=(2, 4)),
    doc="MXFP8 MoE grouped GEMM over sorted_token_ids; optional top-k weights; bf16/fp32 out"))

# --- a4w4 MXFP4 MoE gemm2 (issue 7) ---
# One HIP reference kernel and its 1:1 FlyDSL port; BM (rows per workgroup, = the routing
# block size) x NT (non-temporal weight loads) are parameters of one body in each language.
_MOE_GEMM2_A4W4_VARIANTS = variant_grid(BM=(16, 32), NT=(0, 1))
register(Kernel(
    name="moe_gemm2_a4w4", language="hip", source="csrc/kernels/moe_gemm2_a4w4.hip",
    symbol="moe_gemm2_a4w4", variants=_MOE_GEMM2_A4W4_VARIANTS,
    doc="MXFP4 x MXFP4 MoE down-projection: A rows -> LDS by buffer DMA, scaled MFMA, "
        "top-k weighted bf16 atomics into out[T, N]; K % 256, N % 256"))
register(Kernel(
    name="moe_gemm2_a4w4_flydsl", language="flydsl", source="flydsl_kernels/moe_gemm2_a4w4.py",
    symbol="moe_gemm2_a4w4", variants=_MOE_GEMM2_A4W4_VARIANTS,
    doc="FlyDSL port of moe_gemm2_a4w4: same tiles, loads, MFMA and epilog order; bit-identical"))

# --- DeepGEMM-compatible FP8 block-scale grouped GEMMs (issue 14) ---
# One FlyDSL body: contiguous / masked grouping (MASKED), fp32 software-promoted / e8m0 hardware
# scales (UE8M0) and the output type (OUT) are parameters. BM=BN=128 is the production tile;
# 32 x 32 keeps emulator tests fast.
register(Kernel(
    name="deep_gemm_fp8", language="flydsl", source="flydsl_kernels/deep_gemm_fp8.py",
    symbol="deep_gemm_fp8",
    variants=variant_grid(BM=(128,), BN=(128,), MASKED=(0, 1), UE8M0=(0, 1), OUT=("bf16", "f16"))
    + variant_grid(BM=(32,), BN=(32,), MASKED=(0, 1), UE8M0=(0, 1), OUT=("bf16", "f16")),
    doc="e4m3 x e4m3 grouped GEMM with 1x128 / 128x128 block scales (fp32 or e8m0), DeepGEMM's "
        "contiguous (m_indices) and masked (masked_m) layouts; bf16/f16 out; K % 128, N % BN"))
