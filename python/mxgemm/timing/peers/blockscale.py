"""DeepGEMM's block-scale FP8 grouped GEMMs (``m_grouped_fp8_gemm_nt_contiguous`` / ``_masked``,
kernel ``blockscale_grouped_gemm``) on DeepSeek-V3's expert shapes. The peer is vLLM's Triton
block-FP8 MoE GEMM (``fused_moe_kernel`` with ``block_shape=[128, 128]``; its batched form for the
masked layout): 1x128 activation and 128x128 weight scales applied to each 128-K step's
``tl.dot``, one expert per BLOCK_M row tile. It is written here after that design
(docs/peers/blockscale.md) with vLLM's default block-FP8 config, compiled for gfx950 by the
Triton wheel: contiguous, the tile's group read from m_indices (groups padded to 128 rows, as
DeepGEMM lays them out), rows with m_indices -1 neither loaded nor stored; masked, a grid of
(group, M tiles up to the buffer's rows x N tiles) that exits past masked_m."""
from __future__ import annotations

import functools

import torch

from . import compile_as_launched, launch_triton, time_ours

# vLLM's get_default_config for fp8_w8a8 with a block_shape: BLOCK_SIZE_M 64, BLOCK_SIZE_N / _K the
# scale block (128), GROUP_SIZE_M 32, num_warps 4, num_stages 2 on ROCm (3 elsewhere)
PEER_CONFIG = dict(BM=64, BN=128, BK=128, GROUP_M=32)
PEER_WARPS, PEER_STAGES = 4, 2
PEER = ("vLLM's Triton block-FP8 MoE GEMM (fused_moe_kernel / batched, block_shape [128, 128]), "
        "BLOCK 64/128/128, GROUP_SIZE_M 32, 4 warps, 2 stages")
