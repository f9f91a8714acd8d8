"""Performance model of every registered kernel: ``python -m mxgemm perf``.

Nobody here can time an MI355X, so this is a model, and says so. Per (kernel, variant, shape):
FLOPs, compulsory bytes (inputs once, output once; atomics read and write it), arithmetic
intensity and the roofline time from ``isa.LIMITS`` (docs/perf_model.md §1); the launch shape
(workgroups, resident workgroups per CU from the kernel's registers and LDS, the waves of
workgroups and how full the last one is); the hot loop read from the kernel's own assembly
(``hot_loop``: instructions per iteration by the emulator's classes, MFMA cycles from
``isa.mfma_cycles``, other issue cycles, global and LDS bytes, waits); and a predicted time with
the factor that limits it (docs/perf_model.md §3). Published numbers of the peers are facts
of their sources, printed beside the model, never derived from it.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from . import isa, registry
from .emu.isa import base_mnemonic
from .emu.stats import classify

VALU_CYCLES = 4        # a wave64 vector instruction on a 16-lane SIMD (docs/perf_model.md §2)
OTHER_ISSUE_CYCLES = 1  # scalar, branch, wait and memory-issue instructions (their data: bytes, latency)


# ---- the hot loop, from the kernel's assembly ----
@dataclass
class LoopProfile:
    """One iteration of the hot loop, for one wave (bytes at a full 64-lane EXEC)."""
    counts: Counter                  # emulator class -> instructions (mxgemm.emu.stats.classify)
    bytes: Counter                   # memory class -> bytes
    mfma_cycles: float
    issue_cycles: float              # every instruction but MFMA
    waits: int                       # s_waitcnt
    drains_vm: bool                  # an s_waitcnt vmcnt(0): the loop waits for its own loads
    in_loop: bool = True             # False: the kernel has no loop, the profile is its whole body
    lines: list = field(default_factory=list)

    @property
    def global_bytes(self) -> int:
        return sum(v for c, v in self.bytes.items() if c.startswith("vmem_"))

    @property
    def lds_bytes(self) -> int:
        return sum(v for c, v in self.bytes.items() if c.startswith("lds_") or c == "vmem_load_lds")


def _innermost(ranges):
    return [r for r in ranges if not any(o != r and o.start >= r.start and o.stop <= r.stop for o in ranges)]


def hot_loop(asm: str, symbol: str, arch: str = "gfx950") -> LoopProfile:
    """The innermost loop with the most MFMAs (then memory instructions, then length); a kernel
    without a loop is profiled whole, as one iteration."""
    lines = [x.split(";")[0].strip() for x in asm.splitlines()]
    keep = lambda s: s and not s.endswith(":") and not s.startswith(".")  # noqa: E731
    bodies = [[lines[i] for i in r if keep(lines[i])] for r in _innermost(isa.loops(asm, symbol))]

    def rank(body):
        cls = [classify(base_mnemonic(l.split()[0]))[0] for l in body]
        return (cls.count("mfma"), sum(c.startswith(("vmem", "lds")) for c in cls), len(body))
    body = max(bodies, key=rank) if bodies else isa.body(asm, symbol)
    counts, nbytes, mfma, issue = Counter(), Counter(), 0.0, 0.0
    wave = isa.LIMITS[arch]["wave_size"]
    for l in body:
        base = base_mnemonic(l.split()[0])
        cls, per_lane = classify(base, bool(re.search(r"\slds\b", l)) and base.startswith("buffer_load"))
        counts[cls] += 1
        if per_lane:
            nbytes[cls] += per_lane * wave
        if cls == "mfma":
            mfma += isa.mfma_cycles(l, arch)
        else:
            issue += VALU_CYCLES if cls == "valu" else OTHER_ISSUE_CYCLES
    return LoopProfile(counts, nbytes, mfma, issue, counts["waitcnt"],
                       any(l.startswith("s_waitcnt") and "vmcnt(0)" in l for l in body), bool(bodies), body)


@lru_cache(maxsize=1)
def _llvm_mca() -> str | None:
    """An llvm-mca of LLVM 22 or newer on PATH (older ones have no gfx950 model), else None."""
    for name in ("llvm-mca", "llvm-mca-24", "llvm-mca-23", "llvm-mca-22"):
        exe = shutil.which(name)
        if exe:
            ver = re.search(r"version (\d+)", subprocess.run([exe, "--version"], capture_output=True, text=True).stdout)
            if ver and int(ver.group(1)) >= 22:
                return exe
    return None


def llvm_mca_cycles(body: list[str], arch: str = "gfx950") -> str:
    """llvm-mca's cycle estimate of one loop iteration (its back-edge branch left out)."""
    exe = _llvm_mca()
    if exe is None:
        return "no llvm-mca"
    p = subprocess.run([exe, "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={arch}", "--iterations=1"],
                       input="\n".join(l for l in body if not l.startswith("s_cbranch")), capture_output=True,
                       text=True)
    total = re.search(r"Total Cycles:\s+(\d+)", p.stdout)
    return total.group(1) if total else "llvm-mca failed"


