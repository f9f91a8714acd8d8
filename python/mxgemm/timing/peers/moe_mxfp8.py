"""MXFP8 MoE grouped GEMM (decode). The peer is SGLang's native MXFP8 MoE for gfx950 (the MiniMax-M3
path, ``moe_runner/triton_utils/mxfp8_moe_amd_gfx95.py``): one Triton ``tl.dot_scaled`` grouped GEMM
over moe_align_block_size's layout (block_m 64), a program per (block of 64 sorted routes, BLOCK_N
columns), blocks past num_tokens_post_padded exit, a row = route // A_DIV (gemm1: A_DIV = top_k,
the token's hidden row; gemm2: 1, the route's own row), each route written to its own output row
(gemm1 bf16; gemm2 times its top-k weight, fp32). Its launch config: BLOCK_K 128; BLOCK_N 64 and
4 warps for gemm1 with at most 32 routes and K >= 3072, else BLOCK_N 128 and 8 warps; Triton's
default stages. Written here after that source (docs/peers/moe_mxfp8.md), compiled for gfx950 by
the Triton wheel.

Both sides get one routing (seeded top-k ids): ours through ``mxgemm.routing.moe_sorting`` at its
block_m 16, the peer through the same function at block_m 64 with the ids re-encoded as
moe_align_block_size writes them (route = token * top_k + slot, padding T * top_k, its buffer
length)."""
from __future__ import annotations

import functools

import torch

from ...routing import decode_sorted_id, moe_sorting
from . import NoPeer, compile_as_launched, launch_triton, time_ours

PEER_BLOCK_M = 64          # fused_moe_mxfp8_native's moe_align_block_size block
OUR_BLOCK_M = 16           # specs/moe_mxfp8.py's block_m
PEER = ("SGLang's native MXFP8 MoE for gfx950 (Triton tl.dot_scaled grouped GEMM over moe_align_block_size, "
        "block_m 64, BLOCK_K 128, BLOCK_N 64 / 4 warps or 128 / 8 warps)")
# MiniMax-M3 (hidden 6144) experts at TP4, as specs/moe_mxfp8.py's preset: (N, K, a row per route)
GEMMS = {"gemm1": (1536, 6144, False), "gemm2": (6144, 768, True)}
# (gemm, experts, top-k, tokens): the extremes of each axis (E 32 / 256, top-1 / top-8, M_routed 1, 8,
# 256), gemm2 (K 768) first, cheapest first: the full grid (E 32 / 256 x top-1 T 1 / 32 / 256 and
# top-8 T 1 / 4 / 32, both GEMMs: 24 cells) did not fit the time budget on the emulator
# (docs/peers/moe_mxfp8.md)
CELLS = (("gemm2", 32, 1, 1), ("gemm2", 256, 8, 1), ("gemm2", 256, 8, 32),
         ("gemm1", 32, 1, 1), ("gemm1", 256, 8, 1), ("gemm1", 256, 8, 32))
ROUNDS = 3          # rounds of XCD 0's workgroups simulated (as `python -m mxgemm time`), XCD 0's alone


