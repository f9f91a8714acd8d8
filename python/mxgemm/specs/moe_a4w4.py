"""moe_gemm2_a4w4 (ops/moe_a4w4.py): MXFP4 MoE down-projection, HIP kernel and its FlyDSL port."""
from __future__ import annotations

import torch

from .. import routing
from .base import BITWISE, Call, Case, Inputs, OpSpec, Smoke, Work, grid, k_per_iteration, mx_bytes, sorted_ids, waves

OP = "moe_gemm2_a4w4"
KERNELS = {"hip": "moe_gemm2_a4w4", "flydsl": "moe_gemm2_a4w4_flydsl"}
LANGUAGE = {k: lang for lang, k in KERNELS.items()}


def _call(inp, T, topk, E, N, K, srt, language, route_rows=0, **kw) -> Call:
    out = inp.zeros(T, topk, N) if route_rows else inp.zeros(T, N)
    args = (*inp.mx(T * topk, K, fmt="e2m1"), *inp.mx(E, N, K, fmt="e2m1"), *sorted_ids(srt, inp.device),
            srt.sorted_weights.to(inp.device), out)
    return Call(OP, args, dict(language=language, **kw), out=out)


def call(kernel, v, shape, inp: Inputs) -> Call:
    T, topk, E, N, K = (shape[x] for x in ("tokens", "topk", "experts", "N", "K"))
    srt, _, _ = inp.routing(T, topk, E, v["BM"])
    return _call(inp, T, topk, E, N, K, srt, LANGUAGE[kernel], v["ROUTE_ROWS"], block_m=v["BM"], nt=v["NT"])


def work(kernel, v, tokens, topk, experts, N, K) -> Work:
    srt, _, active = Inputs("empty").routing(tokens, topk, experts, v["BM"])
    n_valid = int(srt.num_valid_ids[0])
    g = grid(kernel, v, N=N, blocks=srt.sorted_expert_ids.numel())
    live = g[0] * (n_valid // v["BM"])
    iters = -(-K // k_per_iteration(kernel, v, v["BM"], 256))     # a workgroup owns BM rows x 256 columns
    rows = tokens * topk
    out_bytes = 2 * rows * N if v["ROUTE_ROWS"] else 2 * 2 * tokens * N     # stored once, or read and written
    return Work(2.0 * rows * N * K, mx_bytes(rows, K, 4) + mx_bytes(active * N, K, 4) + out_bytes,
                "mxfp4", g, live, live * waves(kernel, v) * iters, iters)


def race(kernel, v) -> list:
    """Real rows in one expert on every m-tile of the block (20 at BM 16 / 32: both m-tiles of
    BM 32; BM - 12 above); K = 3 steps (pair loop + tail)."""
    T, K, N = max(20, v["BM"] - 12), 768, 256
    srt = routing.moe_sorting(torch.zeros(T, 1, dtype=torch.int64),
                              torch.rand(T, 1, generator=torch.Generator().manual_seed(10)) + 0.5, 1, block_m=v["BM"])
    return [_call(Inputs(seed=5), T, 1, 1, N, K, srt, LANGUAGE[kernel], v["ROUTE_ROWS"], block_m=v["BM"],
                  nt=v["NT"])]


def decode(inp: Inputs) -> dict:
    T, topk, E, N, K = 4, 8, 256, 7168, 256
    srt, _, _ = inp.routing(T, topk, E, 16)
    return {OP: _call(inp, T, topk, E, N, K, srt, "auto")}


def smoke(device) -> list:
    """Both kernels and both outputs vs the reference: on the emulator workgroups run in the
    reference's atomic order."""
    from .. import reference
    T, topk, E, N, K = 6, 2, 4, 256, 256
    out = []
    for language in KERNELS:
        for route_rows in (0, 1):
            inp = Inputs(device=device)
            srt, _, _ = inp.routing(T, topk, E, 16)
            c = _call(inp, T, topk, E, N, K, srt, language, route_rows)
            a, sa, w, sw = (t.cpu() for t in c.args[:4])
            ref = reference.moe_gemm2_a4w4_ref(a, sa, w, sw, srt.sorted_token_ids, srt.sorted_weights,
                                               srt.sorted_expert_ids, srt.num_valid_ids, 16, topk,
                                               route_rows=bool(route_rows))
            out.append(Smoke(f"{OP}[{language}] T={T} topk={topk} E={E} N={N} K={K} out {list(c.out.shape)}",
                             c, ref))
    return out


KIMI_K25 = dict(experts=385, N=7168, K=512, topk=9)   # KIMI-K2.5 MoE: E=385, hidden 7168, inter 512, top-9


def preset_kimi():
    return [Case(kernel, {"BM": bm, "NT": 0, "ROUTE_ROWS": 0}, dict(tokens=M, **KIMI_K25),
                 f"KIMI-K2.5 gemm2 M={M} BM{bm}", "not found",
                 "aiter Kimi-K2.5 fused_moe configs (PR #2619): no latencies found")
            for M in (4, 16, 64, 256) for bm in (16, 32) for kernel in KERNELS.values()]


def small():
    return [Case("moe_gemm2_a4w4", {"BM": 16, "NT": 0, "ROUTE_ROWS": 0}, dict(tokens=4, **KIMI_K25), "small a4w4")]


SPEC = OpSpec(
    name="moe_a4w4", ops=(OP,), kernels=tuple(KERNELS.values()),
    tests=("tests/test_moe_gemm2_a4w4.py", "tests/test_moe_gemm2_a4w4_parity.py"), reference=("moe_gemm2_a4w4_ref",),
    hardware_script="op_tests/test_moe_gemm2_a4w4.py", contract=BITWISE, call=call, work=work, race=race,
    decode=decode, smoke=smoke, presets={"a4w4": preset_kimi}, small=small)
