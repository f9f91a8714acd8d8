"""MXFP8 MoE grouped GEMM (decode). The peer is the Triton fused-MoE kernel of vLLM / SGLang
(``fused_moe_kernel``: one program per (BLOCK_SIZE_M block of sorted_token_ids, BLOCK_SIZE_N
columns), grouped pid order, blocks past num_tokens_post_padded exit, a row = token // top_k,
the expert's weights per block from expert_ids, outputs scattered to the unsorted rows) with the
MX scales applied by ``tl.dot_scaled`` as aiter's Triton fused-MoE MX kernel does, at vLLM's
default config for decode (M <= E: BLOCK_SIZE_M 16, BLOCK_SIZE_N 32, BLOCK_SIZE_K 64,
GROUP_SIZE_M 1; Triton's defaults 4 warps, 2 stages on HIP). Written here after those sources
(docs/peers/moe_mxfp8.md), compiled for gfx950 by the Triton wheel.

Both sides get one routing from ``mxgemm.routing.moe_sorting`` (block_m 16, the peer's
BLOCK_SIZE_M): the same expert-sorted, padded blocks; the peer's ids are re-encoded as vLLM's
moe_align_block_size writes them (token * top_k + slot, padding top_k * T, its buffer length
T * top_k + E * (BLOCK_SIZE_M - 1))."""
from __future__ import annotations

import functools

import torch

from ...routing import decode_sorted_id
from . import launch_triton, time_ours, triton_gfx950

PEER_BLOCKS = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1)
PEER_WARPS = 4
PEER = ("Triton fused_moe_kernel (vLLM / SGLang) with tl.dot_scaled MX scales (aiter's Triton MoE MX path), "
        "vLLM's default decode config BLOCK 16/32/64, GROUP_SIZE_M 1, 4 warps")
# MiniMax-M3 (hidden 6144) experts at TP4, as specs/moe_mxfp8.py's preset: (name, N, K, a per slot)
GEMMS = (("gemm1", 1536, 6144, False), ("gemm2", 6144, 768, True))
EXPERTS = (32, 256)
ROUTES = ((1, 1), (1, 32), (1, 256), (8, 1), (8, 4), (8, 32))     # (top-k, tokens): M_routed 1..256
ROUNDS = 3          # rounds of XCD 0's workgroups simulated (as `python -m mxgemm time`)
BLOCK_M = PEER_BLOCKS["BLOCK_SIZE_M"]