SCALE_BLOCK = 128
GROUPS = 8
SHAPES = ((2048, 7168), (7168, 2048))       # (N, K): DeepSeek-V3 experts, hidden 7168 to / from 2048
MS = (64, 128, 256, 512)    # rows per group, the goal's
ROUNDS = 3          # rounds of XCD 0's workgroups simulated (as `python -m mxgemm time`)
# K simulated; the time is extrapolated linearly to the cell's K, as `time --calibrate` extrapolates
# (the K loop is the steady state, docs/timing_model.md §3): a whole 7168-K cell takes 6-12 minutes
# of the shared cores a side. Both K run every kernel's K loop in its steady state: at 256, a loop of
# three steps per iteration (ours at 128 x 64) never runs an iteration. The extrapolation misses what
# grows with K: row-major scales' L1 misses at K 7168, fewer since ours loads them in windows
# (docs/peers/blockscale.md, "The whole K" and "Row-major scales in windows")
K_SAMPLE = (512, 1024)
NAME = "blockscale_moe"


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def blockscale_moe(a, a_scale, b, b_scale, c, layout, N, K, rows, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, GROUP_M: tl.constexpr, MASKED: tl.constexpr, SB: tl.constexpr):
        # SB: the scale block (128 rows of b, 128 of K)
        # rows: contiguous, a's rows (every group padded to 128); masked, the rows of a group's buffer
        n_tiles = tl.cdiv(N, BN)
        if MASKED:      # vLLM's batched kernel: axis 0 the group, axis 1 its (M, N) tiles
            g = tl.program_id(0).to(tl.int64)
            pid_m, pid_n = tl.program_id(1) // n_tiles, tl.program_id(1) % n_tiles
            live_rows = tl.load(layout + g)
            if pid_m * BM >= live_rows:
                return
            r = pid_m * BM + tl.arange(0, BM).to(tl.int64)
            live = r < live_rows
            rm = g * rows + r
        else:           # fused_moe_kernel: GROUP_M row tiles share each N tile (L2 reuse)
            pid = tl.program_id(0)
            per_band = GROUP_M * n_tiles
            first_m = pid // per_band * GROUP_M
            band_m = min(tl.cdiv(rows, BM) - first_m, GROUP_M)
            pid_m = first_m + pid % per_band % band_m
            pid_n = pid % per_band // band_m
            rm = pid_m * BM + tl.arange(0, BM).to(tl.int64)
            live = tl.load(layout + rm) >= 0
            g = tl.load(layout + pid_m * BM).to(tl.int64)
            if g < 0:   # a tile of padding rows only: vLLM's expert -1 path stores its live rows, none
                return
        rn = (pid_n * BN + tl.arange(0, BN).to(tl.int64)) % N
        rk = tl.arange(0, BK)
        kb = tl.cdiv(K, SB)
        x_at = a + rm[:, None] * K + rk[None, :]
        y_at = b + g * N * K + rn[None, :] * K + rk[:, None]          # [BK, BN] view of b [G, N, K]
        xs_at = a_scale + rm * kb
        ys_at = b_scale + g * tl.cdiv(N, SB) * kb + rn // SB * kb
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            left = K - k * BK
            x = tl.load(x_at, mask=live[:, None] & (rk[None, :] < left), other=0.0)
            y = tl.load(y_at, mask=rk[:, None] < left, other=0.0)
            xs = tl.load(xs_at + k * BK // SB, mask=live, other=0.0)
            ys = tl.load(ys_at + k * BK // SB)
            acc += tl.dot(x, y) * xs[:, None] * ys[None, :]
            x_at += BK
            y_at += BK
        cn = pid_n * BN + tl.arange(0, BN)
        tl.store(c + rm[:, None] * N + cn[None, :], acc.to(tl.bfloat16), mask=live[:, None] & (cn[None, :] < N))

    return blockscale_moe


def time_peer(a, sfa, b, sfb, layout, masked: bool, machine="mi355x", rounds=ROUNDS) -> tuple:
    """(output, timing) of the peer: a e4m3 [rows, K] (masked: [G, rows, K]) with fp32 sfa
    [.., K/128], b e4m3 [G, N, K] with fp32 sfb [G, N/128, K/128]; layout m_indices int32 [rows]
    (-1: padding) or masked_m int32 [G]. Output bf16 like a's rows x N, zeros where not written.
    Compiled as Triton's launcher specialises this call (peers.compile_as_launched)."""
    from ...emu import Emulator
    G, N, K = b.shape
    rows = a.shape[-2]
    for t in (a, sfa, b, sfb, layout):
        assert t.is_contiguous(), "the peer indexes dense tensors"
    c = torch.zeros(*a.shape[:-1], N, dtype=torch.bfloat16)
    args = dict(a=a, a_scale=sfa, b=b, b_scale=sfb, c=c, layout=layout, N=N, K=K, rows=rows)
    constexprs = (*PEER_CONFIG.items(), ("MASKED", int(masked)), ("SB", SCALE_BLOCK))
    asm, lds, launch = compile_as_launched(_kernel(), args, constexprs, PEER_WARPS, (("num_stages", PEER_STAGES),))
    m_tiles, n_tiles = -(-rows // PEER_CONFIG["BM"]), -(-N // PEER_CONFIG["BN"])
    grid = (G, m_tiles * n_tiles) if masked else (m_tiles * n_tiles,)
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    launch_triton(emu, asm, NAME, launch, grid, PEER_WARPS, lds, rounds=rounds)
    return c, emu.last_timing


def operands(G, m, N, K, masked: bool, seed=0) -> tuple:
    """(a, sfa, b, sfb, layout) of a cell: e4m3 payloads and fp32 block scales (random, not a cast
    of anything: both kernels read the same bytes); contiguous, each group's m rows padded to 128
    (m_indices -1), as DeepGEMM requires; masked, [G, m, K] with masked_m = m."""
    g = torch.Generator().manual_seed(seed)
    padded = -(-m // SCALE_BLOCK) * SCALE_BLOCK
    rows = (G, m) if masked else (G * padded,)
    kb = -(-K // SCALE_BLOCK)
    a = torch.randn(*rows, K, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(G, N, K, generator=g).to(torch.float8_e4m3fn)
    sfa = torch.rand(*rows, kb, generator=g) + 0.5
    sfb = torch.rand(G, -(-N // SCALE_BLOCK), kb, generator=g) + 0.5
    if masked:
        layout = torch.full((G,), m, dtype=torch.int32)
    else:
        layout = torch.arange(G, dtype=torch.int32).repeat_interleave(padded)
        layout[torch.arange(G * padded) % padded >= m] = -1
        a.view(torch.uint8)[layout < 0] = 0      # padding rows hold no tokens
    return a, sfa, b, sfb, layout


def ours(a, sfa, b, sfb, layout, masked: bool, config="") -> torch.Tensor:
    """DeepGEMM's call on mxgemm.deep_gemm (its own tile choice, or ``config``) -> d."""
    from ... import deep_gemm
    d = torch.zeros(*a.shape[:-1], b.shape[1], dtype=torch.bfloat16)
    if masked:
        deep_gemm.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, layout, int(layout.max()), config=config)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout, config=config)
    return d


def hottest(t) -> str:
    """A timing's hottest basic block: its label, share of the blocks' cycles and largest stalls."""
    blocks = t["breakdown"]["blocks"]
    top = blocks[0]
    stalls = sorted(top["stalls"].items(), key=lambda kv: -kv[1])[:2]
    return (f"{top['block']} {100 * top['cycles'] / sum(b['cycles'] for b in blocks):.0f}% ("
            + ", ".join(f"{k} {100 * v / top['cycles']:.0f}%" for k, v in stalls) + ")")


def cells() -> list:
    return [dict(label=f"{'masked' if masked else 'contig'} G={GROUPS} m={m} N={N} K={K}", masked=masked,
                 G=GROUPS, m=m, N=N, K=K)
            for m in MS for N, K in SHAPES for masked in (False, True)]


def _at_k(cell, K, machine, config) -> tuple:
    """(ours us, kernel symbols, our timing, the peer's timing) of ``cell`` with its K replaced by
    ``K``; both products checked against each other first (the same per-128-K promotion, fp32 sums
    in different orders)."""
    args = operands(cell["G"], cell["m"], cell["N"], K, cell["masked"])
    mine, us, symbol, t = time_ours(lambda: ours(*args, cell["masked"], config), machine, ROUNDS)
    theirs, tp = time_peer(*args, cell["masked"], machine)
    # a sampled run writes the tiles of its sampled rounds only: compare what both wrote
    both = theirs.ne(0) & mine.ne(0) if t["sampled"] or tp["sampled"] else torch.ones_like(mine, dtype=torch.bool)
    assert int(both.sum()) >= PEER_CONFIG["BM"] * PEER_CONFIG["BN"], f"{cell['label']}: no tile written by both"
    torch.testing.assert_close(theirs[both].float(), mine[both].float(), rtol=2 ** -7, atol=1e-2)
    return us, symbol, t, tp


def run(cell, machine="mi355x", config="") -> dict:
    """Ours (its own config choice, or ``config``) and the peer on one cell, each simulated at the
    two K of K_SAMPLE and extrapolated linearly to the cell's K (limiter and hottest block: the
    larger K's run)."""
    (us0, _, _, tp0), (us1, symbol, t, tp) = (_at_k(cell, K, machine, config) for K in K_SAMPLE)
    to_k = (cell["K"] - K_SAMPLE[0]) / (K_SAMPLE[1] - K_SAMPLE[0])
    return dict(ours_us=us0 + to_k * (us1 - us0), peer_us=tp0["us"] + to_k * (tp["us"] - tp0["us"]),
                ours_kernel=symbol, ours_limiter=t["limiter"], peer_limiter=tp["limiter"],
                sampled=t["sampled"] or tp["sampled"], ours_hot=hottest(t), peer_hot=hottest(tp))
