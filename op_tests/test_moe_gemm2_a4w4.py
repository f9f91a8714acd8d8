"""moe_gemm2_a4w4 (a4w4 MXFP4 MoE down-projection): hardware check + HIP vs FlyDSL benchmark.

On an MI355X (gfx950 GPU, ROCm torch), for each token count M it checks both backends
against mxgemm.reference on the GPU result and against each other (bit-exact), then times
both with CUDA-graph replay (one graph of 100 back-to-back launches; the output keeps
accumulating, only the time is kept) and prints µs per call and the weight bytes of the
experts hit per µs:

    python op_tests/test_moe_gemm2_a4w4.py                        # DeepSeek-V3-like TP8 shape
    python op_tests/test_moe_gemm2_a4w4.py -M 1 16 128 -N 7168 -K 256 -E 256 --topk 8
    python op_tests/test_moe_gemm2_a4w4.py --route-rows     # out [M, topk, N], a row per route

Without a GPU it runs one small case on the emulator (both backends, both outputs, bit-exact
parity and the reference check) so the script cannot rot:

    python op_tests/test_moe_gemm2_a4w4.py --emulator
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch

import mxgemm
from mxgemm import metrics, reference, toolchain
from mxgemm.specs import Inputs
from mxgemm.specs.base import sorted_ids


def make_inputs(M, N, K, E, topk, block_m, device, seed=0):
    inp = Inputs(device=device, seed=seed)
    s, _, _ = inp.routing(M, topk, E, block_m)
    return (*inp.mx(M * topk, K, fmt="e2m1"), *inp.mx(E, N, K, fmt="e2m1"), *sorted_ids(s, device),
            s.sorted_weights.to(device))


def new_out(M, N, topk, route_rows, device):
    """[M, N] summed by atomics, or [M, topk, N], a row per route."""
    return torch.zeros(*((M, topk, N) if route_rows else (M, N)), dtype=torch.bfloat16, device=device)


def run(inputs, M, N, topk, backend, block_m, route_rows):
    out = new_out(M, N, topk, route_rows, inputs[0].device)
    mxgemm.moe_gemm2_a4w4(*inputs, out, block_m=block_m, language=backend)
    return out


def check(inputs, M, N, topk, block_m, route_rows):
    """Both backends vs the reference (similarity) and vs each other. Bit-identical is required on
    the emulator (same workgroup order); on hardware atomic arrival order may differ run to run
    (a row per route has no order to differ in)."""
    cpu = [x.cpu() for x in inputs]
    ref = reference.moe_gemm2_a4w4_ref(cpu[0], cpu[1], cpu[2], cpu[3], cpu[4], cpu[7], cpu[5], cpu[6], block_m, topk,
                                       route_rows=route_rows)
    outs = {b: run(inputs, M, N, topk, b, block_m, route_rows).cpu() for b in ("hip", "flydsl")}
    for b, o in outs.items():
        d = metrics.calc_diff(o.float(), ref.float())
        print(f"  {b:<7} vs reference: calc_diff={d:.2e} max_ulp={int(metrics.bf16_ulp_distance(o, ref).max())}")
        assert d < 1e-4, f"{b} disagrees with the reference (calc_diff {d})"
    same = torch.equal(outs["hip"].view(torch.int16), outs["flydsl"].view(torch.int16))
    print(f"  hip vs flydsl: {'bit-identical' if same else 'differ (atomic arrival order on hardware)'}")
    return outs, ref, same


def time_graph(inputs, M, N, topk, backend, block_m, route_rows, iters=100) -> float:
    """Median µs per call from CUDA-graph replays of `iters` back-to-back launches."""
    out = new_out(M, N, topk, route_rows, "cuda")
    call = lambda: mxgemm.moe_gemm2_a4w4(*inputs, out, block_m=block_m, language=backend)  # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            call()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / iters)
    return sorted(times)[len(times) // 2]


def hardware(args):
    print(f"{'M':>6}{'HIP us':>10}{'FlyDSL us':>11}{'ratio':>8}{'W TB/s (HIP)':>14}")
    for M in args.M:
        inputs = make_inputs(M, args.N, args.K, args.E, args.topk, args.block_m, "cuda")
        out = new_out(M, args.N, args.topk, args.route_rows, "cuda")
        print(f"M={M}: {mxgemm.explain('moe_gemm2_a4w4', *inputs, out, block_m=args.block_m)}")
        check(inputs, M, args.N, args.topk, args.block_m, args.route_rows)
        hip = time_graph(inputs, M, args.N, args.topk, "hip", args.block_m, args.route_rows)
        fly = time_graph(inputs, M, args.N, args.topk, "flydsl", args.block_m, args.route_rows)
        experts_hit = int(torch.unique(inputs[5][inputs[5] >= 0]).numel())
        w_bytes = experts_hit * args.N * args.K // 2
        print(f"{M:>6}{hip:>10.2f}{fly:>11.2f}{fly / hip:>8.3f}{w_bytes / hip / 1e6:>14.2f}")


def emulator(args):
    M, N, K, E, topk, bm = 8, 256, 512, 6, 3, args.block_m
    inputs = make_inputs(M, N, K, E, topk, bm, "cpu")
    for route_rows in (False, True):
        t0 = time.perf_counter()
        outs, ref, same = check(inputs, M, N, topk, bm, route_rows)
        print(f"emulator case M={M} N={N} K={K} E={E} topk={topk} BM={bm} route_rows={route_rows}: "
              f"{time.perf_counter() - t0:.1f} s")
        assert same, "HIP and FlyDSL must be bit-identical on the emulator (same workgroup order)"
        # Workgroups in order add each token's contributions in the reference's order: bit-exact.
        metrics.assert_bitwise_equal(outs["hip"], ref, "hip vs reference on the emulator")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-M", type=int, nargs="+", default=[1, 4, 16, 64, 128, 256, 1024])
    p.add_argument("-N", type=int, default=7168, help="D_HIDDEN (multiple of 256)")
    p.add_argument("-K", type=int, default=256, help="D_INTER per rank (multiple of 256)")
    p.add_argument("-E", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--block-m", type=int, default=32, choices=(16, 32))
    p.add_argument("--route-rows", action="store_true", help="out [M, topk, N], a row per route (no atomics)")
    p.add_argument("--emulator", action="store_true", help="run the small emulator case (no GPU needed)")
    args = p.parse_args()
    if args.emulator or toolchain.gpu_arch() != "gfx950":
        if not args.emulator:
            print("no gfx950 GPU: running the emulator case")
        emulator(args)
    else:
        hardware(args)


if __name__ == "__main__":
    main()
