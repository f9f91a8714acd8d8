"""Peers timed beside our kernels on the same model, in the same run.

The peer of the small-M MXFP8 linear layers is the Triton ``tl.dot_scaled`` kernel that vLLM and
SGLang fall back to on ROCm (BLOCK_M 64, BLOCK_N 128, BLOCK_K 128, 8 warps). It is written here
after that algorithm (rows masked at M, N and K multiples of the blocks) and compiled for gfx950
by the Triton wheel, which only this module imports: Triton is a benchmark dependency."""
from __future__ import annotations

import functools

import torch

from ..hardware import ARCH_LIMITS
from ..specs.smallm_mxfp8 import MINIMAX_M3_LINEARS

PEER_BLOCKS = dict(BM=64, BN=128, BK=128)
PEER_WARPS = 8
WARP = ARCH_LIMITS["gfx950"]["wave_size"]     # lanes of a Triton warp on gfx950: a wave
# decode linear layers of a 6144-hidden MoE model (MiniMax-M3): TP8 qkv, TP8 o_proj, TP4 down, as (name, N, K)
SMALLM_LAYERS = tuple((f"tp{tp} {name}", N, K) for tp, name in ((8, "qkv"), (8, "o_proj"), (4, "down"))
                      for K, N in [MINIMAX_M3_LINEARS[tp][name]])
SMALLM_MS = (1, 16, 64)


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


@functools.lru_cache(maxsize=None)
def triton_gfx950(fn, signature: tuple, constexprs: tuple, warps: int) -> tuple:
    """(assembly, dynamic LDS bytes) of the Triton kernel ``fn`` compiled for gfx950 with no GPU
    (signature: (parameter, Triton type) pairs in order; constexprs: (name, value) pairs).
    Triton's kernels declare no static LDS: its launcher passes the kernel's `shared` size as
    dynamic LDS."""
    import os
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton 3.9's default, stated (it warns otherwise)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {**dict(signature), **{k: "constexpr" for k, _ in constexprs}}
    k = triton.compile(ASTSource(fn, signature=sig, constexprs=dict(constexprs)),
                       target=GPUTarget("hip", "gfx950", WARP), options={"num_warps": warps})
    return k.asm["amdgcn"], k.metadata.shared


def launch_triton(emu, asm: str, name: str, args: list, grid: tuple, warps: int, lds: int) -> None:
    """Run a Triton kernel on ``emu`` as Triton's launcher would: ``args`` in the kernel's order
    (constexprs apart), then its scratch pointers, unused here (null)."""
    from .. import asm_facts
    n_args = sum(not a[".value_kind"].startswith("hidden_") for a in asm_facts.kernel_info(asm, name).args)
    emu.launch(emu.load(asm), name, grid=tuple(grid) + (1,) * (3 - len(grid)), block=(WARP * warps, 1, 1),
               args=list(args) + [None] * (n_args - len(args)), dynamic_lds=lds)


def peer_assembly() -> tuple:
    """(assembly, dynamic LDS bytes) of the Triton peer for gfx950."""
    sig = (("a", "*fp8e4nv"), ("a_scale", "*u8"), ("b", "*fp8e4nv"), ("b_scale", "*u8"), ("c", "*bf16"),
           ("M", "i32"), ("N", "i32"), ("K", "i32"))
    return triton_gfx950(_dot_scaled_linear(), sig, tuple(PEER_BLOCKS.items()), PEER_WARPS)


def time_peer_smallm(a, sa, b, sb, machine="mi355x") -> tuple:
    """(output, timing) of the Triton peer on a [M, K] e4m3 x b [N, K] e4m3 with e8m0 scales."""
    from ..emu import Emulator
    asm, lds = peer_assembly()
    M, K = a.shape
    N = b.shape[0]
    c = torch.zeros(M, N, dtype=torch.bfloat16)
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    launch_triton(emu, asm, "dot_scaled_linear", [a, sa, b, sb, c, M, N, K],
                  (-(-M // PEER_BLOCKS["BM"]), N // PEER_BLOCKS["BN"]), PEER_WARPS, lds)
    return c, emu.last_timing


def time_ours_smallm(a, sa, b, sb, machine="mi355x") -> tuple:
    """(output, summed us, kernel symbols) of mxgemm.smallm_mxfp8_gemm with its own config choice."""
    import mxgemm

    from .. import launcher
    with launcher.emulator_settings(timing=machine, race_check=False):
        out = mxgemm.smallm_mxfp8_gemm(a, sa, b, sb)
        ts = launcher.timings()
    return out, sum(t["us"] for _, t in ts), "+".join(s for s, _ in ts)


def smallm_vs_peer(layers=SMALLM_LAYERS, ms=SMALLM_MS, out=print) -> list:
    """Ours vs the Triton peer per (layer, M): simulated us of each and peer / ours. Both outputs
    are checked against each other (they differ only in fp32 summation order) before a row is
    printed."""
    from ..quant import quantize_mx
    rows = []
    out(f"{'layer':12s} {'M':>3s} {'N':>5s} {'K':>5s} {'ours_us':>8s} {'peer_us':>8s} {'peer/ours':>9s}  ours kernel")
    for name, N, K in layers:
        g = torch.Generator().manual_seed(0)
        b, sb = quantize_mx(torch.randn(N, K, generator=g), "e4m3")
        for M in ms:
            a, sa = quantize_mx(torch.randn(M, K, generator=g), "e4m3")
            mine, us, symbol = time_ours_smallm(a, sa, b, sb)
            theirs, t = time_peer_smallm(a, sa, b, sb)
            torch.testing.assert_close(theirs.float(), mine.float(), rtol=2 ** -7, atol=1e-2)
            rows.append(dict(layer=name, M=M, N=N, K=K, ours_us=us, peer_us=t["us"], ratio=t["us"] / us,
                             kernel=symbol))
            out(f"{name:12s} {M:3d} {N:5d} {K:5d} {us:8.2f} {t['us']:8.2f} {t['us'] / us:9.2f}  {symbol}")
    return rows
