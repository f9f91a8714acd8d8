"""FP8 grouped GEMMs of MoE training, tensorwise scales, bf16 out: forward (NT), dgrad (NN) and the
variable-K wgrad (TN). The peer is Primus-Turbo's Triton grouped FP8 backend
(PRIMUS_TURBO_GROUPED_GEMM_BACKEND=TRITON), written here after its design (docs/peers/grouped_fp8.md):
a persistent grid of one workgroup per CU whose ids are regrouped per XCD in chunks of 32, each
looping over the tiles of all groups (a GROUP_M 4 swizzle inside a group), fp32 accumulation,
the product of the two scales applied once, bf16 stored under a row / column mask. Its config is
the gfx950 default Primus-Turbo takes without the optional origami selector: 256 x 256 tiles,
8 warps, 16-wide MFMAs, BLOCK_K 128 with 2 stages for forward / dgrad, BLOCK_K 64 with 3 stages
for the wgrad. Compiled for gfx950 by the Triton wheel as Triton's launcher specialises each call
(peers.compile_as_launched)."""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from ...hardware import LIMITS
from ...ops.train_grouped_gemm import group_offsets
from ..cli import report
from . import compile_as_launched, launch_triton, time_ours

PEER = ("Primus-Turbo's Triton grouped FP8 GEMM (tensorwise; persistent, 256 x 256 tiles, 8 warps; "
        "BLOCK_K 128 x 2 stages fwd / dgrad, 64 x 3 stages wgrad)")
CUS = LIMITS["gfx950"]["cus"]        # get_num_cus(): the persistent grid
XCDS, CHUNK, GROUP_M, WARPS = 8, 32, 4, 8
ROWS_CFG = dict(BM=256, BN=256, BK=128, STAGES=2)     # forward and dgrad
WGRAD_CFG = dict(BM=256, BN=256, BK=64, STAGES=3)
ROUNDS = 3
# (model, GEMM, N, K) of Primus-Turbo's grouped GEMM benchmark (benchmark/ops/training/config.py:
# GateUP N = 2 x moe_intermediate, K = hidden; Down N = hidden, K = moe_intermediate); gpt-oss as
# its GPT-OSS-20B entry (120B has the same hidden and intermediate sizes and 8 local experts at EP 16)
GEMMS = (("DSV3", "GateUP", 4096, 7168), ("DSV3", "Down", 7168, 2048),
         ("Qwen3-235B", "GateUP", 8192, 4096), ("Qwen3-235B", "Down", 4096, 4096),
         ("gpt-oss", "GateUP", 5760, 2880), ("gpt-oss", "Down", 2880, 2880))
# what `time --vs-peers` runs, in order: a whole cell costs about 10 minutes of the emulator on the shared
# cores, so the table holds the three passes of the smallest GEMM and of DeepSeek-V3's Down (docs/peers/grouped_fp8.md)
TIMED = (("gpt-oss", "Down"), ("DSV3", "Down"))
GROUPS = 8
TOKENS = 512        # rows per group (balanced, as its benchmark's group_lens); see docs/peers/grouped_fp8.md
PASSES = ("fwd", "dgrad", "wgrad")
CONTRACTION = (256, 512)   # forward / dgrad timed at these contraction lengths (run())


