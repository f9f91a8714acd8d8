"""smallm_mxfp8_gemm: decode-regime (small-M) MXFP8 GEMM on gfx950, bf16 out.

Kernels (registry): smallm_mxfp8_gemv and smallm_mxfp8_mfma (csrc/kernels/smallm_mxfp8.hip);
their M envelopes and K alignments are registry facts. Kernel choice (``mxgemm.explain``
prints it): a tuned CSV row for (arch, M, N, K) if one exists (exact M, else the nearest tuned
M above with the same N, K), else the rule of ``heuristic_config``. A row may name the prefill
kernel mx_gemm (ops/dense_mx.py, its BM x BN tile), which the tuner also times where it takes
the shape (K % 128, N % 32); M above the small-M envelope runs mx_gemm by rule. Other
out-of-envelope calls run the fallback of ``ops/_mxfp8.py`` unless ``fallback="error"``.
Malformed calls (dtype, shape, K % 32, contiguity, device) always raise, before any launch.
"""
from __future__ import annotations

import functools

import torch

from .. import guards, launcher, registry, tuned
from . import _mxfp8 as mx
from . import dense_mx
from ._op import NUM_CUS, Choice, ConfigGrammar, Plan, empty_plan, op

GEMV, MFMA, DENSE = "smallm_mxfp8_gemv", "smallm_mxfp8_mfma", dense_mx.KERNEL.name
_GEMV, _MFMA = registry.get(GEMV), registry.get(MFMA)
ARCH, = set(_GEMV.archs) | set(_MFMA.archs)   # the family's one arch: the CSV is tuned for it
CONFIG_CSV = tuned.table_path("smallm_mxfp8", ARCH)
# variant columns of the CSV (blank = unset); BM, BN: an mx_gemm row's tile
CSV_PARAMS = ("M_TILE", "N_SUB", "SPLIT_K", "K_LANES", "BM", "BN")
# a tuner's row: the config and its time; simulated rows also carry the runner-up's and the peer's
CSV_FIELDS = ("arch", "M", "N", "K", "kernel", *CSV_PARAMS, "us", "source", "runner_up", "runner_up_us", "peer_us")
M_MAX = max(_GEMV.m_range[1], _MFMA.m_range[1])


# ------------------------------------------------------------------------------------------
# Config choice
# ------------------------------------------------------------------------------------------
def _at_least(x: int, choices) -> int:
    return next(c for c in choices if c >= x)


