"""mx_gemm: dense MX GEMM for prefill (MXFP8, MXFP6, MXFP4, A8W4) on the mx_gemm FlyDSL family.

Kernel choice (``mxgemm.explain`` prints it): among the variants registered for the arch the
call runs on (gfx950, or gfx1250: a GPU of that arch, or MXGEMM_EMU_ARCH on the emulator), a
caller's ``config`` (tile and split count), else the tuned CSV row (``python -m mxgemm tune
mx_gemm``) of the same formats, output, scale layout, N and K at the nearest tuned M >= M, else
the rule of ``heuristic_config``; of several variants with the same tile, the first registered
(so no cluster-multicast variant, which a HIP launch cannot start, is chosen automatically).
Every malformed call raises GuardError before launch.
"""
from __future__ import annotations

import functools

import torch

from .. import formats, guards, launcher, registry, tuned
from ..quant import MX_BLOCK
from ._op import E8M0, NUM_CUS, Choice, ConfigGrammar, Plan, empty_plan, kernel_plan, op

KERNEL = registry.get("mx_gemm")
MAX_SPLITS = 8
PAYLOAD = {"e4m3": (torch.float8_e4m3fn, torch.uint8), "e5m2": (torch.float8_e5m2, torch.uint8),
           "e2m3": (torch.uint8,), "e3m2": (torch.uint8,), "e2m1": (torch.float4_e2m1fn_x2, torch.uint8)}
OUT = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
PAIRS = tuple(sorted({(v["A_FMT"], v["B_FMT"]) for a in KERNEL.archs for v in KERNEL.variants_for(a)}))
ARCH = "gfx950"           # the arch the tuned table is for
CONFIG_CSV = tuned.table_path("dense_mx", ARCH)
CSV_KEY = ("a_format", "b_format", "out", "shuffled", "N", "K")
CSV_PARAMS = ("BM", "BN", "SPLITS")
CSV_FIELDS = ("arch", "M", *CSV_KEY, *CSV_PARAMS, "us", "source", "runner_up", "runner_up_us", "peer_us")


def _variants(arch, a_fmt, b_fmt, out, splitk, shuffled=0):
    want = (a_fmt, b_fmt, out, splitk, shuffled)
    return [v for v in KERNEL.variants_for(arch)
            if (v["A_FMT"], v["B_FMT"], v["OUT"], v["SPLITK"], v.get("SCALE_SHUFFLED", 0)) == want]


def _listed(variants) -> str:
    """The format pairs and outputs of ``variants``, for an error message."""
    return ", ".join(sorted({f"{v['A_FMT']} x {v['B_FMT']} -> {v['OUT']}" for v in variants})) or "none"


def _grid_size(v, M, N) -> int:
    gx, gy, _ = KERNEL.launch_grid(v, M=M, N=N, splits=1)
    return gx * gy