@functools.lru_cache(maxsize=None)
def _fused_moe_mx():
    import triton
    import triton.language as tl

    @triton.jit
    def fused_moe_mx(a, a_scale, b, b_scale, c, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                     N, K, EM, num_valid_tokens, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                     BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
                     top_k: tl.constexpr):
        pid = tl.program_id(0)
        blocks_m, blocks_n = tl.cdiv(EM, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N)
        first_m = pid // (GROUP_SIZE_M * blocks_n) * GROUP_SIZE_M
        group_m = min(blocks_m - first_m, GROUP_SIZE_M)
        pid_m = first_m + pid % (GROUP_SIZE_M * blocks_n) % group_m
        pid_n = pid % (GROUP_SIZE_M * blocks_n) // group_m
        if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded):
            return
        slot = tl.load(sorted_token_ids + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64))
        live = slot < num_valid_tokens
        rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        expert = tl.load(expert_ids + pid_m).to(tl.int64)
        if expert == -1:        # an expert of another rank: zeros
            tl.store(c + slot[:, None] * N + rn[None, :], tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), tl.bfloat16),
                     mask=live[:, None] & (rn[None, :] < N))
            return
        row = slot // top_k
        wn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
        rk, rs = tl.arange(0, BLOCK_SIZE_K), tl.arange(0, BLOCK_SIZE_K // 32)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, K // BLOCK_SIZE_K):
            x = tl.load(a + row[:, None] * K + k * BLOCK_SIZE_K + rk[None, :], mask=live[:, None], other=0.0)
            xs = tl.load(a_scale + row[:, None] * (K // 32) + k * (BLOCK_SIZE_K // 32) + rs[None, :],
                         mask=live[:, None], other=0)
            y = tl.load(b + expert * N * K + wn[:, None] * K + k * BLOCK_SIZE_K + rk[None, :])
            ys = tl.load(b_scale + expert * N * (K // 32) + wn[:, None] * (K // 32) + k * (BLOCK_SIZE_K // 32)
                         + rs[None, :])
            acc = tl.dot_scaled(x, xs, "e4m3", y.T, ys, "e4m3", acc, fast_math=True)
        if MUL_ROUTED_WEIGHT:
            acc = acc * tl.load(topk_weights + slot, mask=live, other=0)[:, None]
        tl.store(c + slot[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=live[:, None] & (rn[None, :] < N))

    return fused_moe_mx


def peer_assembly(top_k: int, weighted: bool) -> tuple:
    """(assembly, dynamic LDS bytes) of the Triton peer for gfx950."""
    sig = (("a", "*fp8e4nv"), ("a_scale", "*u8"), ("b", "*fp8e4nv"), ("b_scale", "*u8"), ("c", "*bf16"),
           ("topk_weights", "*fp32"), ("sorted_token_ids", "*i32"), ("expert_ids", "*i32"),
           ("num_tokens_post_padded", "*i32"), ("N", "i32"), ("K", "i32"), ("EM", "i32"), ("num_valid_tokens", "i32"))
    consts = (*PEER_BLOCKS.items(), ("MUL_ROUTED_WEIGHT", weighted), ("top_k", top_k))
    return triton_gfx950(_fused_moe_mx(), sig, consts, PEER_WARPS)


def peer_layout(srt, tokens: int, topk: int, experts: int) -> tuple:
    """(sorted_token_ids, expert_ids) of moe_sorting's blocks as vLLM's moe_align_block_size writes
    them: token * topk + slot, padding tokens * topk, length tokens * topk + experts * (BLOCK_M - 1)."""
    n = tokens * topk + experts * (BLOCK_M - 1)
    tok, slot = decode_sorted_id(srt.sorted_token_ids[:n])
    ids = torch.where(tok < tokens, tok * topk + slot, tokens * topk).to(torch.int32)
    return ids, srt.sorted_expert_ids[:-(-n // BLOCK_M)].contiguous()


def time_peer(a, sa, w, sw, srt, tokens, topk, weights=None, machine="mi355x", rounds=ROUNDS) -> tuple:
    """(output [tokens * topk, N] in (token, slot) order, timing) of the Triton peer. ``a``: [tokens, K]
    (gemm1: a row per token, top_k = topk) or [tokens * topk, K] (gemm2: a row per route, top_k = 1,
    rows weighted by ``weights`` [tokens, topk])."""
    from ...emu import Emulator
    E, N, K = w.shape
    per_route = a.shape[0] == tokens * topk and weights is not None
    top_k = 1 if per_route else topk
    asm, lds = peer_assembly(top_k, weights is not None)
    ids, experts = peer_layout(srt, tokens, topk, E)
    # vLLM's launch: EM = sorted ids' length, cut to tokens * top_k * BLOCK_M when tokens < BLOCK_M
    EM = ids.numel() if a.shape[0] >= BLOCK_M else min(ids.numel(), a.shape[0] * top_k * BLOCK_M)
    c = torch.zeros(tokens * topk, N, dtype=torch.bfloat16)
    tw = (weights if weights is not None else torch.zeros(tokens, topk)).float().contiguous()
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    grid = (-(-EM // BLOCK_M) * -(-N // PEER_BLOCKS["BLOCK_SIZE_N"]),)
    launch_triton(emu, asm, "fused_moe_mx", [a, sa, w, sw, c, tw, ids, experts, srt.num_valid_ids[:1].clone(),
                                             N, K, EM, tokens * topk], grid, PEER_WARPS, lds, rounds=rounds)
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
    for e in srt.sorted_expert_ids[:n // BLOCK_M].unique().tolist():
        w[e], sw[e] = quantize_mx(torch.randn(N, K, generator=g), "e4m3")
    return a, sa, w, sw


def routing(tokens, topk, E, seed=0):
    """moe_sorting's layout (block_m 16) of seeded uniform routing with distinct experts per token,
    and the top-k weights."""
    from ...routing import moe_sorting
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(tokens)])
    weights = torch.rand(tokens, topk, generator=g)
    return moe_sorting(ids, weights, E, block_m=BLOCK_M), weights


def in_route_order(out, srt, tokens, topk):
    """Rows of our sorted output [S, N] at the peer's (token * topk + slot) positions."""
    n = int(srt.num_valid_ids[0])
    tok, slot = decode_sorted_id(srt.sorted_token_ids[:n])
    real = (tok < tokens).nonzero().squeeze(1)
    dense = torch.zeros(tokens * topk, out.shape[1], dtype=out.dtype)
    dense[(tok[real] * topk + slot[real]).long()] = out[real]
    return dense


def reference(a, sa, w, sw, srt, tokens, topk, weights) -> torch.Tensor:
    """The exact product [tokens * topk, N] in (token, slot) order (mxgemm.reference's fp32 model);
    gemm2's per-route rows are gemm1 rows of a [tokens * topk, K] input."""
    from ... import reference as ref
    K, ids = a.shape[-1], srt.sorted_token_ids
    if a.dim() == 3:
        tok, slot = decode_sorted_id(ids)
        ids = torch.where(tok < tokens, tok * topk + slot, tokens * topk).to(torch.int32)
        a, sa = a.reshape(-1, K), sa.reshape(-1, K // 32)
    want = ref.moe_mxfp8_grouped_gemm_ref(a, sa, w, sw, ids, srt.sorted_expert_ids, srt.num_valid_ids, BLOCK_M,
                                          sorted_weights=srt.sorted_weights if weights is not None else None)
    return in_route_order(want, srt, tokens, topk)


def check(got, want, sampled: bool, who: str) -> None:
    """``got`` equals the exact product up to fp32 summation order: everywhere, or (a sampled launch
    writes only its simulated workgroups' tiles) wherever it wrote, which must be somewhere."""
    if sampled:
        wrote = got != 0
        if not wrote.any():
            raise AssertionError(f"{who}: the sampled launch wrote no output element")
        got, want = got[wrote], want[wrote]
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-2, msg=lambda m: f"{who}: {m}")


def cells() -> list:
    return [dict(label=f"{g} E={E} topk={k} T={T} (M_routed {T * k}) N={N} K={K}", gemm=g, E=E, topk=k, tokens=T,
                 N=N, K=K, per_route=r)
            for g, N, K, r in GEMMS for E in EXPERTS for k, T in ROUTES]


def run(cell, machine="mi355x", rounds=ROUNDS) -> dict:
    """Ours (its own config choice) and the peer on one cell, both timed on rounds-sampled launches;
    both products checked against the exact reference before the row counts."""
    import mxgemm
    T, k, E, N, K, per_route = (cell[x] for x in ("tokens", "topk", "E", "N", "K", "per_route"))
    srt, weights = routing(T, k, E)
    a, sa, w, sw = operands(T, k, E, N, K, per_route, srt)
    tw = weights if per_route else None
    mine, us, symbol, t = time_ours(lambda: mxgemm.moe_mxfp8_grouped_gemm(
        a, sa, w, sw, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids, topk_weights=tw,
        block_m=BLOCK_M, fallback="error"), machine, rounds)
    pa, psa = (a.view(T * k, K), sa.view(T * k, K // 32)) if per_route else (a, sa)
    theirs, tp = time_peer(pa, psa, w, sw, srt, T, k, tw, machine, rounds)
    want = reference(a, sa, w, sw, srt, T, k, tw)
    check(in_route_order(mine, srt, T, k), want, t["sampled"], "ours")
    check(theirs, want, tp["sampled"], "peer")
    return dict(ours_us=us, peer_us=tp["us"], ours_kernel=symbol, ours_limiter=t["limiter"],
                peer_limiter=tp["limiter"], sampled=t["sampled"] or tp["sampled"])