def heuristic_config(M: int, N: int, K: int):
    """The Choice for a dense shape, or None when no kernel serves it.

    Rule (read off the tuned shapes of the timing model, `docs/performance.md` section 1;
    op_tests/tune_smallm_mxfp8.py replaces it with measurements on an MI355X):
      * K not MFMA-aligned (K % 128) within the GEMV's envelope (M <= 16), or M <= 2 where the
        MFMA kernel's split-4 grid (N / 16 workgroups) gives under half a workgroup per CU:
        GEMV. (Its VALU work grows with M while the weight stream does not; from M = 4 the
        scaled MFMA, whose 16-row tile costs the same at any M, was ahead in every tuned shape,
        and at M 1-2 wherever its grid reached half the CUs.) M_TILE = the smallest tile >= M;
        N_SUB = 2 (two weight rows per lane group, reusing the decoded A block) once N gives at
        least 2 workgroups per CU with it; else, when 16 lanes per row leave under 1.5
        workgroups per CU and K gives each of 64 lanes at least 2 MX blocks (K >= 4096),
        K_LANES = 64 (4 rows per workgroup, 4x the workgroups) where the tile has it; else
        N_SUB = 1.
      * above the GEMV's envelope (M > 16), where mx_gemm takes the shape and its tile at the
        smallest BM >= M gives every CU a workgroup (N / 64 >= 256 at 64 x 64): mx_gemm. (Read
        off the tuned shapes: at 28672 x 4096 mx_gemm took 22.43 / 24.79 us at M 32 / 64, the
        MFMA kernel 28.09 / 47.08, its M_TILE 32 / 64 waves limited by L1; at M 16 the MFMA
        kernel was ahead, 20.25 against 21.65, and with 128 / 144 tiles, N 8192 / 9216, too.)
      * else, K % 128 == 0: MFMA, M_TILE = the smallest tile >= M, halved while the split-4 grid at
        the half tile (N / 16 x row blocks) still gives no CU a second workgroup (narrow layers:
        more row blocks, more weight loads in flight; 64 x 768 x 6144 10.91 -> 4.71 us at M_TILE
        16), SPLIT_K = the largest
        registered split (a narrower column block per workgroup and more workgroups per CU keep
        more weight loads in flight), halved at M_TILE >= 32 where the split-4 grid gives some
        CU a second workgroup and the split-2 grid none (each 16-column block re-reads the A
        tile, and half the blocks halve those reads, at no cost in balance), and capped by the
        number of 128-wide K steps so no wave idles.
    """
    if M < _GEMV.m_range[0] or M > M_MAX or K % _GEMV.k_align:
        return None
    mfma_grid = N // (_MFMA.tile({"M_TILE": 16, "SPLIT_K": max(_MFMA.values("SPLIT_K"))})["N"])
    if (K % _MFMA.k_align and M <= _GEMV.m_range[1]) or (M <= 2 and 2 * mfma_grid < NUM_CUS):
        m_tile = _at_least(M, _GEMV.values("M_TILE"))
        variant = {"M_TILE": m_tile, "N_SUB": 1}
        if {"M_TILE": m_tile, "N_SUB": 2} in _GEMV.variants and N >= 2 * NUM_CUS * 32:
            variant["N_SUB"] = 2
        elif 2 * N < 3 * NUM_CUS * 16 and K >= 64 * 2 * 32 and variant | {"K_LANES": 64} in _GEMV.variants:
            variant["K_LANES"] = 64
        return Choice(GEMV, variant, "heuristic: GEMV (K % 128 != 0, or M <= 2 and the MFMA grid under half "
                                     "the CUs)")
    if K % _MFMA.k_align:
        return None
    dense = _dense_tiles(M, N, K)
    if M > _GEMV.m_range[1] and dense and N // dense[0]["BN"] * -(-M // dense[0]["BM"]) >= NUM_CUS:
        return choice_of(DENSE, dense[0], f"heuristic: mx_gemm (M > {_GEMV.m_range[1]}, its {dense[0]['BM']} x "
                                          f"{dense[0]['BN']} tiles fill the {NUM_CUS} CUs)")
    m_tile = _at_least(M, _MFMA.values("M_TILE"))
    while m_tile > min(_MFMA.values("M_TILE")) and mfma_grid * -(-M // (m_tile // 2)) <= NUM_CUS:
        m_tile //= 2
    split = max(_MFMA.values("SPLIT_K"))
    if m_tile >= 32 and mfma_grid > NUM_CUS >= mfma_grid // 2:
        split //= 2
    while split > 1 and split > K // _MFMA.k_align:
        split //= 2
    return Choice(MFMA, {"M_TILE": m_tile, "SPLIT_K": split}, "heuristic: scaled MFMA (K % 128 == 0)")


def _variant_of(row: dict) -> dict:
    return {k: int(row[k]) for k in CSV_PARAMS if row.get(k)}


# The M of a tuned (N, K)'s rows; a call takes the nearest at or above its own. The M_TILE
# boundaries, and 40 / 48: at M 33-48 a tile below the M 64 row's can be the best.
TUNED_MS = (1, 2, 4, 8, 16, 32, 40, 48, 64)


@functools.lru_cache(maxsize=1)
def tuned_table() -> dict:
    """CSV rows keyed (arch, N, K) -> list of (M, (kernel, variant), source) by M. Read once."""
    return tuned.by_size(CONFIG_CSV, lambda r: (r["arch"], int(r["N"]), int(r["K"])), "M",
                         lambda r: (r["kernel"], _variant_of(r)))


def serves(kernel: str, M: int, K: int) -> bool:
    k = registry.get(kernel)
    lo, hi = k.m_range or (1, M)
    return lo <= M <= hi and K % k.k_align == 0


def _dense_tiles(M: int, N: int, K: int) -> list:
    """mx_gemm's bf16 e4m3 tiles at the smallest BM >= M (past the largest BM: at it), where it
    takes the shape; [] where it does not."""
    if K % dense_mx.KERNEL.k_align or N % dense_mx.KERNEL.n_align:
        return []
    tiles = [(c["BM"], c["BN"]) for c in dense_mx.candidates(ARCH, "e4m3", "e4m3", "bf16") if c["SPLITS"] == 1]
    bms = sorted({bm for bm, _ in tiles})
    bm = _at_least(min(M, bms[-1]), bms)
    return [{"BM": bm, "BN": bn} for b, bn in tiles if b == bm]


def candidates(M: int, N: int, K: int) -> list:
    """(kernel, variant) pairs a tuner times for a shape: every kernel serving it, at its smallest
    M_TILE (mx_gemm: BM) >= M (a larger tile does the same rows' work and more) with each value of
    the others; the MFMA kernel also at every smaller M_TILE (more row blocks: more workgroups for
    narrow layers)."""
    out = []
    for kernel in (GEMV, MFMA):
        if serves(kernel, M, K):
            k = registry.get(kernel)
            m_tile = _at_least(M, k.values("M_TILE"))
            out += [(kernel, v) for v in k.variants
                    if v["M_TILE"] == m_tile or (kernel == MFMA and v["M_TILE"] < m_tile)]
    return out + [(DENSE, v) for v in _dense_tiles(M, N, K)]


def choice_of(kernel: str, variant: dict, why: str) -> Choice:
    """The Choice running ``kernel`` at ``variant`` (mx_gemm: a tile, resolved by ops/dense_mx.py)."""
    if kernel != DENSE:
        return Choice(kernel, variant, why)
    c = dense_mx.configured(variant, ARCH, "e4m3", "e4m3", "bf16")
    return Choice(c.kernel, c.variant, why, c.options)


def tuned_config(M: int, N: int, K: int, arch: str = ARCH):
    """The Choice of the CSV row for the nearest tuned M >= M with the same (N, K), if its kernel
    serves M."""
    row = tuned.at_or_above(tuned_table().get((arch, N, K), ()), M)
    if row is None or not serves(row[1][0], M, K):
        return None
    (kernel, variant), m = row[1], row[0]
    return choice_of(kernel, variant, f"tuned CSV row M={m} N={N} K={K} (source={row[2]})")


CONFIG = ConfigGrammar("smallm_mxfp8_gemm", {"kernel": str, **{p: int for p in CSV_PARAMS}})


def parse_config(config) -> tuple | None:
    """A forced kernel, "kernel=smallm_mxfp8_gemv,M_TILE=4,N_SUB=1" or the same as a dict ->
    (kernel, variant)."""
    cfg = CONFIG.parse(config)
    if cfg is None:
        return None
    kernel = cfg.pop("kernel", None)
    if kernel not in (GEMV, MFMA, DENSE):
        guards.fail("config", f"config kernel must be {GEMV!r}, {MFMA!r} or {DENSE!r}; got {kernel!r}")
    if kernel == DENSE:
        if not set(cfg) <= {"BM", "BN"}:
            guards.fail("config", f"an {DENSE} config takes BM and BN (its tile); got {cfg}")
        dense_mx.configured(cfg, ARCH, "e4m3", "e4m3", "bf16")
    elif cfg not in registry.get(kernel).variants:
        guards.fail("config", f"{kernel} has no variant {cfg}; registered: {list(registry.get(kernel).variants)}")
    return kernel, cfg


# ------------------------------------------------------------------------------------------
# Plan
# ------------------------------------------------------------------------------------------
def _plan(x) -> Plan:
    name = "smallm_mxfp8_gemm"
    mx.check_fallback_mode(x.fallback)
    K = mx.check_mx_operand(x.a, x.a_scale, "a", 2)
    mx.check_mx_operand(x.b, x.b_scale, "b", 2, K)
    M, N = x.a.shape[0], x.b.shape[0]
    mx.check_out(x.out, (M, N), (torch.bfloat16,))
    device = guards.check_same_device(a=x.a, a_scale=x.a_scale, b=x.b, b_scale=x.b_scale, out=x.out)
    shape = dict(out_shape=(M, N), out_dtype=torch.bfloat16)
    dims = dict(M=M, N=N, K=K)
    if M == 0 or N == 0:
        return empty_plan(name, **shape)
    forced = parse_config(x.config)
    if forced is not None:
        kernel, variant = forced
        k = registry.get(kernel)
        if k.m_range and not k.m_range[0] <= M <= k.m_range[1]:
            guards.fail("M-range", f"M = {M} is outside {kernel}'s envelope [{k.m_range[0]}, {k.m_range[1]}]")
        guards.check_multiple(K, "K", k.k_align, f"K%{k.k_align}")
        if kernel == DENSE:
            guards.check_multiple(N, "N", k.n_align, f"N%{k.n_align}")
        choice = choice_of(kernel, variant, "config given by the caller")
    else:
        choice = tuned_config(M, N, K) or heuristic_config(M, N, K)
        if choice is None and M > M_MAX and _dense_tiles(M, N, K):
            big = dense_mx.heuristic_config(launcher.backend_for(device, dense_mx.KERNEL.archs)[1],
                                            "e4m3", "e4m3", "bf16", M, N, K)
            choice = Choice(big.kernel, big.variant, f"routed to mx_gemm: M = {M} is outside the small-M kernels' "
                            f"envelope [{_GEMV.m_range[0]}, {M_MAX}] ({big.why})", big.options)
        if choice is None:
            if M > M_MAX:
                return mx.envelope(x.fallback, name, "M-range", f"M = {M} is outside the small-M kernels' "
                                   f"envelope [{_GEMV.m_range[0]}, {M_MAX}] and mx_gemm needs K % "
                                   f"{dense_mx.KERNEL.k_align} == 0, N % {dense_mx.KERNEL.n_align} == 0 "
                                   f"(K = {K}, N = {N})", **shape)
            return mx.envelope(x.fallback, name, f"K%{_MFMA.k_align}",
                               f"M = {M} > {_GEMV.m_range[1]} needs the MFMA kernel, which requires "
                               f"K % {_MFMA.k_align} == 0; K = {K}", **shape)
    named = (("a", x.a), ("a_scale", x.a_scale), ("b", x.b), ("b_scale", x.b_scale), ("out", x.out))
    return mx.kernel_or_fallback(x.fallback, name, named, choice.kernel, choice.variant, device, choice.why,
                                 **dims, **choice.options, **shape)


def _fallback(x, plan) -> None:
    x.out.copy_(mx.dequant(x.a, x.a_scale) @ mx.dequant(x.b, x.b_scale).T)


@op(plan=_plan, fallback=_fallback, alloc=torch.empty, convert={"config": CONFIG.text},
    out_shape=lambda x: ((x.a.shape[0], x.b.shape[0]), torch.bfloat16))
def smallm_mxfp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
                      out: torch.Tensor | None = None, config: str = "", fallback: str = "auto") -> torch.Tensor:
    """Decode-regime MXFP8 GEMM: out[m, n] = sum_k A[m, k] * B[n, k] with 1x32 e8m0 K-block
    scales, fp32 accumulation, bf16 (RNE) output.

    a: [M, K] float8_e4m3fn, a_scale: [M, K/32] uint8 | float8_e8m0fnu
    b: [N, K] float8_e4m3fn (weights, K contiguous), b_scale: [N, K/32]
    out: optional [M, N] bf16 (contiguous), written in place and returned.
    config: force a kernel, e.g. {"kernel": "smallm_mxfp8_gemv", "M_TILE": 4, "N_SUB": 1} or
    {"kernel": "mx_gemm", "BM": 64, "BN": 64}.
    fallback: "auto" runs dequantise + torch matmul outside the kernels' envelope (K % 128 != 0
    with M > 16, non-gfx950 device, a tensor >= 2 GB); "error" raises instead.
    Kernels: GEMV for M <= 16 (K % 32 == 0), scaled MFMA for M <= 64 (K % 128 == 0),
    mx_gemm for M > 64, for M > 16 where its 64 x 64 tiles fill the CUs and where a tuned row
    names it (K % 128 == 0, N % 32 == 0; bitwise
    mx_gemm_ref(chunk=128) on the emulator, the others bitwise smallm_mxfp8_gemm_ref).
    """
