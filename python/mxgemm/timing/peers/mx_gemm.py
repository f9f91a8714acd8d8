"""Prefill MX GEMMs (MXFP8, MXFP4, A8W4) at M = N = K. The peer is the Triton ``tl.dot_scaled``
GEMM of Triton's block-scaled matmul tutorial for CDNA4 (``python/tutorials/10-block-scaled-matmul.py``,
its AMD kernel): 128 x 128 output tiles, BLOCK_K 256, 8 warps, 2 stages, 16 x 16 scaled MFMAs
(``matrix_instr_nonkdim=16``), e8m0 scales pre-shuffled on the host so that each lane's four
scale bytes are one dword. aiter's MI350X table for its Triton A4W4 GEMM (``MI350X-GEMM-AFP4WFP4.json``,
"large" / "xlarge") names the same tile, BLOCK_K, stages and MFMA size (with 4 warps). The
tutorial runs only MXFP4 on AMD; MXFP8 and A8W4 run the same kernel and config, only the operand
formats change. Written here after that design and compiled for gfx950 by the Triton wheel
(docs/peers/mx_gemm.md).

Every cell is timed at its full K. A linear extrapolation from smaller K (``time --calibrate``'s
method) misjudged these kernels: ours touches a line per A and B row for its scale bytes (K / 32
bytes a row, in natural layout), and how many rows share a line falls with K; the peer's
pre-shuffled scales do not. From K 1536 / 3072 the 8192^3 cells came out 0.54x (MXFP4) and 0.86x
(MXFP8) against 0.82x and 1.23x at full K (docs/peers/mx_gemm.md)."""
from __future__ import annotations

import functools

import torch

from ... import quant
from . import compile_as_launched, launch_triton, time_ours

PEER_BLOCKS = dict(BM=128, BN=128, BK=256)      # BK: K elements a step, one shuffled scale group (8 x 32)
PEER_WARPS, PEER_STAGES, PEER_MFMA = 8, 2, 16
PEER = ("Triton tl.dot_scaled GEMM (Triton's CDNA4 block-scaled matmul tutorial), BLOCK 128/128/256, 8 warps, "
        "2 stages, 16x16 MFMA, pre-shuffled scales")
FORMATS = (("MXFP8", "e4m3", "e4m3"), ("MXFP4", "e2m1", "e2m1"), ("A8W4", "e4m3", "e2m1"))
# M = N = K. Cut for the shared cores (an 8192^3 cell takes 15-25 minutes, ours and the peer):
# 4096^3 (between the extremes) and 16384^3.
SIZES = {"MXFP8": (1024, 8192), "MXFP4": (1024, 8192), "A8W4": (1024, 8192)}
ROUNDS = 3
PER_BYTE = {"e4m3": 1, "e2m1": 2}