def heuristic_config(arch, a_fmt, b_fmt, out, M, N, K, shuffled=0):
    """The Choice on ``arch`` (options: splits, the K ranges along grid z). Rule (written before any
    hardware timing): the largest registered tile (by area) that still gives >= NUM_CUS
    workgroups; when even the smallest tile leaves half the CUs idle, f32 output has at least 8 K
    steps and a split-K variant exists, 2 K splits (deterministic: two fp32 partials commute).
    ``shuffled``: among the variants taking pre-shuffled scales (none splits K)."""
    cands = sorted(_variants(arch, a_fmt, b_fmt, out, 0, shuffled), key=lambda v: v["BM"] * v["BN"])   # stable
    split = _variants(arch, a_fmt, b_fmt, out, 1, shuffled)
    if shuffled and not cands:
        guards.fail("shuffled-scales", f"no {arch} mx_gemm variant takes shuffled scales for {a_fmt} x {b_fmt} -> "
                                       f"{out}; {arch} has: "
                                       + _listed(v for v in KERNEL.variants_for(arch) if v.get("SCALE_SHUFFLED")))
    if not cands and not split:
        guards.fail("arch", f"no {arch} mx_gemm variant for {a_fmt} x {b_fmt} -> {out}; {arch} has: "
                            + _listed(KERNEL.variants_for(arch)))
    if split and (not cands or _grid_size(cands[0], M, N) < NUM_CUS // 2 and K // KERNEL.k_align >= 8):
        v = min(split, key=lambda s: s["BM"] * s["BN"])
        return Choice(KERNEL.name, v, "heuristic: few output tiles, 2-way split-K with fp32 atomics", {"splits": 2})
    full = [v for v in cands if _grid_size(v, M, N) >= NUM_CUS]
    v = next(c for c in full if c["BM"] * c["BN"] == full[-1]["BM"] * full[-1]["BN"]) if full else cands[0]
    why = f"heuristic: largest tile with >= {NUM_CUS} workgroups" if full else \
        "heuristic: smallest tile (fewer workgroups than CUs)"
    return Choice(KERNEL.name, v, why, {"splits": 1})


def candidates(arch, a_fmt, b_fmt, out, shuffled=0) -> list:
    """The configs a tuner times: each registered tile whole, and each split-K tile at the
    heuristic's 2 splits (more would give up bit-reproducibility)."""
    def tiles(splitk):
        return sorted({(v["BM"], v["BN"]) for v in _variants(arch, a_fmt, b_fmt, out, splitk, shuffled)})
    return [dict(BM=bm, BN=bn, SPLITS=s) for s in (1, 2) for bm, bn in tiles(int(s > 1))]


def heuristic_pick(arch, a_fmt, b_fmt, out, M, N, K, shuffled=0) -> dict:
    """heuristic_config's choice as a config of ``candidates``."""
    c = heuristic_config(arch, a_fmt, b_fmt, out, M, N, K, shuffled)
    return dict(BM=c.variant["BM"], BN=c.variant["BN"], SPLITS=c.options["splits"])


@functools.lru_cache(maxsize=1)
def tuned_table() -> dict:
    """CSV rows keyed (arch, *CSV_KEY) -> list of (M, config, source) by M. Read once."""
    return tuned.by_size(CONFIG_CSV, lambda r: (r["arch"], r["a_format"], r["b_format"], r["out"],
                                                *(int(r[c]) for c in ("shuffled", "N", "K"))),
                         "M", lambda r: {p: int(r[p]) for p in CSV_PARAMS})


def tuned_config(arch, a_fmt, b_fmt, out, M, N, K, shuffled=0):
    """The Choice of the CSV row at the nearest tuned M >= M with the same key, if its config
    is still registered."""
    row = tuned.at_or_above(tuned_table().get((arch, a_fmt, b_fmt, out, shuffled, N, K), ()), M)
    if row is None or row[1] not in candidates(arch, a_fmt, b_fmt, out, shuffled):
        return None
    c = configured(row[1], arch, a_fmt, b_fmt, out, shuffled)
    return Choice(c.kernel, c.variant, f"tuned CSV row M={row[0]} (source={row[2]})", c.options)


CONFIG = ConfigGrammar("mx_gemm", {"BM": int, "BN": int, "SPLITS": int})   # a forced tile and split count


def configured(cfg, arch, a_fmt, b_fmt, out, shuffled=0):
    """The Choice of a config (BM, BN, SPLITS; unset: any registered value, 1 split)."""
    splits = cfg.get("SPLITS", 1)
    if not 1 <= splits <= MAX_SPLITS:
        guards.fail("config", f"SPLITS = {splits} must be in 1..{MAX_SPLITS}")
    if shuffled and splits > 1:
        guards.fail("shuffled-scales", f"SPLITS = {splits}: split-K takes row-major scales (shuffled_scales=False)")
    have = _variants(arch, a_fmt, b_fmt, out, int(splits > 1), shuffled)
    match = [v for v in have if v["BM"] == cfg.get("BM", v["BM"]) and v["BN"] == cfg.get("BN", v["BN"])]
    if not match:
        tiles = sorted({(v["BM"], v["BN"]) for v in have})
        guards.fail("config", f"no {arch} mx_gemm variant {a_fmt} x {b_fmt} -> {out} with SPLITS={splits} and tile "
                              f"{cfg.get('BM')}x{cfg.get('BN')}; registered tiles: {tiles}"
                              + ("" if have or splits == 1 else " (split-K needs out_dtype=torch.float32)"))
    return Choice(KERNEL.name, match[0], "config given by the caller", {"splits": splits})


def _operand(x, x_scale, fmt, name, K=None, shuffled=False) -> int:
    """Checks one operand and its scales; returns K (in elements)."""
    guards.check_dtype(x, name, PAYLOAD[fmt])
    guards.check_dtype(x_scale, f"{name}_scale", E8M0)
    guards.check_shape(x, name, (None, None))
    if fmt in ("e2m3", "e3m2") and x.shape[1] % 3:
        guards.fail("fp6-bytes", f"{name} has {x.shape[1]} bytes per row; {fmt} packs four codes in three bytes")
    k = formats.element_count(x.shape[1], fmt)
    if K is not None and k != K:
        guards.fail("shape", f"{name} has shape {list(x.shape)}: K = {k} ({fmt}), but a has K = {K}")
    guards.check_multiple(k, "K", KERNEL.k_align, f"K%{KERNEL.k_align}")
    if shuffled:       # quant.shuffle_scales: rows padded to 32 (aiter's e8m0_shuffle: 256), columns to 8
        rows, cols = x.shape[0], -(-k // 256) * 8
        guards.check_shape(x_scale, f"{name}_scale", (None, cols))
        if x_scale.shape[0] % 32 or x_scale.shape[0] < rows:
            guards.fail("shuffled-scales", f"{name}_scale has {x_scale.shape[0]} rows; shuffled scales need a "
                                           f"multiple of 32 covering the {rows} rows of {name}")
    else:
        guards.check_shape(x_scale, f"{name}_scale", (x.shape[0], k // MX_BLOCK))
    guards.check_contiguous(x, name)
    guards.check_contiguous(x_scale, f"{name}_scale")
    return k


def _plan(x) -> Plan:
    name = "mx_gemm"
    for n, f in (("a_format", x.a_format), ("b_format", x.b_format)):
        if f not in PAYLOAD:
            guards.fail("format", f"{n} = {f!r}; expected one of {tuple(PAYLOAD)}")
    if (x.a_format, x.b_format) not in PAIRS:
        guards.fail("format", f"a_format x b_format = {x.a_format} x {x.b_format} has no kernel; supported: "
                              + ", ".join(f"{a} x {b}" for a, b in PAIRS))
    if x.out_dtype not in OUT:
        guards.fail("dtype", f"out_dtype = {x.out_dtype}; expected one of {tuple(OUT)}")
    K = _operand(x.a, x.a_scale, x.a_format, "a", shuffled=x.shuffled_scales)
    _operand(x.b, x.b_scale, x.b_format, "b", K, shuffled=x.shuffled_scales)
    M, N = x.a.shape[0], x.b.shape[0]
    guards.check_multiple(N, "N", KERNEL.n_align, f"N%{KERNEL.n_align}")
    if x.out is not None:
        guards.check_dtype(x.out, "out", x.out_dtype)
        guards.check_shape(x.out, "out", (M, N))
        guards.check_contiguous(x.out, "out")
    device = guards.check_same_device(a=x.a, a_scale=x.a_scale, b=x.b, b_scale=x.b_scale, out=x.out)
    out = OUT[x.out_dtype]
    shape = dict(out_shape=(M, N), out_dtype=x.out_dtype)
    if M == 0 or N == 0:
        return empty_plan(name, **shape)
    arch = launcher.backend_for(device, KERNEL.archs)[1]
    cfg = CONFIG.parse(x.config)
    shuffled = int(bool(x.shuffled_scales))
    if cfg is None:
        choice = (tuned_config(arch, x.a_format, x.b_format, out, M, N, K, shuffled)
                  or heuristic_config(arch, x.a_format, x.b_format, out, M, N, K, shuffled))
    else:
        choice = configured(cfg, arch, x.a_format, x.b_format, out, shuffled)
    variant, splits, why = choice.variant, choice.options["splits"], choice.why
    # The kernel rebases every buffer to its tile: a 32-bit voffset spans BM (BN) rows.
    for n, rows, row_bytes in (("a", variant["BM"], x.a.shape[1]), ("b", variant["BN"], x.b.shape[1]),
                               ("out", variant["BM"], N * x.out_dtype.itemsize)):
        if rows * row_bytes >= guards.VOFFSET_LIMIT:
            guards.fail("2GB-voffset", f"one {rows}-row tile of {n} spans {rows * row_bytes} bytes; the kernel's "
                                       f"32-bit tile offsets need < {guards.VOFFSET_LIMIT}")
    plan = kernel_plan(name, KERNEL.name, variant, device,
                    f"{x.a_format} x {x.b_format} -> {out}, {variant['BM']}x{variant['BN']} tile, "
                    f"{splits} K split{'s' if splits > 1 else ''} ({why})",
                    M=M, N=N, K=K, splits=splits, **shape)
    plan.zero_out = bool(variant["SPLITK"])
    return plan


@op(plan=_plan, alloc=torch.empty, convert={"config": CONFIG.text},
    out_shape=lambda x: ((x.a.shape[0], x.b.shape[0]), x.out_dtype))
def mx_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
            a_format: str = "e4m3", b_format: str = "e4m3", out_dtype: torch.dtype = torch.bfloat16,
            out: torch.Tensor | None = None, config: str = "", shuffled_scales: bool = False) -> torch.Tensor:
    """MX GEMM: out[m, n] = sum_k A[m, k] * B[n, k] * 2^(a_scale[m, k/32] - 127) * 2^(b_scale[n, k/32] - 127).

    a: [M, K] (a_format e4m3 / e5m2: that torch float8 dtype or uint8 codes), [M, 3K/4] (e2m3 /
       e3m2: uint8, four codes in three bytes as a little-endian 6-bit string, formats.pack_fp6)
       or [M, K/2] (e2m1: packed two per byte, even k in the low nibble; uint8 or float4_e2m1fn_x2).
    b: [N, K] / [N, 3K/4] / [N, K/2] likewise (weights, K contiguous, natural layout).
    a_scale [M, K/32], b_scale [N, K/32]: e8m0 (uint8 or float8_e8m0fnu).
    shuffled_scales=True: both scales pre-shuffled (mxgemm.quant.shuffle_scales; the layout of aiter's
       e8m0_shuffle and of Triton's CDNA4 block-scaled tutorial), [R, ceil(K/256) * 8] with R a
       multiple of 32 >= the rows (a Triton-style [R/32, K] tensor is a .view away); gfx950, bf16
       out, e4m3 x e4m3, e2m1 x e2m1 and e4m3 x e2m1, no split-K. Each MMA lane then reads its
       scales of two 16-row tiles and two K steps as one dword, and the scale lines a workgroup
       reads are whole (docs/peers/mx_gemm.md times both layouts).
    Format pairs on gfx950: every a_format x b_format of e4m3, e5m2 (MXFP8), e2m3, e3m2 (MXFP6) and
    e2m1 (MXFP4), mixes included (e4m3 x e2m1: A8W4); pairs with FP6 only at the 64 x 64 tile; on
    gfx1250 every pair of e4m3, e5m2 and e2m1 (no FP6).
    out_dtype bf16 / f16 (RNE of the fp32 accumulator) or f32; out: optional [M, N] of it.
    Any M >= 1, N % 32 == 0, K % 128 == 0 (rows and columns past the tile edges are masked).
    Numerics: each 128-wide K step is summed exactly and rounded once to fp32, then added to
    the fp32 accumulator in K order (mxgemm.reference.mx_gemm_ref(chunk=128)).
    config: {"BM": 64, "BN": 64, "SPLITS": 2} (or "BM=64,BN=64,SPLITS=2") forces a registered
    tile and a K split; SPLITS > 1 needs out_dtype=torch.float32 (fp32 atomics into out, zeroed
    first; bit-reproducible for SPLITS <= 2, arrival order decides the last bits above).
    """