# ---- the work of one case ----
@dataclass
class Work:
    """What one (kernel, variant, shape) does: counted by the model, cross-checked on the emulator."""
    flops: float
    bytes: float                     # compulsory: inputs once, output once (atomics: read + write)
    rate: str                        # LIMITS peak_tflops key of the roofline
    grid: tuple                      # launch grid
    live_wgs: int                    # workgroups that do work (the rest exit at once)
    wave_iterations: int             # hot-loop iterations summed over every wave of the launch
    serial_iterations: int           # hot-loop iterations one workgroup runs one after another


def _mx_bytes(rows, k, bits):        # payload + e8m0 scales (one per 32)
    return rows * k * bits // 8 + rows * (k // 32)


def _grid(kernel, variant, **dims):
    return registry.get(kernel).launch_grid(variant, **dims)


@lru_cache(maxsize=None)
def tile_k_per_iteration(kernel: str, variant_items: tuple, tile_m: int, tile_n: int) -> int:
    """K one hot-loop iteration of one wave covers in an MFMA tile kernel, read from its assembly:
    the loop's MFMAs (sum of m x n x k) over the wave's share of the tile_m x tile_n output."""
    from .build import artifact
    art = artifact(kernel, dict(variant_items))
    loop = hot_loop(art.asm, art.symbol)
    mnk = sum(math.prod(map(int, isa.MFMA_SHAPE.search(l.split()[0]).groups())) for l in loop.lines
              if classify(base_mnemonic(l.split()[0]))[0] == "mfma")
    return mnk * _waves(kernel) // (tile_m * tile_n)


def _k_iter(kernel, v, tile_m, tile_n):
    return tile_k_per_iteration(kernel, tuple(sorted(v.items())), tile_m, tile_n)