@triton.jit
def xcd_order(pid, NUM_SMS: tl.constexpr, XCDS: tl.constexpr, CHUNK: tl.constexpr):
    # consecutive workgroups go to consecutive XCDs: give each XCD CHUNK consecutive tile slots
    if pid > (NUM_SMS // (XCDS * CHUNK)) * (XCDS * CHUNK):
        return pid
    return (pid // XCDS // CHUNK) * XCDS * CHUNK + (pid % XCDS) * CHUNK + (pid // XCDS) % CHUNK


@triton.jit
def swizzle(tile, tiles_m, tiles_n, GM: tl.constexpr):
    band = GM * tiles_n
    first = tile // band * GM
    rows = min(tiles_m - first, GM)
    return first + tile % band % rows, tile % band // rows


@triton.jit
def grouped_rows(a, b, c, a_scale, b_scale, group_offs, tile_ends, G, N, K, stride_bg, stride_bn,
                 stride_bk: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 GM: tl.constexpr, NUM_SMS: tl.constexpr, XCDS: tl.constexpr, CHUNK: tl.constexpr,
                 GP2: tl.constexpr):
    """c[rows of g] = a[rows of g] @ B_g * sa * sb; B_g[k, n] at b + g stride_bg + k stride_bk + n stride_bn."""
    gs = tl.arange(0, GP2)
    ends = tl.load(tile_ends + gs, mask=gs <= G, other=2147483647)   # tiles before group g
    scale = tl.load(a_scale) * tl.load(b_scale)
    tiles_n = tl.cdiv(N, BN)
    for tile in range(xcd_order(tl.program_id(0), NUM_SMS, XCDS, CHUNK), tl.load(tile_ends + G), NUM_SMS):
        g = tl.sum(((ends <= tile) & (gs >= 1) & (gs <= G)).to(tl.int32))
        row0 = tl.load(group_offs + g)
        rows = (tl.load(group_offs + g + 1) - row0).to(tl.int32)
        pm, pn = swizzle(tile - tl.sum(tl.where(gs == g, ends, 0)), tl.cdiv(rows, BM), tiles_n, GM)
        rm = (pm * BM + tl.arange(0, BM)) % rows          # wrapped rows: read, never stored
        rn = tl.max_contiguous(tl.multiple_of((pn * BN + tl.arange(0, BN)) % N, BN), BN)
        rk = tl.arange(0, BK)
        pa = a + (row0 + rm)[:, None] * K + rk[None, :]
        pb = b + g.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K // BK):     # 16-element runs along each operand's contiguous dimension
            acc += tl.dot(tl.load(tl.multiple_of(pa, (1, 16))),
                          tl.load(tl.multiple_of(pb, (16, 1) if stride_bk == 1 else (1, 16))))
            pa += BK
            pb += BK * stride_bk
        if K % BK:          # the last, partial K step masked (Primus-Turbo's EVEN_K = False)
            live = rk < K % BK
            acc += tl.dot(tl.load(pa, mask=live[None, :], other=0.0), tl.load(pb, mask=live[:, None], other=0.0))
        rs = pm * BM + tl.arange(0, BM)
        tl.store(c + (row0 + rs)[:, None] * N + rn[None, :], (acc * scale).to(tl.bfloat16),
                 mask=(rs < rows)[:, None] & (rn < N)[None, :])


@triton.jit
def grouped_variable_k(a, b, c, a_scale, b_scale, group_offs, G, M, N, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, GM: tl.constexpr, NUM_SMS: tl.constexpr, XCDS: tl.constexpr,
                       CHUNK: tl.constexpr):
    """c[g] = a[rows of g]^T @ b[rows of g] * sa * sb; a [sum_k, M], b [sum_k, N], c [G, M, N]."""
    scale = tl.load(a_scale) * tl.load(b_scale)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    for tile in range(xcd_order(tl.program_id(0), NUM_SMS, XCDS, CHUNK), G * tiles_m * tiles_n, NUM_SMS):
        g = tile // (tiles_m * tiles_n)
        pm, pn = swizzle(tile % (tiles_m * tiles_n), tiles_m, tiles_n, GM)
        row0 = tl.load(group_offs + g)
        rows = (tl.load(group_offs + g + 1) - row0).to(tl.int32)
        rm = (pm * BM + tl.arange(0, BM)) % M
        rn = tl.max_contiguous(tl.multiple_of((pn * BN + tl.arange(0, BN)) % N, BN), BN)
        rk = tl.arange(0, BK)
        pa = a + (row0 + rk)[None, :] * M + rm[:, None]
        pb = b + (row0 + rk)[:, None] * N + rn[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(rows, BK)):
            live = rk < rows - k * BK
            acc += tl.dot(tl.load(tl.multiple_of(pa, (16, 1)), mask=live[None, :], other=0.0),
                          tl.load(tl.multiple_of(pb, (1, 16)), mask=live[:, None], other=0.0))
            pa += BK * M
            pb += BK * N
        rs = pm * BM + tl.arange(0, BM)
        tl.store(c + g.to(tl.int64) * M * N + rs[:, None] * N + rn[None, :], (acc * scale).to(tl.bfloat16),
                 mask=(rs < M)[:, None] & (rn < N)[None, :])


KERNELS = dict(grouped_rows=grouped_rows, grouped_variable_k=grouped_variable_k)


def launch_peer(name: str, args: dict, constexprs: dict, stages: int, machine="mi355x", rounds=ROUNDS) -> dict:
    """Launch kernel ``name`` (runtime ``args`` by parameter, in order) on a persistent grid of CUS
    workgroups, compiled as Triton's launcher specialises this call with Primus-Turbo's launch options;
    its timing (XCD 0's workgroups: the persistent grid is one round)."""
    from ...emu import Emulator
    fixed = (("NUM_SMS", CUS), ("XCDS", XCDS), ("CHUNK", CHUNK))
    options = (("num_stages", stages), ("waves_per_eu", 0), ("matrix_instr_nonkdim", 16), ("kpack", 1))
    asm, lds, launch = compile_as_launched(KERNELS[name], args, tuple(constexprs.items()) + fixed, WARPS, options)
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    launch_triton(emu, asm, name, launch, (CUS,), WARPS, lds, rounds=rounds, xcd0=True)
    return emu.last_timing


def time_peer(pass_: str, a, sa, b, sb, group_lens, machine="mi355x", rounds=ROUNDS, fill=0.0) -> tuple:
    """(output, timing) of the peer on the operands of ours (fwd: a [sum_m, K] x b [G, N, K];
    dgrad: a [sum_m, N] x b [G, N, K] -> [sum_m, K]; wgrad: a [sum_k, M], b [sum_k, N] -> [G, M, N]),
    c filled with ``fill`` (a sampled launch writes only its workgroups' tiles)."""
    G = len(group_lens)
    offs = group_offsets(group_lens)
    blocks = dict(GM=GROUP_M)
    if pass_ == "wgrad":
        M, N = a.shape[1], b.shape[1]
        c = torch.full((G, M, N), fill, dtype=torch.bfloat16)
        blocks |= {k: WGRAD_CFG[k] for k in ("BM", "BN", "BK")}
        t = launch_peer("grouped_variable_k", dict(a=a, b=b, c=c, a_scale=sa, b_scale=sb, group_offs=offs, G=G,
                                                   M=M, N=N), blocks, WGRAD_CFG["STAGES"], machine, rounds)
        return c, t
    # forward: B_g[k, n] = b[g, n, k]; dgrad: the contraction runs over b's N, out columns over its K
    _, Nb, Kb = b.shape
    N, K, stride_bk, stride_bn = (Nb, Kb, 1, Kb) if pass_ == "fwd" else (Kb, Nb, Kb, 1)
    c = torch.full((a.shape[0], N), fill, dtype=torch.bfloat16)
    blocks |= {k: ROWS_CFG[k] for k in ("BM", "BN", "BK")}
    # the tile count before each group: Primus-Turbo's one-program prologue kernel, here on the host (untimed)
    ends = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(-(-group_lens // blocks["BM"]), 0)])
    ends = (ends * -(-N // blocks["BN"])).to(torch.int32)
    t = launch_peer("grouped_rows", dict(a=a, b=b, c=c, a_scale=sa, b_scale=sb, group_offs=offs, tile_ends=ends, G=G,
                                         N=N, K=K, stride_bg=Nb * Kb, stride_bn=stride_bn),
                    blocks | dict(stride_bk=stride_bk, GP2=1 << G.bit_length()), ROWS_CFG["STAGES"], machine, rounds)
    return c, t


def operands(pass_: str, G: int, m: int, N: int, K: int) -> tuple:
    """(a, a_scale, b, b_scale, group_lens) of one GEMM of a layer with weights [G, N, K] and m
    tokens per group: fwd x [G m, K], w; dgrad dy [G m, N], w; wgrad dy [G m, N], x (out [G, N, K]).
    e4m3 payloads of Gaussians, tensorwise scales 1/16 and 1/64 (their product is exact)."""
    gen = torch.Generator().manual_seed(0)

    def fp8(*shape):
        return torch.randn(*shape, generator=gen).to(torch.float8_e4m3fn)
    lens = torch.full((G,), m, dtype=torch.int64)
    a = fp8(G * m, N if pass_ != "fwd" else K)
    b = fp8(G * m, K) if pass_ == "wgrad" else fp8(G, N, K)
    return a, torch.tensor([1 / 16]), b, torch.tensor([1 / 64]), lens


def ours(pass_: str, a, sa, b, sb, lens, out=None, explain=False, config=""):
    """Our op for the pass (its own config choice, or ``config``), into ``out`` when given; explain:
    its plan."""
    import mxgemm
    name, kw = ("grouped_gemm_fp8_variable_k", {}) if pass_ == "wgrad" else \
        ("grouped_gemm_fp8_kernel", dict(trans_b=pass_ == "fwd"))
    if explain:
        return mxgemm.explain(name, a, sa, b, sb, lens, out=out, config=config, **kw)
    return getattr(mxgemm, name)(a, sa, b, sb, lens, out=out, config=config, **kw)


def problem(pass_: str, G: int, m: int, N: int, K: int) -> tuple:
    """The op's tuned-table key (layout, G, M, N, K) of one pass of a layer with weights [G, N, K]
    and m rows per group: the forward [G m, K] x w^T (NT), the dgrad [G m, N] x w (NN, K output
    columns), the wgrad's [G, N, K] output contracted over the G m rows (TN)."""
    return {"fwd": ("NT", G, G * m, N, K), "dgrad": ("NN", G, G * m, K, N), "wgrad": ("TN", G, N, K, G * m)}[pass_]


def cells(gemms=TIMED) -> list:
    shapes = {(model, gemm): (N, K) for model, gemm, N, K in GEMMS}
    return [dict(label=f"{model} {gemm} {p} B={GROUPS} M={TOKENS} N={N} K={K}", pass_=p, G=GROUPS, m=TOKENS, N=N, K=K)
            for model, gemm in gemms for N, K in [shapes[model, gemm]] for p in PASSES]


def _config(plan) -> tuple:
    return tuple(plan.variant.items()), plan.args["group_m"], plan.reason.split("config:")[-1]


def _timed(cell, machine, config_of=None) -> tuple:
    """(ours' us, symbol, timing, the peer's timing) on one shape, rounds-sampled: each side writes
    only its simulated workgroups' tiles into a zeroed out, so the two are compared where both
    wrote (at least a tile: both simulate XCD 0, whose first workgroup takes tile 0 on either
    side). config_of: a cell whose config ours must run here (the one its own shape plans)."""
    p = cell["pass_"]
    a, sa, b, sb, lens = operands(p, cell["G"], cell["m"], cell["N"], cell["K"])
    theirs, tp = time_peer(p, a, sa, b, sb, lens, machine)
    zeros = torch.zeros_like(theirs)
    plan = ours(p, a, sa, b, sb, lens, out=zeros, explain=True)
    if config_of is not None:
        want = ours(p, *operands(p, *(config_of[k] for k in ("G", "m", "N", "K"))), explain=True)
        if _config(plan) != _config(want):
            raise AssertionError(f"{cell['label']}: ours plans {plan.reason!r} here, {want.reason!r} at the cell")
    mine, us, symbol, t = time_ours(lambda: ours(p, a, sa, b, sb, lens, out=zeros), machine, ROUNDS, xcd0=True)
    both = (mine != 0) & (theirs != 0)
    if int(both.sum()) < 256 * 128:
        raise AssertionError(f"{cell['label']}: ours and the peer wrote {int(both.sum())} common elements, "
                             "under a tile")
    torch.testing.assert_close(theirs[both].float(), mine[both].float(), rtol=2 ** -7, atol=1e-2)
    for who, tt in ((symbol, t), ("peer " + ("grouped_variable_k" if p == "wgrad" else "grouped_rows"), tp)):
        report(f"{cell['label']} {cell['N']}x{cell['K']}: {who}", tt, top=2, out=sys.stderr)   # limiter, hottest blocks
    return us, symbol, t, tp


def run(cell, machine="mi355x") -> dict:
    """Ours and the peer on one cell. The wgrad is timed at its shape. Forward and dgrad loop over
    the contraction (K, dgrad's N) in the steady state both kernels spend their time in: they are
    timed at the contraction lengths CONTRACTION with ours on the cell's own config, and both
    times extrapolated linearly to the cell's (the calibration's method, docs/timing_model.md §3)."""
    if cell["pass_"] == "wgrad":
        us, symbol, t, tp = _timed(cell, machine)
        peer_us = tp["us"]
    else:
        dim = "K" if cell["pass_"] == "fwd" else "N"
        (lo, symbol, _, tp_lo), (hi, _, t, tp) = (_timed({**cell, dim: c}, machine, config_of=cell)
                                                  for c in CONTRACTION)
        f = (cell[dim] - CONTRACTION[0]) / (CONTRACTION[1] - CONTRACTION[0])
        us, peer_us = lo + (hi - lo) * f, tp_lo["us"] + (tp["us"] - tp_lo["us"]) * f
    return dict(ours_us=us, peer_us=peer_us, ours_kernel=symbol, ours_limiter=t["limiter"],
                peer_limiter=tp["limiter"], sampled=t["sampled"] or tp["sampled"])