@functools.lru_cache(maxsize=None)
def _grouped_gemm_mx():
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_gemm_mx(a, a_scale, b, b_scale, c, topk_weights, sorted_token_ids, expert_ids,
                        num_tokens_post_padded, E, N, K, num_valid_tokens, A_DIV: tl.constexpr,
                        MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        if pid_m * BLOCK_M >= tl.load(num_tokens_post_padded):
            return
        route = tl.load(sorted_token_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        live = route < num_valid_tokens
        expert = tl.load(expert_ids + pid_m).to(tl.int64)
        has_expert = (expert >= 0) & (expert < E)       # a filtered route's bucket reads nothing
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        in_n = rn < N
        row = route // A_DIV
        rk, rs = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_K // 32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            x = tl.load(a + row[:, None] * K + k * BLOCK_K + rk[None, :], mask=live[:, None], other=0.0)
            y = tl.load(b + expert * N * K + rn[:, None] * K + k * BLOCK_K + rk[None, :],
                        mask=has_expert & in_n[:, None], other=0.0)
            xs = tl.load(a_scale + row[:, None] * (K // 32) + k * (BLOCK_K // 32) + rs[None, :],
                         mask=live[:, None], other=0)
            ys = tl.load(b_scale + expert * N * (K // 32) + rn[:, None] * (K // 32) + k * (BLOCK_K // 32)
                         + rs[None, :], mask=has_expert & in_n[:, None], other=0)
            acc += tl.dot_scaled(x, xs, "e4m3", y.T, ys, "e4m3")
        if MUL_WEIGHT:
            acc = acc * tl.load(topk_weights + route, mask=live, other=0.0)[:, None]
        tl.store(c + route[:, None] * N + rn[None, :], acc.to(c.dtype.element_ty), mask=live[:, None] & in_n[None, :])

    return grouped_gemm_mx


def peer_config(per_route: bool, routes: int, K: int) -> tuple:
    """(BLOCK_N, warps) as fused_moe_mxfp8_native's launcher picks them."""
    return (64, 4) if not per_route and routes <= 32 and K >= 3072 else (128, 8)


def peer_layout(topk_ids, E: int) -> tuple:
    """(sorted_token_ids, expert_ids, num_tokens_post_padded) as SGLang's moe_align_block_size
    returns them for block 64: routes token * top_k + slot grouped by expert, each expert padded to
    64 with T * top_k; its buffer holds routes * 64 ids when routes < E + 1, else
    routes + (E + 1) * 63."""
    T, top_k = topk_ids.shape
    routes = T * top_k
    srt = moe_sorting(topk_ids, torch.ones(T, top_k), E, block_m=PEER_BLOCK_M)
    n = routes * PEER_BLOCK_M if routes < E + 1 else routes + (E + 1) * (PEER_BLOCK_M - 1)
    ids = torch.full((n,), routes, dtype=torch.int32)
    valid = int(srt.num_valid_ids[0])
    tok, slot = decode_sorted_id(srt.sorted_token_ids[:valid])
    ids[:valid] = torch.where(tok < T, tok * top_k + slot, routes).to(torch.int32)
    experts = torch.full((-(-n // PEER_BLOCK_M),), -1, dtype=torch.int32)
    experts[:valid // PEER_BLOCK_M] = srt.sorted_expert_ids[:valid // PEER_BLOCK_M]
    return ids, experts, srt.num_valid_ids[:1].clone()


def time_peer(a, sa, w, sw, topk_ids, weights=None, machine="mi355x", rounds=ROUNDS) -> tuple:
    """(output [T * top_k, N] in route order, timing) of the Triton peer. gemm1: ``a`` [T, K], no
    weights, bf16 out; gemm2: ``a`` [T * top_k, K] or [T, top_k, K] (a row per route), ``weights``
    [T, top_k], fp32 out."""
    from ...emu import Emulator
    E, N, K = w.shape
    if K % 128:
        raise NoPeer(f"the peer reads whole BLOCK_K 128 slices with no K mask: K % 128 == 0, got K={K}")
    T, top_k = topk_ids.shape
    per_route = weights is not None
    a, sa = a.reshape(-1, K), sa.reshape(-1, K // 32)
    block_n, warps = peer_config(per_route, T * top_k, K)
    ids, experts, post = peer_layout(topk_ids, E)
    # NaN: what a rounds-sampled launch leaves unwritten (check compares the rest)
    c = torch.full((T * top_k, N), float("nan"), dtype=torch.float32 if per_route else torch.bfloat16)
    tw = (weights if per_route else torch.zeros(T, top_k)).float().contiguous()
    args = dict(a=a, a_scale=sa, b=w, b_scale=sw, c=c, topk_weights=tw, sorted_token_ids=ids, expert_ids=experts,
                num_tokens_post_padded=post, E=E, N=N, K=K, num_valid_tokens=T * top_k)
    consts = (("A_DIV", 1 if per_route else top_k), ("MUL_WEIGHT", per_route), ("BLOCK_M", PEER_BLOCK_M),
              ("BLOCK_N", block_n), ("BLOCK_K", 128))
    asm, lds, launch = compile_as_launched(_grouped_gemm_mx(), args, consts, warps)
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    grid = (-(-ids.numel() // PEER_BLOCK_M), -(-N // block_n))
    launch_triton(emu, asm, "grouped_gemm_mx", launch, grid, warps, lds, rounds=rounds, xcd0=True)
    return c, emu.last_timing


def operands(tokens, topk, E, N, K, per_route, srt, seed=0) -> tuple:
    """(a, a_scale, w, w_scale): quantised Gaussians; a [tokens, K] or [tokens, topk, K]. Only the
    routed experts' weights are written (the rest of [E, N, K] is never read and stays untouched
    memory, so a 256-expert layer costs only its routed experts)."""
    from ...quant import quantize_mx
    g = torch.Generator().manual_seed(seed)
    a, sa = quantize_mx(torch.randn(*((tokens, topk) if per_route else (tokens,)), K, generator=g), "e4m3")
    w = torch.empty(E, N, K, dtype=torch.float8_e4m3fn)
    sw = torch.empty(E, N, K // 32, dtype=torch.uint8)
    n = int(srt.num_valid_ids[0])
    for e in srt.sorted_expert_ids[:n // OUR_BLOCK_M].unique().tolist():
        w[e], sw[e] = quantize_mx(torch.randn(N, K, generator=g), "e4m3")
    return a, sa, w, sw


def routing(tokens, topk, E, seed=0):
    """(topk_ids, top-k weights, our moe_sorting layout at block_m 16) of seeded uniform routing
    with distinct experts per token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(tokens)])
    weights = torch.rand(tokens, topk, generator=g)
    return ids, weights, moe_sorting(ids, weights, E, block_m=OUR_BLOCK_M)


def reference(a, sa, w, sw, srt, tokens, topk, weights) -> torch.Tensor:
    """The exact product [tokens * topk, N] in (token, slot) order (mxgemm.reference's fp32 model;
    gemm1 bf16, gemm2 weighted fp32): gemm2's per-route rows are gemm1 rows of a [tokens * topk, K]
    input."""
    from ... import reference as ref
    K, ids, slots = a.shape[-1], srt.sorted_token_ids, topk
    if a.dim() == 3:   # each route its own token of one slot
        tok, slot = decode_sorted_id(ids)
        ids = torch.where(tok < tokens, tok * topk + slot, tokens * topk).to(torch.int32)
        a, sa, slots = a.reshape(-1, K), sa.reshape(-1, K // 32), 1
    want = ref.moe_mxfp8_grouped_gemm_ref(a, sa, w, sw, ids, srt.sorted_expert_ids, srt.num_valid_ids, OUR_BLOCK_M,
                                          slots,
                                          sorted_weights=srt.sorted_weights if weights is not None else None,
                                          out_dtype=torch.float32 if weights is not None else torch.bfloat16)
    return want.reshape(tokens * topk, -1)


def check(got, want, sampled: bool, who: str) -> None:
    """``got`` equals the exact product up to fp32 summation order: everywhere, or (a sampled launch
    writes only its simulated workgroups' tiles; the rest is left NaN, the peer's buffer, or 0, the
    op's) wherever it wrote, which must be somewhere."""
    if sampled:
        wrote = ~got.isnan() & (got != 0)
        if not wrote.any():
            raise AssertionError(f"{who}: the sampled launch wrote no output element")
        got, want = got[wrote], want[wrote]
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-2, msg=lambda m: f"{who}: {m}")


def cells() -> list:
    return [dict(label=f"{g} E={E} topk={k} T={T} (M_routed {T * k}) N={GEMMS[g][0]} K={GEMMS[g][1]}", gemm=g, E=E,
                 topk=k, tokens=T, N=GEMMS[g][0], K=GEMMS[g][1], per_route=GEMMS[g][2]) for g, E, k, T in CELLS]


def ours(a, sa, w, sw, srt, topk, weights=None, config="") -> torch.Tensor:
    """Our op on the cell's operands and the same output contract as the peer (gemm1: bf16, no
    weights; gemm2: ``weights``, fp32) -> [T, topk, N]."""
    import mxgemm
    return mxgemm.moe_mxfp8_grouped_gemm(
        a, sa, w, sw, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids, topk_weights=weights,
        block_m=OUR_BLOCK_M, topk=topk, out_dtype=torch.bfloat16 if weights is None else torch.float32,
        config=config, fallback="error")


def run(cell, machine="mi355x", rounds=ROUNDS) -> dict:
    """Ours (its own config choice) and the peer on one cell, both timed on rounds-sampled launches
    with the same output contract (gemm1 bf16; gemm2 weighted, fp32); both products checked against
    the exact reference before the row counts."""
    T, k, E, N, K, per_route = (cell[x] for x in ("tokens", "topk", "E", "N", "K", "per_route"))
    ids, weights, srt = routing(T, k, E)
    a, sa, w, sw = operands(T, k, E, N, K, per_route, srt)
    tw = weights if per_route else None
    mine, us, symbol, t = time_ours(lambda: ours(a, sa, w, sw, srt, k, tw), machine, rounds, xcd0=True)
    theirs, tp = time_peer(a, sa, w, sw, ids, tw, machine, rounds)
    want = reference(a, sa, w, sw, srt, T, k, tw)
    check(mine.view(T * k, N), want, t["sampled"], "ours")
    check(theirs, want, tp["sampled"], "peer")
    return dict(ours_us=us, peer_us=tp["us"], ours_kernel=symbol, ours_limiter=t["limiter"],
                peer_limiter=tp["limiter"], sampled=t["sampled"] or tp["sampled"])
