"""Small-M MXFP8 linear layers. The peer is the Triton ``tl.dot_scaled`` kernel that vLLM and
SGLang fall back to on ROCm (BLOCK_M 64, BLOCK_N 128, BLOCK_K 128, 8 warps). It is written here
after that algorithm (rows masked at M, N and K multiples of the blocks) and compiled for gfx950
by the Triton wheel as its launcher specialises each call."""
from __future__ import annotations

import functools

import torch

from ...specs.smallm_mxfp8 import MINIMAX_M3_LINEARS
from . import compile_as_launched, launch_triton, time_ours

PEER_BLOCKS = dict(BM=64, BN=128, BK=128)
PEER_WARPS = 8
PEER = "Triton tl.dot_scaled linear (vLLM / SGLang's ROCm MXFP8 fallback), BLOCK 64/128/128, 8 warps"
# the decode linear layers of a 6144-hidden MoE model (MiniMax-M3) at TP 1/2/4/8, as (name, N, K)
LAYERS = tuple((f"tp{tp} {name}", N, K) for tp, linears in MINIMAX_M3_LINEARS.items()
               for name, (K, N) in linears.items())
MS = (1, 16, 64)
ROUNDS = 3          # rounds of XCD 0's workgroups simulated (as `python -m mxgemm time`)


@functools.lru_cache(maxsize=None)
def _dot_scaled_linear():
    import triton
    import triton.language as tl

    @triton.jit
    def dot_scaled_linear(a, a_scale, b, b_scale, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk, rs = tl.arange(0, BK), tl.arange(0, BK // 32)
        live = (rm < M)[:, None]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K // BK):
            x = tl.load(a + rm[:, None] * K + k * BK + rk[None, :], mask=live, other=0.0)
            xs = tl.load(a_scale + rm[:, None] * (K // 32) + k * (BK // 32) + rs[None, :], mask=live, other=0)
            y = tl.load(b + rn[:, None] * K + k * BK + rk[None, :])
            ys = tl.load(b_scale + rn[:, None] * (K // 32) + k * (BK // 32) + rs[None, :])
            acc = tl.dot_scaled(x, xs, "e4m3", y.T, ys, "e4m3", acc)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=live)

    return dot_scaled_linear


def time_peer(a, sa, b, sb, machine="mi355x", xcd0=False) -> tuple:
    """(output, timing) of the Triton peer on a [M, K] e4m3 x b [N, K] e4m3 with e8m0 scales,
    compiled as Triton's launcher specialises this call (``xcd0``: XCD 0's workgroups only, the
    rest of the output NaN)."""
    from ...emu import Emulator
    M, K = a.shape
    N = b.shape[0]
    c = torch.full((M, N), float("nan") if xcd0 else 0.0, dtype=torch.bfloat16)
    args = dict(a=a, a_scale=sa, b=b, b_scale=sb, c=c, M=M, N=N, K=K)
    asm, lds, launch = compile_as_launched(_dot_scaled_linear(), args, tuple(PEER_BLOCKS.items()), PEER_WARPS)
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    launch_triton(emu, asm, "dot_scaled_linear", launch, (-(-M // PEER_BLOCKS["BM"]), N // PEER_BLOCKS["BN"]),
                  PEER_WARPS, lds, rounds=ROUNDS, xcd0=xcd0)
    return c, emu.last_timing


def operands(M, N, K) -> tuple:
    """(a, a_scale, b, b_scale): e4m3 operands of a cell, the same for every M of a layer."""
    from ...quant import quantize_mx
    g = torch.Generator().manual_seed(0)
    b, sb = quantize_mx(torch.randn(N, K, generator=g), "e4m3")
    a, sa = quantize_mx(torch.randn(M, K, generator=g), "e4m3")
    return a, sa, b, sb


def cells() -> list:
    return [dict(label=f"{name} M={M} N={N} K={K}", M=M, N=N, K=K) for name, N, K in LAYERS for M in MS]


def run(cell, machine="mi355x", config="") -> dict:
    """Ours (its own config choice, or ``config``) and the peer on one cell; both products checked
    against each other first (they differ only in fp32 summation order)."""
    import mxgemm
    a, sa, b, sb = operands(cell["M"], cell["N"], cell["K"])
    mine, us, symbol, t = time_ours(lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config=config, fallback="error"),
                                    machine, ROUNDS)
    theirs, tp = time_peer(a, sa, b, sb, machine)
    torch.testing.assert_close(theirs.float(), mine.float(), rtol=2 ** -7, atol=1e-2)
    return dict(ours_us=us, peer_us=tp["us"], ours_kernel=symbol, ours_limiter=t["limiter"],
                peer_limiter=tp["limiter"], sampled=t["sampled"] or tp["sampled"])