def shuffle_scales(s: torch.Tensor) -> torch.Tensor:
    """e8m0 scales [R, K/32] -> the peer's view [R/32, K] of quant.shuffle_scales (each 32-row
    group's bytes one row)."""
    return quant.shuffle_scales(s).view(s.shape[0] // 32, -1)


@functools.lru_cache(maxsize=None)
def _dot_scaled_gemm():
    import triton
    import triton.language as tl

    @triton.jit
    def dot_scaled_gemm(a, a_scale, b, b_scale, c, M, N, K, A_FMT: tl.constexpr, B_FMT: tl.constexpr,
                        A_PER_BYTE: tl.constexpr, B_PER_BYTE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr):
        pid = tl.program_id(0)
        tiles_n = tl.cdiv(N, BN)
        pm, pn = pid // tiles_n, pid % tiles_n
        rm = (pm * BM + tl.arange(0, BM)) % M
        rn = (pn * BN + tl.arange(0, BN)) % N
        ka, kb = tl.arange(0, BK // A_PER_BYTE), tl.arange(0, BK // B_PER_BYTE)
        a_ptrs = a + rm[:, None] * (K // A_PER_BYTE) + ka[None, :]
        b_ptrs = b + kb[:, None] + rn[None, :] * (K // B_PER_BYTE)           # B^T: [BK, BN], K contiguous
        ks = tl.arange(0, BK)       # scales [rows/32, K] (shuffle_scales): BK bytes of each 32-row group a step
        sa_ptrs = a_scale + ((pm * (BM // 32) + tl.arange(0, BM // 32)) % (M // 32))[:, None] * K + ks[None, :]
        sb_ptrs = b_scale + ((pn * (BN // 32) + tl.arange(0, BN // 32)) % (N // 32))[:, None] * K + ks[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K // BK):
            # back to [rows, BK/32]: axes (r0, c0, c2, r2, c1, r1) -> (r0, r1, r2, c0, c1, c2)
            sa = tl.load(sa_ptrs).reshape(BM // 32, BK // 256, 4, 16, 2, 2)
            sa = sa.permute(0, 5, 3, 1, 4, 2).reshape(BM, BK // 32)
            sb = tl.load(sb_ptrs).reshape(BN // 32, BK // 256, 4, 16, 2, 2)
            sb = sb.permute(0, 5, 3, 1, 4, 2).reshape(BN, BK // 32)
            acc = tl.dot_scaled(tl.load(a_ptrs), sa, A_FMT, tl.load(b_ptrs), sb, B_FMT, acc)
            a_ptrs += BK // A_PER_BYTE
            b_ptrs += BK // B_PER_BYTE
            sa_ptrs += BK
            sb_ptrs += BK
        cm = pm * BM + tl.arange(0, BM)
        cn = pn * BN + tl.arange(0, BN)
        tl.store(c + cm[:, None] * N + cn[None, :], acc.to(tl.bfloat16), mask=(cm < M)[:, None] & (cn < N)[None, :])

    return dot_scaled_gemm


def check_peer_shape(M, N, K) -> None:
    """The peer's own limits (the tutorial's): whole 32-row scale groups, K in whole BLOCK_K steps."""
    for name, v, m in (("M", M, 32), ("N", N, 32), ("K", K, PEER_BLOCKS["BK"])):
        if v % m:
            raise ValueError(f"the Triton peer needs {name} % {m} == 0; got {name} = {v}")


def time_peer(a, sa, b, sb, a_fmt, b_fmt, machine="mi355x", rounds=ROUNDS) -> tuple:
    """(output [M, N] bf16, NaN where the sampled run wrote nothing; timing) of the peer on
    a [M, K] x b [N, K] with e8m0 scales [rows, K/32] (shuffled here, as a deployment stores them:
    the weights' once, the activations' by their quantiser), compiled as Triton's launcher specialises
    this call, with the tutorial's num_stages and matrix_instr_nonkdim."""
    from ...emu import Emulator
    M, N = a.shape[0], b.shape[0]
    K = a.shape[1] * PER_BYTE[a_fmt]
    check_peer_shape(M, N, K)
    c = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    args = dict(a=a, a_scale=shuffle_scales(sa), b=b, b_scale=shuffle_scales(sb), c=c, M=M, N=N, K=K)
    consts = dict(A_FMT=a_fmt, B_FMT=b_fmt, A_PER_BYTE=PER_BYTE[a_fmt], B_PER_BYTE=PER_BYTE[b_fmt], **PEER_BLOCKS)
    asm, lds, launch = compile_as_launched(_dot_scaled_gemm(), args, tuple(consts.items()), PEER_WARPS,
                                           (("num_stages", PEER_STAGES), ("matrix_instr_nonkdim", PEER_MFMA)))
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    grid = (-(-M // PEER_BLOCKS["BM"]) * -(-N // PEER_BLOCKS["BN"]),)
    launch_triton(emu, asm, "dot_scaled_gemm", launch, grid, PEER_WARPS, lds, rounds=rounds)
    return c, emu.last_timing


def operands(a_fmt, b_fmt, M, N, K) -> tuple:
    from ...quant import quantize_mx
    g = torch.Generator().manual_seed(0)
    a, sa = quantize_mx(torch.randn(M, K, generator=g), a_fmt)
    b, sb = quantize_mx(torch.randn(N, K, generator=g), b_fmt)
    return a, sa, b, sb


def cells() -> list:
    return [dict(label=f"{name} {s}^3", a_fmt=a_fmt, b_fmt=b_fmt, M=s, N=s, K=s)
            for s in (1024, 8192) for name, a_fmt, b_fmt in FORMATS if s in SIZES[name]]


def _both(cell, K, machine) -> tuple:
    """(ours timing, our symbols, peer timing) at K, after checking that the two products agree
    wherever both sampled runs wrote."""
    import mxgemm
    a_fmt, b_fmt, M, N = cell["a_fmt"], cell["b_fmt"], cell["M"], cell["N"]
    a, sa, b, sb = operands(a_fmt, b_fmt, M, N, K)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    xa, xb = quant.shuffle_scales(sa), quant.shuffle_scales(sb)     # the peer's input, shuffled as it is
    mine, us, symbol, t = time_ours(lambda: mxgemm.mx_gemm(a, xa, b, xb, a_format=a_fmt, b_format=b_fmt, out=out,
                                                           shuffled_scales=True), machine, ROUNDS)
    theirs, tp = time_peer(a, sa, b, sb, a_fmt, b_fmt, machine)
    both = mine.isfinite() & theirs.isfinite()
    if both.sum() < PEER_BLOCKS["BM"] * PEER_BLOCKS["BN"]:
        raise AssertionError(f"{cell['label']} K={K}: the sampled runs share only {int(both.sum())} outputs")
    torch.testing.assert_close(theirs.float()[both], mine.float()[both], rtol=2 ** -7, atol=1e-2)
    return dict(t, us=us), symbol, tp


def run(cell, machine="mi355x") -> dict:
    """Ours (its own config choice) and the peer on one cell at its full K, both sampled by rounds."""
    K = cell["K"]
    t, symbol, tp = _both(cell, K, machine)
    ours_us, peer_us = t["us"], tp["us"]
    flops = 2.0 * cell["M"] * cell["N"] * K
    hot, peer_hot = t["breakdown"]["blocks"][0], tp["breakdown"]["blocks"][0]
    return dict(ours_us=ours_us, peer_us=peer_us, ours_kernel=symbol, ours_limiter=t["limiter"],
                peer_limiter=tp["limiter"], sampled=t["sampled"] or tp["sampled"],
                ours_tflops=flops / ours_us * 1e-6, peer_tflops=flops / peer_us * 1e-6,
                ours_hot_block=f"{hot['block']} ({hot['cycles']:.0f} cycles)",
                peer_hot_block=f"{peer_hot['block']} ({peer_hot['cycles']:.0f} cycles)")
