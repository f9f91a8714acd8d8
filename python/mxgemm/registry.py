"""The one table of device kernels. Build, dispatch and tests all read it.

A kernel is one source file (one kernel family) compiled once per (variant, arch). A
variant is a dict of compile-time parameters: for HIP each becomes ``-D<KEY>=<value>``;
for FlyDSL they are passed as keyword arguments to the module's ``compile_for_build``.
Variant parameters are spelled in upper case (``BLOCK_M``, ``NT``) in both languages.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
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
    """A kernel and everything dispatch needs to launch it; ops read these, never restate them.

    The launch grid is ``ceil(dims[d] / tile(variant)[d])`` for each name d in ``grid``
    (x, y, z; a name missing from the tile counts 1 per workgroup), where ``dims`` are the
    problem sizes the op passes under those names, rounded up to whole clusters (``cluster``)."""
    name: str                       # what it is: "smallm_mxfp8_gemv", not "k2"
    language: str                   # "hip" | "flydsl"
    source: str                     # path relative to source_root()
    symbol: str                     # kernel symbol inside the code object
    archs: tuple = ("gfx950",)
    variants: tuple = ({},)         # tuple of dicts of compile-time parameters
    arch_variants: dict = field(default_factory=dict)   # arch -> its own variants, replacing `variants`
    doc: str = ""
    args: tuple = ()                # kernel arguments in order: names of the op's values
    grid: tuple = ()                # problem dims mapped to grid x, y, z
    tile: Callable[[dict], dict] = lambda variant: {}   # variant -> {dim: extent per workgroup}
    cluster: Callable[[dict], tuple] = lambda variant: (1, 1, 1)   # variant -> workgroups per cluster (x, y, z)
    threads: Callable[[dict], int] = lambda variant: 256   # variant -> workgroup size (x)
    arch_threads: dict = field(default_factory=dict)   # arch -> its own workgroup size, replacing `threads`
    k_align: int = 32               # K must be a multiple of this
    n_align: int = 1                # N must be a multiple of this
    m_range: tuple | None = None    # (lo, hi) rows of A the kernel serves, None: any

    @property
    def path(self) -> Path:
        return source_root() / self.source

    def launch_grid(self, variant: dict, **dims) -> tuple:
        tile = self.tile(variant)
        g = tuple(-(-dims[d] // tile.get(d, 1)) for d in self.grid)
        # a cluster launch runs whole clusters: the grid rounds up (the kernel masks the extra tiles)
        return tuple(-(-n // c) * c for n, c in zip(g + (1,) * (3 - len(g)), self.cluster(variant)))

    def ordered_args(self, **values) -> list:
        """The kernel's arguments in kernel order, taken by name from ``values`` (grid dims that are
        not kernel arguments may be among them); ValueError naming what is missing."""
        missing = [a for a in self.args if a not in values]
        if missing:
            raise ValueError(f"{self.name}: kernel arguments {missing} not given; it takes {list(self.args)}")
        return [values[a] for a in self.args]

    def variants_for(self, arch: str) -> tuple:
        """The variants built for ``arch``."""
        return self.arch_variants.get(arch, self.variants)

    def threads_for(self, arch: str, variant: dict) -> int:
        """The workgroup size (x) of ``variant``'s ``arch`` build."""
        return self.arch_threads.get(arch) or self.threads(variant)

    def values(self, param: str) -> tuple:
        """Sorted values a variant parameter takes: values("BM") -> (16, 32)."""
        return tuple(sorted({v[param] for v in self.variants}))


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
# The table. One entry per kernel family; keep entries grouped by family.
# ---------------------------------------------------------------------------------------------

# Sample kernels (foundation): e8m0-scaled MXFP8 dequantise, the same op in both languages.
# One thread per 4 elements: a 256-thread workgroup covers 1024 elements of x.
_DEQUANT = dict(args=("x", "scale", "out", "M", "K"), grid=("elements",), tile=lambda v: {"elements": 1024},
                archs=("gfx950", "gfx1250"))
