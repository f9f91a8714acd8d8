"""`python -m mxgemm bench {dispatch,host,emu}`: benchmarks that print numbers."""
from __future__ import annotations

import functools
import statistics
import time

import torch


def _us_per_call(fn, n: int) -> float:
    """CPU microseconds per call, best of 3 runs of n calls: process time, so that other
    processes sharing the cores (CI) do not count."""
    fn()  # fill the plan cache
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def dispatch_calls() -> dict:
    """One decode-sized call per op -> (its cached planning path, tensor count): the recent-plan
    guard check the custom op's implementation runs on every call (the guards and the kernel
    choice ran once, when the cache filled)."""
    from . import routing
    from .ops._op import OPS
    g = torch.Generator().manual_seed(0)
    u8 = lambda *s: torch.empty(*s, dtype=torch.uint8)  # noqa: E731
    e4m3 = lambda *s: torch.empty(*s, dtype=torch.float8_e4m3fn)  # noqa: E731
    M, N, K = 1, 4096, 4096
    T, topk, E = 4, 8, 256
    r16 = routing.moe_sorting(torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)]),
                              torch.rand(T, topk, generator=g), E, block_m=16)
    ids = (r16.sorted_token_ids, r16.sorted_expert_ids, r16.num_valid_ids)
    N2, K2 = 7168, 256
    lens = torch.full((8,), 512, dtype=torch.int64)
    scale = lambda: torch.ones(1)  # noqa: E731
    calls = {
        "smallm_mxfp8_gemm": ((e4m3(M, K), u8(M, K // 32), e4m3(N, K), u8(N, K // 32)), {}),
        "moe_mxfp8_grouped_gemm": ((e4m3(T, K), u8(T, K // 32), e4m3(E, 64, K), u8(E, 64, K // 32), *ids),
                                   {"block_m": 16}),
        "moe_gemm2_a4w4": ((u8(T * topk, K2 // 2), u8(T * topk, K2 // 32), u8(E, N2, K2 // 2), u8(E, N2, K2 // 32),
                            *ids, r16.sorted_weights, torch.empty(T, N2, dtype=torch.bfloat16)), {}),
        "mxfp8_dequantize": ((u8(M, K), u8(M, K // 32)), {}),
        # DeepSeek-V3 masked decode: 8 groups of up to 64 rows, N=4096, K=7168
        "deep_gemm_fp8_grouped_gemm": ((e4m3(8, 64, 7168), torch.empty(8, 64, 56), e4m3(8, 4096, 7168),
                                        torch.empty(8, 32, 56), torch.empty(8, dtype=torch.int32),
                                        torch.empty(8, 64, 4096, dtype=torch.bfloat16)), {"masked": True}),
        # a training step's MoE layer: 8 experts, 4096 routed rows
        "grouped_gemm_fp8_kernel": ((e4m3(4096, 2048), scale(), e4m3(8, 1024, 2048), scale(), lens), {}),
        "grouped_gemm_fp8_variable_k": ((e4m3(4096, 1024), scale(), e4m3(4096, 2048), scale(), lens), {}),
        # prefill: 4096 tokens through a DeepSeek-V3 7168 -> 2112 projection, MXFP4 weights (A8W4)
        "mx_gemm": ((e4m3(4096, 7168), u8(4096, 224), u8(2112, 3584), u8(2112, 224)), {"b_format": "e2m1"}),
    }
    out = {}
    for name, (args, kw) in calls.items():
        op = OPS[name]
        flat = op.flatten(args, dict(kw))
        out[name] = (functools.partial(op.plan, flat), len(args))
    return out


def _median_us(fn, n: int, batches: int = 9) -> float:
    """Median over ``batches`` of the CPU microseconds per call of n calls (process time, so
    other processes sharing the cores do not count)."""
    fn()
    times = []
    for _ in range(batches):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        times.append((time.process_time() - t0) / n * 1e6)
    return statistics.median(times)


def host_calls(out_given: bool = True) -> dict:
    """op name -> a whole public call (Python entry to launch return) on the decode-sized inputs
    of ``dispatch_calls``, with ``out`` given, or allocated by the op where it is optional."""
    from .ops._op import OPS
    calls = {}
    for name, (plan, _) in dispatch_calls().items():
        op = OPS[name]
        flat = list(plan.args[0])
        if flat[op.out_index] is None and out_given:
            p = op.plan(flat)
            flat[op.out_index] = torch.empty(p.out_shape, dtype=p.out_dtype)
        pos, kw = flat[:op.n_positional], dict(zip(op.names[op.n_positional:], flat[op.n_positional:]))
        calls[name] = functools.partial(op, *pos, **kw)
    return calls


def host_floors() -> dict:
    """What no op can beat: a trivial torch custom op (schema + a Python kernel that returns at
    once), and hipModuleLaunchKernel itself called through ctypes on the no-op mock runtime."""
    import ctypes

    from . import build, mock_hip
    lib = torch.library.Library("mxgemm_bench", "FRAGMENT")
    lib.define("noop(Tensor a, Tensor(a!) out) -> ()")
    lib.impl("noop", lambda a, out: None, "CompositeExplicitAutograd")
    noop, t = torch.ops.mxgemm_bench.noop.default, torch.empty(1)
    hip = ctypes.CDLL(str(mock_hip.noop_library()))
    fn, module = ctypes.c_void_p(), ctypes.c_void_p()
    art = build.artifact("mxfp8_dequant", {}, "gfx950")
    assert hip.hipModuleLoadData(ctypes.byref(module), art.hsaco_path.read_bytes()) == 0
    assert hip.hipModuleGetFunction(ctypes.byref(fn), module, art.symbol.encode()) == 0
    args = (ctypes.c_char * 64)()
    size = ctypes.c_size_t(64)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(args), 2, ctypes.addressof(size), 3)
    launch = functools.partial(hip.hipModuleLaunchKernel, fn, 1, 1, 1, 64, 1, 1, 0, None, None, extra)
    return {"trivial torch custom op (floor)": lambda lib=lib: noop(t, t),   # the op lives while lib does
            "hipModuleLaunchKernel via ctypes": launch}


def host(n: int = 2000) -> dict:
    """op -> (median host microseconds per whole call with out given, the same with out
    allocated or None where the op requires out) on the no-op mock runtime, floors included."""
    from .launcher import use_hip_library
    out = {name: (_median_us(fn, n), None) for name, fn in host_floors().items()}
    with use_hip_library("mock-noop"):
        given, allocated = host_calls(), host_calls(out_given=False)
        for name, fn in given.items():
            optional = allocated[name].keywords.get("out", False) is None
            out[name] = (_median_us(fn, n), _median_us(allocated[name], n) if optional else None)
    return out


def main(what: str) -> int:
    if what == "dispatch":
        n = 20000
        for name, (fn, n_tensors) in dispatch_calls().items():
            print(f"{name} dispatch (cached path: recent-plan guard, {n_tensors} tensors): "
                  f"{_us_per_call(fn, n):.2f} us CPU/call over {n} calls (goal <= 2 us)")
        return 0
    if what == "host":
        times = host()
        floor = times["trivial torch custom op (floor)"][0]
        print("host time of a whole call (Python entry to launch return; no-op mock HIP runtime), median CPU us")
        print(f"  {'':36s} {'out given':>9s} {'vs floor':>9s} {'out allocated':>14s}")
        for name, (us, alloc) in times.items():
            print(f"  {name:36s} {us:9.2f} {us / floor:8.2f}x {'' if alloc is None else f'{alloc:14.2f}'}")
        return 0
    if what == "emu":
        from .emu.__main__ import main as emu_main
        return emu_main(["bench"])
    raise ValueError(what)