def _waves(kernel, arch="gfx950"):
    return -(-registry.get(kernel).threads_for(arch) // isa.LIMITS[arch]["wave_size"])


def work_smallm(kernel, v, M, N, K):
    grid = _grid(kernel, v, N=N, M=M)
    wgs = grid[0] * grid[1]
    # GEMV: 16 lanes split a row's K blocks (32 wide); MFMA: SPLIT_K waves share 128-wide K steps
    iters = -(-K // 512) if kernel.endswith("gemv") else -(-K // (128 * v["SPLIT_K"]))
    return Work(2.0 * M * N * K, _mx_bytes(M, K, 8) + _mx_bytes(N, K, 8) + 2 * M * N, "fp8", grid, wgs,
                wgs * _waves(kernel) * iters, iters)


def _routing(tokens, topk, experts, block_m, seed=0):
    """Seeded uniform routing (distinct experts per token) -> (sorted layout, rows, active experts)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)])
    from .routing import moe_sorting
    srt = moe_sorting(ids, torch.ones(tokens, topk), experts, block_m=block_m)
    return srt, int(ids.unique().numel())


def work_moe_mxfp8(kernel, v, tokens, topk, experts, N, K, block_m=16):
    srt, active = _routing(tokens, topk, experts, block_m)
    n_valid = int(srt.num_valid_ids[0])
    blocks = srt.sorted_expert_ids.numel()
    ids = srt.sorted_token_ids[:n_valid].view(-1, block_m) & 0xFFFFFF
    live = (ids < tokens).view(n_valid // block_m, -1, v["M_CHUNK"]).any(2)   # chunks with a real row
    grid = _grid(kernel, v, N=N, blocks=blocks)
    iters = -(-K // (32 * 256 // v["BLOCK_N"]))                  # 256 / BLOCK_N lanes per weight row
    rows = tokens * topk
    return Work(2.0 * rows * N * K, _mx_bytes(tokens, K, 8) + _mx_bytes(active * N, K, 8) + 2 * n_valid * N,
                "fp8", grid, grid[0] * (n_valid // block_m), grid[0] * _waves(kernel) * int(live.sum()) * iters,
                iters * int(live.sum(1).max()))


def work_a4w4(kernel, v, tokens, topk, experts, N, K):
    srt, active = _routing(tokens, topk, experts, v["BM"])
    n_valid = int(srt.num_valid_ids[0])
    grid = _grid(kernel, v, N=N, blocks=srt.sorted_expert_ids.numel())
    live = grid[0] * (n_valid // v["BM"])
    iters = -(-K // _k_iter(kernel, v, v["BM"], 256))     # a workgroup owns BM rows x 256 columns
    rows = tokens * topk
    return Work(2.0 * rows * N * K, _mx_bytes(rows, K, 4) + _mx_bytes(active * N, K, 4) + 2 * 2 * tokens * N,
                "mxfp4", grid, live, live * _waves(kernel) * iters, iters)


def work_deep_gemm(kernel, v, groups, m, N, K):
    m_tiles = groups * -(-m // v["BM"])
    grid = _grid(kernel, v, N=N, m_tiles=m_tiles)
    wgs = grid[0] * grid[1]
    iters = -(-K // _k_iter(kernel, v, v["BM"], v["BN"]))
    rows = groups * m
    scales = rows * (K // 128) * (1 if v["UE8M0"] else 4) + groups * -(-N // 128) * (K // 128) * 4
    return Work(2.0 * rows * N * K, rows * K + groups * N * K + scales + 2 * rows * N, "fp8", grid, wgs,
                wgs * _waves(kernel) * iters, iters)


def work_grouped_fp8(kernel, v, groups, m, N, K):
    """Forward NT / dgrad NN: groups of m rows; wgrad TN: groups of m contraction rows, out [G, N, K]
    read as [G, M=N, N=K] by the op (the preset passes the wgrad's own M, N)."""
    tiles = groups * -(-m // v["BM"]) * -(-N // v["BN"]) if v["LAYOUT"] != "TN" else \
        groups * -(-N // v["BM"]) * -(-K // v["BN"])
    bound = (-(-groups * m // v["BM"]) + groups) * -(-N // v["BN"]) if v["LAYOUT"] != "TN" else tiles
    grid = _grid(kernel, v, grid=bound)
    if v["LAYOUT"] == "TN":          # per group: out[N, K] (the op's M, N) += a_g^T b_g over m rows
        flops, nbytes = 2.0 * groups * m * N * K, groups * m * (N + K) + 2 * groups * N * K
        iters = -(-m // _k_iter(kernel, v, v["BM"], v["BN"]))   # the contraction runs over the m rows
    else:
        flops, nbytes = 2.0 * groups * m * N * K, groups * m * K + groups * N * K + 2 * groups * m * N
        iters = -(-K // _k_iter(kernel, v, v["BM"], v["BN"]))

    return Work(flops, nbytes, "fp8", grid, tiles, tiles * _waves(kernel) * iters, iters)


_MX_BITS = {"e4m3": 8, "e5m2": 8, "e2m1": 4}


def work_mx_gemm(kernel, v, M, N, K, splits=1):
    """MX GEMM: BM x BN tiles, ``splits`` K ranges along grid z (fp32 atomics: out read + written)."""
    grid = _grid(kernel, v, M=M, N=N, splits=splits)
    wgs = grid[0] * grid[1] * grid[2]
    iters = -(-K // splits // _k_iter(kernel, v, v["BM"], v["BN"]))
    out_bytes = {"bf16": 2, "f16": 2, "f32": 4}[v["OUT"]] * (2 if splits > 1 else 1)
    rate = "mxfp4" if v["A_FMT"] == v["B_FMT"] == "e2m1" else "fp8"    # the slower operand sets the rate
    return Work(2.0 * M * N * K, _mx_bytes(M, K, _MX_BITS[v["A_FMT"]]) + _mx_bytes(N, K, _MX_BITS[v["B_FMT"]])
                + out_bytes * M * N, rate, grid, wgs, wgs * _waves(kernel) * iters, iters)


def work_dequant(kernel, v, M, K):
    grid = _grid(kernel, v, elements=M * K)
    return Work(0.0, M * K + M * K // 32 + 4 * M * K, "fp8", grid, grid[0], grid[0] * _waves(kernel), 1)


WORK = {"smallm_mxfp8_gemv": work_smallm, "smallm_mxfp8_mfma": work_smallm,
        "smallm_mxfp8_moe_grouped_gemm": work_moe_mxfp8,
        "moe_gemm2_a4w4": work_a4w4, "moe_gemm2_a4w4_flydsl": work_a4w4,
        "deep_gemm_fp8": work_deep_gemm, "grouped_gemm_fp8": work_grouped_fp8,
        "mx_gemm": work_mx_gemm, "mxfp8_dequant": work_dequant, "mxfp8_dequant_flydsl": work_dequant}


# ---- cases and presets ----
@dataclass
class Case:
    kernel: str
    variant: dict
    shape: dict                      # keyword arguments of the kernel's WORK function
    label: str
    published: str = "not found"     # the peer's published number, with its unit
    source: str = "not found"        # where it was published


# The seed's decode shapes: MiniMax-M3 (hidden 6144) qkv / gate_up / o_proj / down per GPU at TP1..8,
# (K, N) as in aiter's op_tests/tune_smallm_mxfp8.py (PR #3783); TP1's gate_up and down are both 6144 x 6144.
MINIMAX_M3_LINEARS = {
    1: {"qkv": (6144, 9216), "gate_up/down": (6144, 6144), "o_proj": (8192, 6144)},
    2: {"qkv": (6144, 4608), "gate_up": (6144, 3072), "o_proj": (4096, 6144), "down": (3072, 6144)},
    4: {"qkv": (6144, 2304), "gate_up": (6144, 1536), "o_proj": (2048, 6144), "down": (1536, 6144)},
    8: {"qkv": (6144, 1152), "gate_up": (6144, 768), "o_proj": (1024, 6144), "down": (768, 6144)},
}
# aiter's tuned table (aiter/configs/smallm_mxfp8_tuned.csv, ROCm/aiter): for the TP4 shapes, whether its
# HIP kernel beat the Triton dot_scaled fallback by > 3% (use_hip). The microseconds behind it were not found.
AITER_USE_HIP_TP4 = {(6144, 2304): "1111111", (2048, 6144): "1111110", (6144, 1536): "1111111",
                     (1536, 6144): "1111111"}   # one digit per M in 1, 2, 4, 8, 16, 32, 64
_SMALLM_MS = (1, 2, 4, 8, 16, 32, 64)
_AITER_SMALLM = "aiter PR #3783: HIP/Triton us not found"


def _smallm_published(K, N, M):
    flags = AITER_USE_HIP_TP4.get((K, N))
    if flags is None:
        return "not found", _AITER_SMALLM
    won = flags[_SMALLM_MS.index(M)] == "1"
    return f"HIP {'>' if won else '<='} Triton+3%", "aiter smallm_mxfp8_tuned.csv (use_hip); us not found"


def preset_smallm():
    from .ops.smallm_mxfp8 import heuristic_config, tuned_config
    out = []
    for tp, linears in MINIMAX_M3_LINEARS.items():
        for name, (K, N) in linears.items():
            for M in _SMALLM_MS:
                kernel, variant, _ = tuned_config(M, N, K) or heuristic_config(M, N, K)
                out.append(Case(kernel, variant, dict(M=M, N=N, K=K), f"M3 {name} TP{tp} M={M}",
                                *_smallm_published(K, N, M)))
    return out


KIMI_K25 = dict(experts=385, N=7168, K=512, topk=9)   # KIMI-K2.5 MoE: E=385, hidden 7168, inter 512, top-9


def preset_a4w4():
    return [Case(kernel, {"BM": bm, "NT": 0}, dict(tokens=M, **KIMI_K25), f"KIMI-K2.5 gemm2 M={M} BM{bm}",
                 "not found", "aiter Kimi-K2.5 fused_moe configs (PR #2619): no latencies found")
            for M in (4, 16, 64, 256) for bm in (16, 32) for kernel in ("moe_gemm2_a4w4", "moe_gemm2_a4w4_flydsl")]


def preset_moe_mxfp8():
    """MiniMax-M3 MoE at TP4 (128 experts, top-4): gemm1 (gate_up, N 1536, K 6144) and gemm2 (N 6144,
    K 768). aiter's wrapper lists where its kernel beat Triton on MI355X (_MOE_ALLOWLIST, routed rows)."""
    wins = {1536: "beats Triton for 4..16 routed rows", 6144: "beats Triton for 4..8 routed rows"}
    return [Case("smallm_mxfp8_moe_grouped_gemm", {"BLOCK_N": 16, "M_CHUNK": 4},
                 dict(tokens=T, topk=4, experts=128, N=N, K=K), f"M3 TP4 {name} T={T}", wins[N],
                 "aiter smallm_gemm_mxfp8.py _MOE_ALLOWLIST (PR #3783); us not found")
            for name, N, K in (("gemm1", 1536, 6144), ("gemm2", 6144, 768)) for T in (1, 2, 4, 16)]


def _grouped_variant(layout, m, N):
    """The planner's untuned tile for m rows per group (NT / NN) or m output rows (TN)."""
    from .ops.grouped_fp8 import heuristic_config
    cfg = heuristic_config(layout, 1, m, N)
    return registry.find_variant(registry.get("grouped_gemm_fp8"), LAYOUT=layout, FMT="e4m3", FMT_B="e4m3",
                                 OUT="bf16", BM=cfg["BM"], BN=cfg["BN"])


def preset_grouped_fp8():
    # DeepSeek-V3 MoE (hidden 7168, inter 2048) with 8 local experts of 4096 routed rows each
    out = []
    for name, N, K in (("gemm1", 2 * 2048, 7168), ("gemm2", 7168, 2048)):
        for layout, (n, k) in (("NT", (N, K)), ("NN", (K, N))):
            out.append(Case("grouped_gemm_fp8", _grouped_variant(layout, 4096, n),
                            dict(groups=8, m=4096, N=n, K=k), f"DSV3 {name} {'fwd' if layout == 'NT' else 'dgrad'} "
                            "G=8 M=4096", "not found", "Primus-Turbo PR #384 (per-shape TFLOPS not found)"))
        out.append(Case("grouped_gemm_fp8", _grouped_variant("TN", N, K), dict(groups=8, m=4096, N=N, K=K),
                        f"DSV3 {name} wgrad G=8 M=4096", "not found",
                        "Primus-Turbo PR #384 (per-shape TFLOPS not found)"))
    return out


_DEEPGEMM_README = "DeepGEMM README (H800, not MI355X)"
DEEPGEMM_PUBLISHED = {  # (masked, groups, m per group, N, K) -> TFLOPS, deepseek-ai/DeepGEMM README
    (0, 4, 8192, 4096, 7168): 1297, (0, 4, 8192, 7168, 2048): 1099, (0, 8, 4096, 4096, 7168): 1288,
    (0, 8, 4096, 7168, 2048): 1093, (1, 1, 1024, 4096, 7168): 1233, (1, 1, 1024, 7168, 2048): 925,
    (1, 2, 512, 4096, 7168): 1040, (1, 2, 512, 7168, 2048): 916, (1, 4, 256, 4096, 7168): 932,
    (1, 4, 256, 7168, 2048): 815}


def preset_deep_gemm():
    return [Case("deep_gemm_fp8", {"BM": 128, "BN": 128, "MASKED": masked, "UE8M0": 0, "OUT": "bf16"},
                 dict(groups=g, m=m, N=N, K=K), f"{'masked' if masked else 'contig'} G={g} M={m} {N}x{K}",
                 f"{tf} TFLOPS", _DEEPGEMM_README) for (masked, g, m, N, K), tf in DEEPGEMM_PUBLISHED.items()]


def preset_mx_gemm():
    """MX GEMM (prefill) at 1024^3 and 8192^3, MXFP8 and MXFP4, with the op's own gfx950 tile choice."""
    from .ops.dense_mx import heuristic_config
    cases = []
    for s in (1024, 8192):
        for fmt in ("e4m3", "e2m1"):
            variant, splits, _ = heuristic_config("gfx950", fmt, fmt, "bf16", s, s, s)
            cases.append(Case("mx_gemm", variant, dict(M=s, N=s, K=s, splits=splits),
                              f"MX GEMM {fmt} {s}^3", "not found", "FlyDSL gfx1250 MX GEMM (numbers not found)"))
    return cases


def preset_dequant():
    return [Case(k, {}, dict(M=8192, K=7168), "dequant 8192x7168", "not found", "-")
            for k in ("mxfp8_dequant", "mxfp8_dequant_flydsl")]


PRESETS = {"smallm": preset_smallm, "moe_mxfp8": preset_moe_mxfp8, "a4w4": preset_a4w4,
           "grouped_fp8": preset_grouped_fp8, "deep_gemm": preset_deep_gemm, "mx_gemm": preset_mx_gemm,
           "dequant": preset_dequant}
SMALL_PRESET = "small"   # CI: one case of every kernel that runs quickly


def preset_small():
    return [Case("smallm_mxfp8_gemv", {"M_TILE": 1, "N_SUB": 1}, dict(M=1, N=1280, K=8192), "small gemv"),
            Case("smallm_mxfp8_mfma", {"M_TILE": 16, "SPLIT_K": 4}, dict(M=16, N=1280, K=8192), "small mfma"),
            Case("moe_gemm2_a4w4", {"BM": 16, "NT": 0}, dict(tokens=4, **KIMI_K25), "small a4w4"),
            *preset_mx_gemm()[:1]]


PRESETS[SMALL_PRESET] = preset_small


# ---- the model ----
def predict(case: Case, arch: str = "gfx950", mca: bool = True) -> dict:
    """One row of the model (see the module docstring); docs/perf_model.md §3 gives the rules."""
    lim = isa.LIMITS[arch]
    from .build import artifact
    art = artifact(case.kernel, case.variant, arch)
    info = art.isa()
    kern = registry.get(case.kernel)
    loop = hot_loop(art.asm, art.symbol, arch)
    w = WORK[case.kernel](case.kernel, case.variant, **case.shape)
    clock = lim["clock_ghz"] * 1e9
    peak = lim["peak_tflops"][w.rate] * 1e12
    t_flops, t_mem = w.flops / peak, w.bytes / (lim["hbm_tbps"] * 1e12)
    t_roof = max(t_flops, t_mem)

    waves_per_wg = _waves(case.kernel, arch)
    occ = info.occupancy(kern.threads_for(arch))                  # waves per SIMD
    wgs_per_cu = max(1, occ * lim["simds_per_cu"] // waves_per_wg)
    slots = lim["cus"] * wgs_per_cu
    rounds = max(1, -(-w.live_wgs // slots))
    busy_last = (w.live_wgs - (rounds - 1) * slots) / slots      # fraction of the machine in the last round
    # per CU and round: the MFMA units and issue slots are shared by its resident waves; a wave's
    # iteration waits one memory round trip (a loop that drains vmcnt(0) cannot overlap two)
    resident = min(wgs_per_cu, max(1, -(-w.live_wgs // lim["cus"])))
    per_round_iters = w.wave_iterations / max(1, w.live_wgs) * resident   # wave-iterations on one CU
    t_mfma = rounds * per_round_iters * loop.mfma_cycles / lim["simds_per_cu"] / clock
    t_issue = rounds * per_round_iters * loop.issue_cycles / lim["simds_per_cu"] / clock
    depth = 1 if loop.drains_vm else 2
    t_lat = rounds * w.serial_iterations * lim["mem_latency_ns"] * 1e-9 / depth if loop.global_bytes else 0.0
    terms = {"memory": t_mem, "MFMA issue": t_mfma, "instruction issue": t_issue, "latency/occupancy": t_lat}
    limit = max(terms, key=terms.get)
    t_pred = max(terms.values())
    if limit != "memory" and rounds > 1 and busy_last < 0.5:
        limit = "tail"                         # a mostly idle last round of workgroups dominates
    return dict(
        kernel=case.kernel, variant=registry.variant_id(case.variant), case=case.label,
        flops=w.flops, bytes=w.bytes, ai=w.flops / w.bytes if w.bytes else 0.0, rate=w.rate,
        roofline_us=t_roof * 1e6, grid="x".join(map(str, w.grid)), workgroups=w.live_wgs,
        waves_per_simd=occ, wgs_per_cu=wgs_per_cu, rounds=rounds, last_round_busy=round(busy_last, 3),
        loop_counts=dict(loop.counts), loop_mfma_cycles=loop.mfma_cycles, loop_issue_cycles=loop.issue_cycles,
        loop_global_bytes=loop.global_bytes, loop_lds_bytes=loop.lds_bytes, loop_waits=loop.waits,
        hot_loop="loop" if loop.in_loop else "no loop (whole body)",
        llvm_mca=llvm_mca_cycles(loop.lines, arch) if mca else "not run",
        mfma_us=t_mfma * 1e6, issue_us=t_issue * 1e6, latency_us=t_lat * 1e6, memory_us=t_mem * 1e6,
        predicted_us=t_pred * 1e6, roofline_fraction=t_roof / t_pred if t_pred else 0.0, limit=limit,
        published=case.published, source=case.source)


def modelled_cases(preset_names, note=print) -> list[Case]:
    """The presets' cases whose kernel is registered and modelled; a note names each one skipped."""
    cases = []
    for name in preset_names:
        for case in PRESETS[name]():
            if case.kernel not in registry.KERNELS:
                note(f"note: kernel {case.kernel!r} ({case.label}) is not in the registry yet: skipped")
                continue
            if case.kernel not in WORK:
                note(f"note: kernel {case.kernel!r} has no work model in mxgemm.perf yet: skipped")
                continue
            cases.append(case)
    return cases


# ---- output ----
_COLUMNS = (("kernel", "{}"), ("variant", "{}"), ("case", "{}"), ("ai", "{:.1f}"), ("roofline_us", "{:.2f}"),
            ("predicted_us", "{:.2f}"), ("roofline_fraction", "{:.2f}"), ("limit", "{}"), ("grid", "{}"),
            ("waves_per_simd", "{}"), ("rounds", "{}"), ("loop_mfma_cycles", "{:.0f}"),
            ("loop_issue_cycles", "{:.0f}"), ("loop_global_bytes", "{}"), ("loop_lds_bytes", "{}"),
            ("loop_waits", "{}"), ("llvm_mca", "{}"), ("published", "{}"), ("source", "{}"))
_HEAD = dict(roofline_us="roof_us", predicted_us="model_us", roofline_fraction="of_roof", waves_per_simd="w/SIMD",
             loop_mfma_cycles="mfma_cyc", loop_issue_cycles="issue_cyc", loop_global_bytes="glob_B",
             loop_lds_bytes="lds_B", loop_waits="waits")


_MEASURED = (("measured_us", "{:.2f}"), ("model_over_measured", "{:.2f}"))


def table(rows) -> str:
    cols = _COLUMNS + (_MEASURED if rows and "measured_us" in rows[0] else ())
    cells = [[fmt.format(r[c]) for c, fmt in cols] for r in rows]
    heads = [_HEAD.get(c, c) for c, _ in cols]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(heads)] + [line(c) for c in cells])


def csv_text(rows) -> str:
    import csv
    import io
    buf = io.StringIO()
    cols = [c for c in rows[0] if c != "loop_counts"] if rows else []
    wr = csv.DictWriter(buf, cols, extrasaction="ignore")
    wr.writeheader()
    wr.writerows(rows)
    return buf.getvalue()


def plot(rows, path, arch="gfx950"):
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib, which is not installed (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lim = isa.LIMITS[arch]
    bw = lim["hbm_tbps"] * 1e12
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [10 ** (i / 10) for i in range(-10, 50)]
    for rate, peak in lim["peak_tflops"].items():
        ax.plot(xs, [min(peak * 1e12, bw * x) / 1e12 for x in xs], lw=1, label=f"roof {rate}")
    for kernel in sorted({r["kernel"] for r in rows}):
        pts = [r for r in rows if r["kernel"] == kernel and r["ai"] > 0]
        ax.scatter([r["ai"] for r in pts], [r["flops"] / r["predicted_us"] / 1e6 for r in pts], s=12,
                   label=kernel if pts else f"{kernel} (0 FLOP: no point on a FLOP roofline)")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / compulsory byte)",
           ylabel="predicted TFLOP/s", title=f"mxgemm perf model on {lim['name']} ({arch})")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)


# ---- running a case through its op (emulator on CPU tensors, the GPU with --measure) ----
def _bytes_as(shape, dtype, device, gen, lo=0, hi=256):
    """Random bytes viewed as ``dtype``: values do not change which instructions run or how long
    the GPU takes, and filling 100s of MB this way is fast on either device."""
    return torch.randint(lo, hi, shape, dtype=torch.uint8, generator=gen).to(device).view(dtype)


_TORCH_OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def op_call(case: Case, device: str = "cpu"):
    """A zero-argument callable that runs ``case`` through its public op on ``device`` with
    ``case.variant`` (asserted against the op's own choice where the op picks the variant)."""
    import mxgemm
    g = torch.Generator().manual_seed(0)
    u8 = lambda *s, lo=0, hi=256: _bytes_as(s, torch.uint8, device, g, lo, hi)  # noqa: E731
    e4m3 = lambda *s: _bytes_as(s, torch.float8_e4m3fn, device, g, 0, 0x7F)  # noqa: E731 (finite, >= 0)
    scale = lambda *s: u8(*s, lo=120, hi=134)  # noqa: E731
    k, v, sh = case.kernel, case.variant, case.shape
    if k in ("smallm_mxfp8_gemv", "smallm_mxfp8_mfma"):
        M, N, K = sh["M"], sh["N"], sh["K"]
        args = (e4m3(M, K), scale(M, K // 32), e4m3(N, K), scale(N, K // 32))
        return lambda: mxgemm.smallm_mxfp8_gemm(*args, config={"kernel": k, **v}, fallback="error")
    if k in WORK and k.startswith(("smallm_mxfp8_moe", "moe_gemm2_a4w4")):
        T, topk, E, N, K = (sh[x] for x in ("tokens", "topk", "experts", "N", "K"))
        block_m = v.get("BM", 16)
        srt, _ = _routing(T, topk, E, block_m)
        ids = [t.to(device) for t in (srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids)]
        if k == "smallm_mxfp8_moe_grouped_gemm":
            args = (e4m3(T, K), scale(T, K // 32), e4m3(E, N, K), scale(E, N, K // 32), *ids)
            cfg = ",".join(f"{p}={x}" for p, x in v.items())
            return lambda: mxgemm.moe_mxfp8_grouped_gemm(*args, block_m=block_m, config=cfg, fallback="error")
        out = torch.zeros(T, N, dtype=torch.bfloat16, device=device)
        args = (u8(T * topk, K // 2), scale(T * topk, K // 32), u8(E, N, K // 2), scale(E, N, K // 32), *ids,
                srt.sorted_weights.to(device), out)
        backend = "flydsl" if k.endswith("flydsl") else "hip"
        return lambda: mxgemm.moe_gemm2_a4w4(*args, block_m=block_m, nt=v["NT"], backend=backend)
    if k == "deep_gemm_fp8":
        G, m, N, K = sh["groups"], sh["m"], sh["N"], sh["K"]
        sf = scale if v["UE8M0"] else (lambda *s: torch.rand(*s, generator=g).add_(0.5).to(device))
        rows = (G, m) if v["MASKED"] else (G * m,)
        layout = torch.full((G,), m, dtype=torch.int32) if v["MASKED"] else \
            torch.arange(G, dtype=torch.int32).repeat_interleave(m)
        args = (e4m3(*rows, K), sf(*rows, K // 128), e4m3(G, N, K), sf(G, -(-N // 128), K // 128),
                layout.to(device), torch.zeros(*rows, N, dtype=torch.bfloat16, device=device))
        return _checked(case, "deep_gemm_fp8_grouped_gemm", args, dict(masked=bool(v["MASKED"])))
    if k == "grouped_gemm_fp8":
        G, m, N, K = sh["groups"], sh["m"], sh["N"], sh["K"]
        one, lens = torch.ones(1, device=device), torch.full((G,), m, dtype=torch.int64, device=device)
        if v["LAYOUT"] == "TN":
            return _checked(case, "grouped_gemm_fp8_variable_k", (e4m3(G * m, N), one, e4m3(G * m, K), one, lens), {})
        nt = v["LAYOUT"] == "NT"
        return _checked(case, "grouped_gemm_fp8_kernel",
                        (e4m3(G * m, K), one, e4m3(G, N, K) if nt else e4m3(G, K, N), one, lens), dict(trans_b=nt))
    if k == "mx_gemm":
        M, N, K = sh["M"], sh["N"], sh["K"]
        payload = {"e4m3": lambda r: e4m3(r, K), "e5m2": lambda r: _bytes_as((r, K), torch.float8_e5m2, device, g, 0, 0x7C),
                   "e2m1": lambda r: u8(r, K // 2)}
        args = (payload[v["A_FMT"]](M), scale(M, K // 32), payload[v["B_FMT"]](N), scale(N, K // 32))
        kw = dict(a_format=v["A_FMT"], b_format=v["B_FMT"], out_dtype=_TORCH_OUT[v["OUT"]],
                  config=f"BM={v['BM']},BN={v['BN']},SPLITS={sh.get('splits', 1)}")
        return _checked(case, "mx_gemm", args, kw)
    if k in ("mxfp8_dequant", "mxfp8_dequant_flydsl"):
        args = (e4m3(sh["M"], sh["K"]), scale(sh["M"], sh["K"] // 32))
        return lambda: mxgemm.mxfp8_dequantize(*args, language="flydsl" if k.endswith("flydsl") else "hip")
    raise KeyError(f"no op call for kernel {k!r}")


def _checked(case, op, args, kw):
    import mxgemm
    plan = mxgemm.explain(op, *args, **kw)
    if (plan.kernel, plan.variant) != (case.kernel, case.variant):
        raise ValueError(f"{case.label}: op {op} picks {plan.kernel} {plan.variant}, the case models {case.variant}")
    fn = getattr(mxgemm, op)
    return lambda: fn(*args, **kw)


def measure_us(fn, calls: int = 20, replays: int = 20) -> float:
    """Microseconds per call on the GPU: ``calls`` calls captured in one graph (hipGraph through
    torch.cuda.CUDAGraph), replayed ``replays`` times between two events. Operands stay in the
    caches between calls (no rotation), so memory-bound cases run faster than from HBM."""
    fn()                                   # plan, compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def measure(cases, rows) -> None:
    """Adds measured_us and model/measured to each row; refuses without a gfx950 GPU."""
    from . import toolchain
    gpu = toolchain.gpu_arch()
    if gpu != "gfx950":
        raise RuntimeError(f"--measure needs a gfx950 GPU (ROCm torch); this machine has {gpu or 'no GPU'}")
    for case, row in zip(cases, rows):
        row["measured_us"] = measure_us(op_call(case, "cuda"))
        row["model_over_measured"] = row["predicted_us"] / row["measured_us"]


def main(argv) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m mxgemm perf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="all", help=f"comma list of {sorted(PRESETS)} or 'all' (every preset but "
                                                     f"'{SMALL_PRESET}')")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV ('-': stdout instead of the table)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON ('-': stdout instead of the table)")
    p.add_argument("--plot", metavar="FILE.png", help="roofline chart with every case's predicted point")
    p.add_argument("--measure", action="store_true", help="time the cases on a gfx950 GPU and print model vs measured")
    p.add_argument("--no-mca", action="store_true", help="skip llvm-mca even when it is on PATH")
    args = p.parse_args(argv)
    names = [n for n in PRESETS if n != SMALL_PRESET] if args.preset == "all" else args.preset.split(",")
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        print(f"python -m mxgemm perf: error: unknown preset {unknown[0]!r}; known: {sorted(PRESETS)}", file=sys.stderr)
        return 1
    cases = modelled_cases(names, note=lambda s: print(s, file=sys.stderr))
    rows = [predict(c, mca=not args.no_mca) for c in cases]
    if args.measure:
        try:
            measure(cases, rows)
        except RuntimeError as e:
            print(f"python -m mxgemm perf: {e}", file=sys.stderr)
            return 1
    to_stdout = False
    if args.csv:
        text = csv_text(rows)
        to_stdout |= args.csv == "-"
        sys.stdout.write(text) if args.csv == "-" else Path(args.csv).write_text(text)
    if args.json:
        text = json.dumps(rows, indent=1)
        to_stdout |= args.json == "-"
        print(text) if args.json == "-" else Path(args.json).write_text(text)
    if args.plot:
        try:
            plot(rows, args.plot)
        except RuntimeError as e:
            print(f"python -m mxgemm perf: error: {e}", file=sys.stderr)
            return 1
    if not to_stdout:
        print(table(rows))
    return 0