register(Kernel(
    name="mxfp8_dequant", language="hip", source="csrc/kernels/mxfp8_dequant.hip",
    symbol="mxfp8_dequant", **_DEQUANT,
    doc="x[M,K] e4m3 * 2^(scale[M,K/32]-127) -> f32 [M,K]; sample of the HIP path"))
register(Kernel(
    name="mxfp8_dequant_flydsl", language="flydsl", source="flydsl_kernels/mxfp8_dequant.py",
    symbol="mxfp8_dequant", **_DEQUANT,
    doc="FlyDSL twin of mxfp8_dequant; sample of the FlyDSL path"))

# --- small-M MXFP8 ---
# One source, three kernels: each is emitted when its defining parameter is set (N_SUB: GEMV,
# SPLIT_K: MFMA, BLOCK_N: MoE), so every variant compiles exactly one kernel.
_SMALLM_SRC = "csrc/kernels/smallm_mxfp8.hip"
_SMALLM_DENSE_ARGS = ("a", "a_scale", "b", "b_scale", "out", "M", "N", "K")
register(Kernel(
    name="smallm_mxfp8_gemv", language="hip", source=_SMALLM_SRC, symbol="smallm_mxfp8_gemv",
    args=_SMALLM_DENSE_ARGS, grid=("N", "M"), m_range=(1, 16),
    # 256 / K_LANES lane groups of K_LANES threads (16 when unset), each owning N_SUB weight rows
    tile=lambda v: {"N": 256 // v.get("K_LANES", 16) * v["N_SUB"], "M": v["M_TILE"]},
    # M_TILE=16 with N_SUB=2 needs > 256 VGPRs and spills, so it is not offered. K_LANES 64: 4 rows
    # per workgroup, for narrow layers at M <= 4 (4x the workgroups of 16 lanes).
    variants=variant_grid(M_TILE=(1, 2, 4, 8), N_SUB=(1, 2)) + variant_grid(M_TILE=(16,), N_SUB=(1,))
    + variant_grid(M_TILE=(1, 2, 4), N_SUB=(1,), K_LANES=(64,)),
    doc="MXFP8 GEMV, M <= M_TILE per workgroup row, 16*N_SUB weight rows per workgroup; packed FMA"))
register(Kernel(
    name="smallm_mxfp8_mfma", language="hip", source=_SMALLM_SRC, symbol="smallm_mxfp8_mfma",
    args=_SMALLM_DENSE_ARGS, grid=("N", "M"), m_range=(1, 64), k_align=128,
    # 4 waves of 16 columns, SPLIT_K of them sharing each column block. Any M from 1: rows past M
    # reload the last row and are not stored.
    tile=lambda v: {"N": 16 * (4 // v["SPLIT_K"]), "M": v["M_TILE"]},
    variants=variant_grid(M_TILE=(16, 32, 64), SPLIT_K=(1, 2, 4)),
    doc="MXFP8 small-M GEMM on v_mfma_scale_f32_16x16x128_f8f6f4; in-workgroup split-K; K % 128"))
register(Kernel(
    name="smallm_mxfp8_moe_grouped_gemm", language="hip", source=_SMALLM_SRC,
    symbol="smallm_mxfp8_moe_grouped_gemm",
    args=("a", "a_scale", "w", "w_scale", "sorted_token_ids", "sorted_expert_ids", "num_valid_ids",
          "topk_weights", "out", "tokens", "topk", "N", "K", "a_rows", "block_m", "flags", "grid_blocks"),
    grid=("N", "grid_blocks"), tile=lambda v: {"N": v["BLOCK_N"]},
    # M_CHUNK 16: the chunk is one scaled-MFMA tile (4 waves x 16 columns; K % 128, checked by the op)
    variants=variant_grid(BLOCK_N=(8, 16, 32, 64), M_CHUNK=(2, 4)) + ({"BLOCK_N": 64, "M_CHUNK": 16},),
    doc="MXFP8 MoE grouped GEMM over sorted_token_ids; optional top-k weights; bf16/fp32 out"))

# --- a4w4 MXFP4 MoE gemm2 ---
# One HIP reference kernel and its 1:1 FlyDSL port; BM (rows per workgroup, = the routing
# block size) x NT (non-temporal weight loads) x ROUTE_ROWS (out [T, N] summed by atomics, or
# [T*topk, N], a row per route) are parameters of one body in each language.
# A workgroup owns one routing block of BM sorted rows x 256 output columns; K runs in
# 256-wide steps.
_MOE_GEMM2_A4W4 = dict(
    args=("a", "a_scale", "w", "w_scale", "sorted_token_ids", "sorted_expert_ids", "num_valid_ids",
          "sorted_weights", "out", "tokens", "topk", "experts", "N", "K", "blocks"),
    grid=("N", "blocks"), tile=lambda v: {"N": 256}, k_align=256, n_align=256,
    variants=variant_grid(BM=(16, 32, 64, 128), NT=(0, 1), ROUTE_ROWS=(0, 1)))
register(Kernel(
    name="moe_gemm2_a4w4", language="hip", source="csrc/kernels/moe_gemm2_a4w4.hip",
    symbol="moe_gemm2_a4w4", **_MOE_GEMM2_A4W4,
    doc="MXFP4 x MXFP4 MoE down-projection: A rows -> LDS by buffer DMA, scaled MFMA, "
        "top-k weighted bf16 atomics into out[T, N] or stores into out[T*topk, N]; K % 256, N % 256"))
register(Kernel(
    name="moe_gemm2_a4w4_flydsl", language="flydsl", source="flydsl_kernels/moe_gemm2_a4w4.py",
    symbol="moe_gemm2_a4w4", **_MOE_GEMM2_A4W4,
    doc="FlyDSL port of moe_gemm2_a4w4: same tiles, loads, MFMA and epilog order; bit-identical"))

# --- DeepGEMM-compatible FP8 block-scale grouped GEMMs ---
# One FlyDSL body: contiguous / masked grouping (MASKED), fp32 software-promoted / e8m0 hardware
# scales (UE8M0) and the output type (OUT) are parameters. BM=BN=128 is the production tile;
# 32 x 32 keeps emulator tests fast. Every fp32-scale FP8 variant also comes with SFA_KMAJOR=1, which
# the op runs for row-major activation scales (the others: MN-major).
_BLOCKSCALE_FP8 = (
    variant_grid(BM=(128,), BN=(128,), MASKED=(0, 1), UE8M0=(0, 1), OUT=("bf16", "f16"))
    + variant_grid(BM=(128,), BN=(64,), MASKED=(0, 1), UE8M0=(0, 1), OUT=("bf16",))
    + variant_grid(BM=(64,), BN=(128,), MASKED=(0, 1), UE8M0=(0, 1), OUT=("bf16",))
    + variant_grid(BM=(32,), BN=(32,), MASKED=(0, 1), UE8M0=(0, 1), OUT=("bf16", "f16"))
    + tuple(dict(BM=t, BN=t, MASKED=0, PSUM=1, UE8M0=0, OUT="bf16") for t in (128, 32)))
register(Kernel(
    name="blockscale_grouped_gemm", language="flydsl", source="flydsl_kernels/blockscale_grouped_gemm.py",
    symbol="blockscale_grouped_gemm",
    # layout: m_indices / grouped_layout (contiguous) or masked_m (masked); zero_pad: write rows of no
    # group as zeros; sfa_* / sfb_*: the scales' byte strides (group, row, 4 K blocks, K block in 4;
    # rows of b >> sfb_shift); m_tiles: BM-row tiles over all groups
    args=("a", "sfa", "b", "sfb", "out", "layout", "rows", "N", "K", "m_max", "groups", "zero_pad",
          "sfa_sg", "sfa_sm", "sfa_sk4", "sfa_sk1", "sfb_sg", "sfb_sn", "sfb_sk4", "sfb_sk1", "sfb_shift"),
    grid=("N", "m_tiles"), tile=lambda v: {"N": v["BN"]}, k_align=16, n_align=32,
    # tiles (the op's config space): 128 x 128, 128 x 64 for grids too small to fill the GPU with
    # 128 x 128 and 64 x 128 for masked buffers of 64 rows (bf16, DeepGEMM's output), 32 x 32 for
    # N % 64 != 0 (and fast emulator tests)
    variants=_BLOCKSCALE_FP8 + tuple(dict(v, SFA_KMAJOR=1) for v in _BLOCKSCALE_FP8 if not v["UE8M0"])
    # DeepGEMM's unscaled BF16 grouped GEMMs (A_FMT bf16: a and b bf16, no scales, bf16 d): m_indices,
    # psum and masked layouts, 128 x 128 (hardware) and 32 x 32 (emulator)
    + tuple(dict(BM=t, BN=t, A_FMT="bf16", UE8M0=0, OUT="bf16", **f) for t in (128, 32)
            for f in (dict(MASKED=0), dict(MASKED=0, PSUM=1), dict(MASKED=1)))
    # DeepGEMM 2.6's forms, bf16 out (its API's d): the psum contiguous layout (PSUM=1) and e4m3 x e2m1
    # (B_FMT: FP4 weights, per-32-K e8m0 scales) in every layout; 128 x 128 (hardware), 32 x 32 (emulator;
    # last: the race sweep's sample)
    + tuple(dict(BM=t, BN=t, OUT="bf16", **f) for t in (128, 32) for f in (
        dict(MASKED=0, PSUM=1, UE8M0=1), dict(MASKED=0, UE8M0=1, B_FMT="e2m1"),
        dict(MASKED=1, UE8M0=1, B_FMT="e2m1"), dict(MASKED=0, PSUM=1, UE8M0=1, B_FMT="e2m1"))),
    doc="e4m3 x e4m3 or e4m3 x e2m1 grouped GEMM with 1x128 / 128x128 (or per-row 1x128; 1x32 for e2m1) "
        "block scales: fp32, or e8m0 bytes, packed or not; or bf16 x bf16 unscaled (A_FMT bf16); DeepGEMM's "
        "contiguous (m_indices or psum, padding rows zeroed or untouched) and masked (masked_m) layouts; "
        "bf16/f16 out; K % 16, N % BN"))
# --- tensorwise FP8 grouped GEMM for MoE training ---
# One FlyDSL body; LAYOUT NT = forward, NN = dgrad, TN = variable-K wgrad. 64 x 64 tiles (every
# format and output) keep emulator tests fast; 128 x 128 and 256 x 128 are the hardware-sized
# bf16 variants; e4m3 -> bf16 also 256 x 256 (NT, NN, TN) and, forward only, 256 x 192 and 256 x 224
# (operands by DMA: widths whose tiles fill the CUs' rounds better than 256). FMT / FMT_B: the
# formats of a / b. Mixed pairs only where hybrid training (e4m3 activations and weights, e5m2
# gradients) has them: the backward's dgrad (e5m2 grad_out x e4m3 weights: NN for a forward with
# trans_b, NT without) and wgrads, in bf16 and fp16. The wgrad
# (TN) also writes fp32 and accumulates (ACCUM=1: out += result, Megatron's fused main_grad in
# fp32 or bf16), every format pair at 64 x 64, e4m3 at 128 x 128.
_GROUPED_FP8_SAME = tuple(dict(FMT=f, FMT_B=f) for f in ("e4m3", "e5m2"))
_GROUPED_FP8_HYBRID = (dict(LAYOUT="NN", FMT="e5m2", FMT_B="e4m3"), dict(LAYOUT="NT", FMT="e5m2", FMT_B="e4m3"),
                       dict(LAYOUT="TN", FMT="e5m2", FMT_B="e4m3"), dict(LAYOUT="TN", FMT="e4m3", FMT_B="e5m2"))


def _train_grouped_variants(**params):
    same = tuple(dict(v, **f) for f in _GROUPED_FP8_SAME for v in variant_grid(LAYOUT=("NT", "NN", "TN"), **params))
    return same + tuple(dict(v, **h) for h in _GROUPED_FP8_HYBRID for v in variant_grid(**params)
                        if v["BM"] in (64, 256))


def _train_grouped_wgrad_variants(formats, tile):
    """TN variants writing fp32 (ACCUM 0, 1) or accumulating into bf16, per (FMT, FMT_B) pair."""
    return tuple(dict(LAYOUT="TN", FMT=fa, FMT_B=fb, OUT=o, BM=tile, BN=tile, ACCUM=acc) for fa, fb in formats
                 for o, acc in (("f32", 0), ("f32", 1), ("bf16", 1)))


_GROUPED_FP8_PAIRS = (("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e5m2", "e4m3"), ("e4m3", "e5m2"))
# Scales are read through byte strides (stride 0: one scale), so tensorwise and row-wise scales
# share the variants above; e4m3 adds TT (a MN-major) and fp32 out / accumulation (DeepGEMM's
# d = a b^T + c) for the row layouts at 64 x 64. GRAN=block: 128-K block scales promoted per
# contraction step, e4m3, 128 x 128 bf16 NT / NN, every layout at 64 x 64 (bf16 with ACCUM 0 / 1, as
# DeepGEMM's bf16 d += a b^T; f32 with ACCUM 0 / 1; last: the race sweep's sample).
_E4M3_64 = dict(FMT="e4m3", FMT_B="e4m3", BM=64, BN=64)
_GROUPED_FP8_ROW_EXTRA = (dict(LAYOUT="TT", OUT="bf16", **_E4M3_64),) + tuple(
    dict(LAYOUT=lay, OUT="f32", ACCUM=acc, **_E4M3_64) for lay in ("NT", "NN", "TT") for acc in (0, 1))
_GROUPED_FP8_BLOCK = tuple(dict(v, GRAN="block") for v in (
    *(dict(LAYOUT=lay, FMT="e4m3", FMT_B="e4m3", OUT="bf16", BM=128, BN=128) for lay in ("NT", "NN")),
    *(dict(LAYOUT=lay, OUT=o, **_E4M3_64, **acc) for lay in ("NT", "NN", "TN", "TT")
      for o, acc in (("bf16", {}), ("bf16", dict(ACCUM=1)), ("f32", dict(ACCUM=0)), ("f32", dict(ACCUM=1))))))
# GRAN=mx (MXFP8, Primus-Turbo's MX_BLOCKWISE: e8m0 scales per 32 contraction elements on the scaled MFMA): e4m3 every
# layout at 64 x 64 (bf16; f32 with ACCUM 0 / 1), e5m2 NT / TN bf16 at 64 x 64, e4m3 bf16 NT / NN at 128 x 128.
_GROUPED_MX = tuple(dict(v, GRAN="mx") for v in (
    *(dict(LAYOUT=lay, OUT=o, **_E4M3_64, **acc) for lay in ("NT", "NN", "TT", "TN")
      for o, acc in (("bf16", {}), ("f32", dict(ACCUM=0)), ("f32", dict(ACCUM=1)))),
    *(dict(LAYOUT=lay, FMT="e5m2", FMT_B="e5m2", OUT="bf16", BM=64, BN=64) for lay in ("NT", "TN")),
    *(dict(LAYOUT=lay, FMT="e4m3", FMT_B="e4m3", OUT="bf16", BM=128, BN=128) for lay in ("NT", "NN"))))

# MXFP4 (FMT=FMT_B=e2m1, packed two per byte, e8m0 scales per 32 on the scaled MFMA; Primus-Turbo's grouped_gemm_fp4):
# the forward / dgrad NT at 64 x 64 (bf16, f16) and 128 x 128 (bf16); the wgrad NTK (both operands
# contraction-contiguous, groups along it) at 64 x 64 in bf16 and f16, accumulating into them (main_grad in the
# weight's dtype) and fp32 (ACCUM 0 / 1).
_GROUPED_FP4 = tuple(dict(v, FMT="e2m1", FMT_B="e2m1", GRAN="mx") for v in (
    *(dict(LAYOUT="NT", OUT=o, BM=t, BN=t) for o, t in (("bf16", 64), ("f16", 64), ("bf16", 128))),
    *(dict(LAYOUT="NTK", OUT=o, BM=64, BN=64, **acc) for o, acc in (
        ("bf16", {}), ("f16", {}), ("bf16", dict(ACCUM=1)), ("f16", dict(ACCUM=1)), ("f32", dict(ACCUM=0)),
        ("f32", dict(ACCUM=1))))))

# The training recipes' other formats with block and mx scales (mxgemm.grouped_gemm_fp8's BLOCKWISE and MX_BLOCKWISE
# in e5m2 and hybrid, bf16 or f16 out) at 64 x 64: the forward / dgrad / wgrad layouts of each format pair.
_GROUPED_SCALED_RECIPES = tuple(
    dict(LAYOUT=lay, FMT=fa, FMT_B=fb, OUT=o, BM=64, BN=64, GRAN=gran) for gran in ("block", "mx")
    for o in ("bf16", "f16") for lay, fa, fb in (
        ("NT", "e4m3", "e4m3"), ("NN", "e4m3", "e4m3"), ("TN", "e4m3", "e4m3"),
        ("NT", "e5m2", "e5m2"), ("NN", "e5m2", "e5m2"), ("TN", "e5m2", "e5m2"),
        ("NN", "e5m2", "e4m3"), ("NT", "e5m2", "e4m3"), ("TN", "e5m2", "e4m3"), ("TN", "e4m3", "e5m2")))

# FMT=FMT_B=bf16 (no scales, GRAN absent: none): every layout at 64 x 64 in bf16 and f16, fp32 with ACCUM 0 / 1,
# bf16 accumulating (TN also f16 accumulating); 128 x 128 and 256 x 128 bf16 (hardware tiles) in every layout.
_BF16 = dict(FMT="bf16", FMT_B="bf16")
_GROUPED_BF16 = tuple(dict(LAYOUT=lay, OUT=o, BM=64, BN=64, **_BF16, **acc) for lay in ("NT", "NN", "TT", "TN")
                      for o, acc in (("bf16", {}), ("f16", {}), ("f32", dict(ACCUM=0)), ("f32", dict(ACCUM=1)),
                                     ("bf16", dict(ACCUM=1))))
_GROUPED_BF16 += (dict(LAYOUT="TN", OUT="f16", BM=64, BN=64, ACCUM=1, **_BF16),) + tuple(
    dict(LAYOUT=lay, OUT="bf16", BM=bm, BN=128, **_BF16) for bm in (128, 256) for lay in ("NT", "NN", "TT", "TN"))
# FMT=FMT_B=f16 (fp16 operands on v_mfma_f32_16x16x32_f16, Primus-Turbo's fp16 grouped_gemm) at 64 x 64 only: what
# mxgemm.grouped_gemm runs, the forward / dgrad of both b layouts (NT, NN) and the wgrad TN in f16, the wgrad
# accumulating into an fp32 main_grad.
_F16 = dict(FMT="f16", FMT_B="f16", BM=64, BN=64)
_GROUPED_F16 = tuple(dict(LAYOUT=lay, OUT="f16", **_F16) for lay in ("NT", "NN", "TN")) + (
    dict(LAYOUT="TN", OUT="f32", ACCUM=1, **_F16),)

register(Kernel(
    name="train_grouped_gemm", language="flydsl", source="flydsl_kernels/train_grouped_gemm.py",
    symbol="train_grouped_gemm",
    args=("a", "a_scale", "b", "b_scale", "group_offs", "out", "G", "M", "N", "K", "group_m", "grid",
          "sa_sg", "sa_si", "sa_sk", "sb_sg", "sb_sj", "sb_sk", "sb_shift"),
    # persistent or not is the launch's choice: the kernel strides its tile loop by its grid argument
    grid=("grid",), tile=lambda v: {"M": v["BM"], "N": v["BN"]}, k_align=16, n_align=16,
    threads=lambda v: 512 if v["BM"] == 256 else 256,   # the kernel's waves(BM): 8 waves at 256 rows
    variants=_train_grouped_variants(OUT=("bf16", "f16"), BM=(64,), BN=(64,))
    + _train_grouped_variants(OUT=("bf16",), BM=(128, 256), BN=(128,))
    + tuple(dict(LAYOUT=lay, FMT="e4m3", FMT_B="e4m3", OUT="bf16", BM=256, BN=256) for lay in ("NT", "NN", "TN"))
    + tuple(dict(LAYOUT="NT", FMT="e4m3", FMT_B="e4m3", OUT="bf16", BM=256, BN=bn) for bn in (192, 224))
    + _train_grouped_wgrad_variants(_GROUPED_FP8_PAIRS, 64) + _train_grouped_wgrad_variants(_GROUPED_FP8_PAIRS[:1], 128)
    + _GROUPED_BF16 + _GROUPED_F16 + _GROUPED_MX + _GROUPED_FP8_ROW_EXTRA
    + tuple(v for v in _GROUPED_SCALED_RECIPES if v not in _GROUPED_MX + _GROUPED_FP8_BLOCK) + _GROUPED_FP8_BLOCK
    + _GROUPED_FP4,
    doc="FP8 grouped GEMM (e4m3/e5m2 or mixed) with tensorwise, row-wise or 128-block fp32 scales (strided) or "
        "MX e8m0 1x32 scales, MXFP4 (e2m1 x e2m1, mx scales: NT and the K-contiguous variable-K wgrad NTK), or BF16 "
        "or FP16 without scales, on "
        "v_mfma_f32_16x16x128_f8f6f4: fwd NT, dgrad NN, variable-K wgrad TN, TT (a MN-major); on-device group "
        "scan, 64-bit tile rebasing, bf16/f16/f32 out, out += result (fused main_grad accumulation)"))

# --- MX GEMM for prefill (MXFP8 / MXFP6 / MXFP4 / A8W4, every pair of e4m3, e5m2, e2m3, e3m2, e2m1) ---
# One FlyDSL body; the target picks the MMA atom and the load path (flydsl_kernels/mx_gemm.py).
# Every format pair and output at 64 x 64 (emulator-sized); 128 x 128 for bf16 (and MXFP8 e4m3
# f16 / f32); 256 x 128 for bf16 e4m3 and MXFP4; SPLITK=1 (64 x 64, every pair) adds fp32
# partials of grid-z K ranges with atomics (OUT=f32). MXFP4 at 128 x 128 and 256 x 128 stages two
# K steps (STAGE_STEPS=2): a row's 128 bytes, a whole cache line, where one step reads half a line.
# MXFP8 and MXFP4 256 x 128 keep two stages in flight (NUM_BUFFERS=3, 144 KiB of LDS).
_MX_PAIRS = (("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("e2m1", "e2m1"), ("e4m3", "e2m1"), ("e5m2", "e4m3"),
             ("e5m2", "e2m1"), ("e2m1", "e4m3"), ("e2m1", "e5m2"))
# The large-GEMM pairs (MXFP8, MXFP4, A8W4): the 256 x 128 tile, and pre-shuffled scales (aiter's /
# Triton's CDNA4 layout) at every tile, bf16 out.
_MX_LARGE_PAIRS = (("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1"))
# FP6 (e2m3, e3m2) with every format: 64 x 64 bf16 only (one build and emulator run per pair).
_MX_FP6_PAIRS = tuple((fa, fb) for fa in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")
                      for fb in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1") if "e2m3" in (fa, fb) or "e3m2" in (fa, fb))


def _mx_variants(pairs, tiles, outs, splitk, shuffled=False):
    """MXFP4 stages two K steps from 128 x 128 up; 256 x 128 runs eight waves, three buffers and a
    scale window of 12 K steps (three dwords a lane group: the VGPRs two waves per SIMD leave).
    shuffled: the pre-shuffled scale layout (SCALE_SHUFFLED=1)."""
    return tuple(dict(A_FMT=fa, B_FMT=fb, BM=bm, BN=bn, OUT=o, SPLITK=splitk, NUM_BUFFERS=2) | steps
                 | (dict(NUM_BUFFERS=3, WAVES=8, WINDOW_TURNS=12 // 3 // steps.get("STAGE_STEPS", 1))
                    if bm == 256 else {}) | (dict(SCALE_SHUFFLED=1) if shuffled else {})
                 for fa, fb in pairs for bm, bn in tiles for o in outs
                 for steps in [dict(STAGE_STEPS=2) if fa == fb == "e2m1" and bm >= 128 else {}])


register(Kernel(
    name="mx_gemm", language="flydsl", source="flydsl_kernels/mx_gemm.py", symbol="mx_gemm",
    archs=("gfx950", "gfx1250"), arch_threads={"gfx1250": 128},    # gfx1250: 4 waves of 32
    threads=lambda v: 64 * v.get("WAVES", 4),                       # gfx950: WAVES (default 4) of 64
    args=("a", "a_scale", "b", "b_scale", "out", "M", "N", "K", "splits"),
    grid=("N", "M", "splits"), tile=lambda v: {"N": v["BN"], "M": v["BM"]}, k_align=128, n_align=32,
    cluster=lambda v: (v.get("CLUSTER_N", 1), v.get("CLUSTER_M", 1), 1),
    variants=_mx_variants(_MX_PAIRS, ((64, 64),), ("bf16", "f16", "f32"), 0)
    + _mx_variants(_MX_PAIRS, ((128, 128),), ("bf16",), 0)
    + _mx_variants(_MX_PAIRS[:1], ((128, 128),), ("f16", "f32"), 0)
    + _mx_variants(_MX_PAIRS, ((64, 64),), ("f32",), 1)
    + _mx_variants(_MX_LARGE_PAIRS, ((256, 128),), ("bf16",), 0)
    + _mx_variants(_MX_LARGE_PAIRS, ((64, 64), (128, 128), (256, 128)), ("bf16",), 0, shuffled=True)
    # last: the race test's default variant (a 64 x 64 FP6 one, whose K loop its short cases reach)
    + _mx_variants(_MX_FP6_PAIRS, ((64, 64),), ("bf16",), 0),
    # gfx1250: one variant per option value, kept small so the build, ISA and emulator tests stay
    # quick; every variant also names the target options.
    arch_variants={"gfx1250": tuple(dict(A_FMT=fa, B_FMT=fb, BM=bm, BN=bn, OUT=out, SPLITK=sk, NUM_BUFFERS=nb,
                                         B_STREAMING=bs, SCALE_PATH=sp, CLUSTER_M=cm, CLUSTER_N=cn, F4_WIDE=w)
                                    for fa, fb, bm, bn, out, sk, nb, bs, sp, cm, cn, w in (
        ("e4m3", "e4m3", 128, 128, "bf16", 0, 2, 0, "tdm", 1, 1, 0),
        ("e2m1", "e2m1", 128, 128, "bf16", 0, 3, 0, "tdm", 1, 1, 1),
        ("e4m3", "e2m1", 128, 128, "bf16", 0, 2, 0, "buffer_lds_stage", 1, 1, 0),
        ("e4m3", "e4m3", 128, 128, "f32", 0, 4, 0, "buffer_lds_stage_ab_split", 1, 1, 0),
        ("e4m3", "e4m3", 128, 128, "bf16", 0, 3, 1, "tdm", 1, 1, 0),
        ("e2m1", "e2m1", 256, 128, "bf16", 0, 2, 1, "tdm", 1, 1, 0),
        ("e4m3", "e4m3", 128, 128, "bf16", 0, 2, 0, "tdm", 2, 2, 0),
        ("e4m3", "e2m1", 128, 128, "f16", 0, 3, 0, "buffer_lds_stage_ab_split", 1, 4, 0),
        ("e4m3", "e4m3", 64, 64, "f32", 1, 2, 0, "tdm", 1, 1, 0),
        # the other format pairs of e4m3, e5m2, e2m1 (the scaled WMMA takes any of its five formats for A and B)
        *((fa, fb, 128, 128, "bf16", 0, 2, 0, "tdm", 1, 1, 0) for fa, fb in (
            ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e2m1", "e4m3"), ("e5m2", "e2m1"),
            ("e2m1", "e5m2")))))},
    doc="MX GEMM (MXFP8 e4m3/e5m2, MXFP6 e2m3/e3m2 (gfx950), MXFP4, A8W4 and the mixes) with 1x32 e8m0 scales on "
        "the scaled 16x16x128 MMA; "
        "BM x BN tiles, A and B staged in LDS, any M, N % 32, K % 128; bf16/f16/f32 out, fp32-atomic split-K"))
