"""moe_mxfp8_grouped_gemm (ops/moe_mxfp8.py): MXFP8 MoE grouped GEMM over moe_sorting's layout."""
from __future__ import annotations

import torch

from .. import routing
from ..ops.moe_mxfp8 import MFMA_CHUNK, MFMA_K, grid_blocks
from .base import Call, Case, Contract, Inputs, OpSpec, Smoke, Work, grid, mx_bytes, sorted_ids, waves

OP = "moe_mxfp8_grouped_gemm"
KERNEL = "smallm_mxfp8_moe_grouped_gemm"
BLOCK_M = 16


def call(kernel, v, shape, inp: Inputs) -> Call:
    T, topk, E, N, K = (shape[x] for x in ("tokens", "topk", "experts", "N", "K"))
    srt, _, _ = inp.routing(T, topk, E, BLOCK_M)
    args = (*inp.mx(T, K), *inp.mx(E, N, K), *sorted_ids(srt, inp.device))
    return Call(OP, args, dict(block_m=BLOCK_M, topk=topk, config=v, fallback="error"))


def work(kernel, v, tokens, topk, experts, N, K) -> Work:
    srt, _, active = Inputs("empty").routing(tokens, topk, experts, BLOCK_M)
    n_valid = int(srt.num_valid_ids[0])
    ids = srt.sorted_token_ids[:n_valid].view(-1, BLOCK_M) & 0xFFFFFF
    live = (ids < tokens).view(n_valid // BLOCK_M, -1, v["M_CHUNK"]).any(2)   # chunks with a real row
    routes = tokens * topk
    rows = grid_blocks(srt.sorted_expert_ids.numel(), -(-N // v["BLOCK_N"]), BLOCK_M, experts, routes)
    g = grid(kernel, v, N=N, grid_blocks=rows)
    chunks = live.sum(1)                                          # live chunks per block; row y takes y, y + rows, ...
    per_row = torch.zeros(rows, dtype=chunks.dtype).index_add_(0, torch.arange(chunks.numel()) % rows, chunks)
    # a wave's K loop iterations: two 128-wide MFMA steps each, or one of the GEMV core's 256 / BLOCK_N
    # lanes per weight row
    iters = -(-K // MFMA_K) // 2 if v["M_CHUNK"] == MFMA_CHUNK else -(-K // (32 * 256 // v["BLOCK_N"]))
    return Work(2.0 * routes * N * K, mx_bytes(tokens, K, 8) + mx_bytes(active * N, K, 8) + 2 * routes * N,
                "fp8", g, g[0] * min(rows, chunks.numel()), g[0] * waves(kernel, v) * int(live.sum()) * iters,
                iters * int(per_row.max()))


def race(kernel, v) -> list:
    """Expert 0: 6 real rows + padding (two live M_CHUNKs of 2 or 4); expert 1: one row. Blocks of
    8 rows, or of the chunk when it is larger (16). K 256; the MFMA chunk also K 640: two 128-K
    steps (its two-step loop ends with the next step's loads in flight) and five (the loop runs
    twice and its one-step tail runs)."""
    T, N, bm = 7, v["BLOCK_N"], max(8, v["M_CHUNK"])
    srt = routing.moe_sorting(torch.tensor([[0], [0], [0], [1], [0], [0], [0]]),
                              torch.rand(T, 1, generator=torch.Generator().manual_seed(10)) + 0.5, 2, block_m=bm)
    inp = Inputs(seed=3)
    kw = dict(topk_weights=srt.sorted_weights.new_ones(T, 1), block_m=bm, config=v, fallback="error")
    return [Call(OP, (*inp.mx(T, K), *inp.mx(2, N, K), *sorted_ids(srt, "cpu")), kw)
            for K in ((256, 640) if v["M_CHUNK"] == MFMA_CHUNK else (256,))]


def decode(inp: Inputs) -> dict:
    T, topk, E, K = 4, 8, 256, 4096
    srt, _, _ = inp.routing(T, topk, E, BLOCK_M)
    return {OP: Call(OP, (*inp.mx(T, K), *inp.mx(E, 64, K), *sorted_ids(srt, inp.device)),
                     dict(block_m=BLOCK_M, topk=topk))}


def smoke(device) -> list:
    from .. import reference
    inp = Inputs(device=device)
    T, E, topk, N, K, bm = 3, 4, 2, 64, 128, 4
    x, xs = inp.mx(T, K)
    w, ws = inp.mx(E, N, K)
    srt, tw, _ = Inputs(seed=1).routing(T, topk, E, bm)
    c = Call(OP, (x, xs, w, ws, *sorted_ids(srt, device)), dict(topk_weights=tw.to(device), block_m=bm))
    ref = reference.moe_mxfp8_grouped_gemm_ref(*(t.cpu() for t in c.args), bm, topk, sorted_weights=srt.sorted_weights)
    return [Smoke(f"{OP} T={T} E={E} topk={topk} N={N} K={K}", lambda: c().cpu(), ref)]


def preset_decode():
    """MiniMax-M3 MoE at TP4 (128 experts, top-4): gemm1 (gate_up, N 1536, K 6144) and gemm2 (N 6144,
    K 768). aiter's wrapper lists where its kernel beat Triton on MI355X (_MOE_ALLOWLIST, routed rows)."""
    wins = {1536: "beats Triton for 4..16 routed rows", 6144: "beats Triton for 4..8 routed rows"}
    return [Case(KERNEL, {"BLOCK_N": 16, "M_CHUNK": 4}, dict(tokens=T, topk=4, experts=128, N=N, K=K),
                 f"M3 TP4 {name} T={T}", wins[N], "aiter smallm_gemm_mxfp8.py _MOE_ALLOWLIST (PR #3783); us not found")
            for name, N, K in (("gemm1", 1536, 6144), ("gemm2", 6144, 768)) for T in (1, 2, 4, 16)]


SPEC = OpSpec(
    name="moe_mxfp8", ops=(OP,), kernels=(KERNEL,), tests=("tests/test_moe_mxfp8_grouped_gemm.py",),
    reference=("moe_mxfp8_grouped_gemm_ref",), hardware_script="op_tests/test_moe_mxfp8.py",
    contract=Contract(ulp=1, exact=0.99), call=call, work=work, race=race, decode=decode, smoke=smoke,
    presets={"moe_mxfp8": preset_decode})
