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
    """One decode-sized call per framework op (the specs' decode calls) -> (its cached planning
    path, tensor count): the recent-plan guard check the custom op's implementation runs on every
    call (the guards and the kernel choice ran once, when the cache filled)."""
    from ..ops._op import OPS
    from ..specs import decode_calls
    out = {}
    for name, c in decode_calls().items():
        op = OPS[name]
        out[name] = (functools.partial(op.plan, op.flatten(c.args, dict(c.kw))), len(c.args))
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
    of ``dispatch_calls``, with ``out`` given, or allocated by the op where it is optional, and
    validate=False where the op checks tensor contents (on a GPU that check is a host sync: the
    serving hot path, HIP graph capture included, passes metadata it made itself)."""
    from ..ops._op import OPS
    calls = {}
    for name, (plan, _) in dispatch_calls().items():
        op = OPS[name]
        flat = list(plan.args[0])
        if flat[op.out_index] is None and out_given:
            p = op.plan(flat)
            flat[op.out_index] = torch.empty(p.out_shape, dtype=p.out_dtype)
        if "validate" in op.names:
            flat[op.names.index("validate")] = False
        pos, kw = flat[:op.n_positional], dict(zip(op.names[op.n_positional:], flat[op.n_positional:]))
        calls[name] = functools.partial(op, *pos, **kw)
    return calls


def host_floors() -> dict:
    """What no op can beat: a trivial torch custom op (schema + a Python kernel that returns at
    once), and hipModuleLaunchKernel itself called through ctypes on the no-op mock runtime."""
    import ctypes

    from .. import build, mock_hip
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
    from ..launcher import use_hip_library
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
        from ..emu.__main__ import main as emu_main
        return emu_main(["bench"])
    raise ValueError(what)
