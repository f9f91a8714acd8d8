"""`python -m mxgemm bench {dispatch,emu}`: benchmarks that print numbers."""
from __future__ import annotations

import time


def _us_per_call(fn, n: int) -> float:
    fn()  # fill the planner's cache
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def _moe_gemm2_planner_call():
    """A decode-sized a4w4 gemm2 call's planner (T=4 tokens, top-8 of 256 experts)."""
    import importlib

    import torch

    from . import routing
    plan = importlib.import_module("mxgemm.ops.moe_a4w4").plan_moe_gemm2_a4w4
    T, topk, E, N, K = 4, 8, 256, 7168, 256
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)])
    r = routing.moe_sorting(ids, torch.rand(T, topk, generator=g), E, block_m=16)
    a, sa = torch.empty(T * topk, K // 2, dtype=torch.uint8), torch.empty(T * topk, K // 32, dtype=torch.uint8)
    w, sw = torch.empty(E, N, K // 2, dtype=torch.uint8), torch.empty(E, N, K // 32, dtype=torch.uint8)
    out = torch.empty(T, N, dtype=torch.bfloat16)
    args = (a, sa, w, sw, r.sorted_token_ids, r.sorted_expert_ids, r.num_valid_ids, r.sorted_weights, out)
    return lambda: plan(*args)


def main(what: str) -> int:
    if what == "dispatch":
        from .ops import smallm_mxfp8
        n = 20000
        us = smallm_mxfp8.bench_dispatch(n)
        print(f"smallm_mxfp8_gemm dispatch (cached path, planner only): {us:.2f} us/call over {n} calls "
              f"(target <= 5 us, goal 2 us)")
        us = _us_per_call(_moe_gemm2_planner_call(), n)
        print(f"moe_gemm2_a4w4 dispatch (cached path, planner only, 9 tensors): {us:.2f} us/call over {n} calls")
        return 0
    if what == "emu":
        from .emu.__main__ import main as emu_main
        return emu_main(["bench"])
    raise ValueError(what)
