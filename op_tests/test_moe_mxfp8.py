"""moe_mxfp8_grouped_gemm: hardware check + benchmark on an MI355X.

On a gfx950 GPU (ROCm torch), for each token count T it checks the op against
mxgemm.reference (max bf16 ulp) and times it with CUDA events (median of 100 calls), printing
µs and TB/s of the weights of the experts the routing hits:

    python op_tests/test_moe_mxfp8.py                          # T in 1..16, N=4096, K=7168, E=256, top-8
    python op_tests/test_moe_mxfp8.py -T 1 4 16 -N 4096 -K 7168 -E 256 --topk 8

Without a GPU (or with --emulator) it runs one small case on the emulator against the
reference, so the script cannot rot.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


import mxgemm
from mxgemm import reference, toolchain
from mxgemm.specs import Inputs
from mxgemm.specs.base import sorted_ids
from mxgemm.specs.moe_mxfp8 import SPEC


def moe_inputs(T, N, K, E, topk, block_m, device, seed=0):
    inp = Inputs(device=device, seed=seed)
    srt, tw, _ = inp.routing(T, topk, E, block_m)
    return (*inp.mx(T, K), *inp.mx(E, N, K), *sorted_ids(srt, device)), srt, tw.to(device)


def check_moe(T, N, K, E, topk, block_m, device) -> str:
    args, srt, tw = moe_inputs(T, N, K, E, topk, block_m, device)
    got = mxgemm.moe_mxfp8_grouped_gemm(*args, topk_weights=tw, block_m=block_m).cpu()
    cpu = [x.cpu() for x in args]
    ref = reference.moe_mxfp8_grouped_gemm_ref(*cpu, block_m, topk, sorted_weights=srt.sorted_weights)
    return SPEC.contract.check(got, ref)


def hardware_moe(Ts, N, K, E, topk, block_m):
    from test_smallm_mxfp8 import bench  # the benchmark helper of the dense script beside this one
    print(f"{'T':>4} {'N':>6} {'K':>6} {'us':>9} {'TB/s':>7}  check")
    for T in Ts:
        args, srt, tw = moe_inputs(T, N, K, E, topk, block_m, "cuda")
        blocks = int((srt.sorted_expert_ids >= 0).sum())
        hit = len(set(srt.sorted_expert_ids[srt.sorted_expert_ids >= 0].tolist()))  # distinct experts read
        us = bench(lambda i: mxgemm.moe_mxfp8_grouped_gemm(*args, topk_weights=tw, block_m=block_m), 1)
        nbytes = hit * N * K * (1 + 1 / 32)
        print(f"{T:>4} {N:>6} {K:>6} {us:>9.2f} {nbytes / us / 1e6:>7.2f}  "
              f"{check_moe(T, N, K, E, topk, block_m, 'cuda')} ({blocks} blocks)", flush=True)


def emulator_smoke() -> int:
    """The small emulator case; 1 (the exit status) if it is outside the op's promise."""
    t0 = time.perf_counter()
    verdict = check_moe(3, 64, 256, 4, 2, 4, 'cpu')
    print(f"moe T=3 E=4 topk=2 N=64 K=256 on the emulator: {verdict}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return int(not verdict.startswith("ok"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-T", type=int, nargs="*", default=[1, 2, 4, 8, 16], help="tokens")
    p.add_argument("-N", type=int, default=4096)
    p.add_argument("-K", type=int, default=7168)
    p.add_argument("-E", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--block-m", type=int, default=16)
    p.add_argument("--emulator", action="store_true", help="run the small emulator case only")
    args = p.parse_args(argv)
    if args.emulator or toolchain.gpu_arch() != "gfx950":
        sys.exit(emulator_smoke())
    else:
        hardware_moe(args.T, args.N, args.K, args.E, args.topk, args.block_m)


if __name__ == "__main__":
    main()
