"""mx_gemm (MXFP8 / MXFP4 / A8W4 prefill GEMM): hardware check + benchmark vs peers.

On an MI355X (gfx950 GPU, ROCm torch), per shape and format it checks mx_gemm against
mxgemm.reference (max bf16 ulp, calc_diff: the hardware MFMA's internal summation is not
specified bit for bit, so <= 1 bf16 ulp is the pass mark), checks that a hipGraph capture of
the call replays to the same bits, and times (CUDA events, median of 50) the op eagerly, its
graph replay, the op on pre-shuffled scales (quant.shuffle_scales, shuffled once outside the
timing, as a deployment stores them), and the peers:
  * hipblaslt - torch._scaled_mm with e8m0 block scales (hipBLASLt), when this torch has it
  * triton    - a Triton `tl.dot_scaled` GEMM (op_tests/test_smallm_mxfp8.py's peer, 128 x 128 tiles)
printing µs and TFLOPS:

    python op_tests/test_mx_gemm.py                         # 1024^3, 8192^3, DeepSeek-V3 linears, M=4096
    python op_tests/test_mx_gemm.py --fmt mxfp4 --shapes 4096x2112x7168

Without a GPU (or with --emulator) it runs small MXFP8 / MXFP4 / A8W4 cases on the emulator
against the reference (bitwise there), so the script cannot rot.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch

import mxgemm
from mxgemm import metrics, quant, reference, toolchain
from mxgemm.specs import Contract, Inputs

FORMATS = {"mxfp8": ("e4m3", "e4m3"), "mxfp4": ("e2m1", "e2m1"), "a8w4": ("e4m3", "e2m1")}
# DeepSeek-V3 linear layers (N, K) at 4096 prefill tokens: fused q_a + kv_a, q_b, kv_b, o,
# fused gate + up, down
DSV3 = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (36864, 7168), (7168, 18432)]
SHAPES = [(1024, 1024, 1024), (8192, 8192, 8192)] + [(4096, n, k) for n, k in DSV3]


def inputs(M, N, K, fmts, device, seed=0):
    inp = Inputs(device=device, seed=seed)
    return [*inp.mx(M, K, fmt=fmts[0]), *inp.mx(N, K, fmt=fmts[1])]


def with_shuffled_scales(args) -> list:
    """(a, a_scale, b, b_scale) with both scales in quant.shuffle_scales' layout."""
    return [args[0], quant.shuffle_scales(args[1]), args[2], quant.shuffle_scales(args[3])]


def check(got, args, fmts, max_ulp) -> str:
    """The spec's contract (bitwise) on the emulator; ``max_ulp`` bf16 ulp on hardware."""
    ref = reference.mx_gemm_ref(*[t.cpu() for t in args], *fmts, chunk=reference.MX_MMA_K)
    diff = metrics.calc_diff(got.cpu().float(), ref.float())
    return f"{Contract(ulp=max_ulp, exact=0.0 if max_ulp else 1.0).check(got, ref)}, calc_diff {diff:.2e}"


def hipblaslt(fmts):
    """torch._scaled_mm on MX operands (float8 / float4_e2m1fn_x2 with float8_e8m0fnu scales)."""
    def view(x, fmt):
        return x.view(torch.float4_e2m1fn_x2) if fmt == "e2m1" else x

    def run(a, sa, b, sb, out):
        out.copy_(torch._scaled_mm(view(a, fmts[0]), view(b, fmts[1]).t(), sa.view(torch.float8_e8m0fnu),
                                   sb.view(torch.float8_e8m0fnu), out_dtype=torch.bfloat16))
    return run


def graph_of(fn):
    """fn captured in a hipGraph (after a warm-up call, as torch requires); returns replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def hardware(shapes, fmt_names):
    from test_smallm_mxfp8 import bench, triton_dot_scaled  # the dense script beside this one
    print(f"{'M':>5} {'N':>6} {'K':>6} {'fmt':>6} {'impl':>10} {'us':>10} {'TFLOPS':>8}  check / config")
    for name in fmt_names:
        fmts = FORMATS[name]
        peers = {"hipblaslt": hipblaslt(fmts)}
        try:
            peers["triton"] = triton_dot_scaled(*fmts, tile=(128, 128, 128))
        except Exception as e:  # Triton missing or too old for dot_scaled on this GPU
            print(f"(triton peer unavailable: {type(e).__name__}: {e})")
        for M, N, K in shapes:
            args = inputs(M, N, K, fmts, "cuda")
            out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            kw = dict(a_format=fmts[0], b_format=fmts[1], out=out)
            plan = mxgemm.explain("mx_gemm", *args, a_format=fmts[0], b_format=fmts[1])
            mxgemm.mx_gemm(*args, **kw)
            eager = out.clone()
            replay = graph_of(lambda: mxgemm.mx_gemm(*args, **kw))
            out.zero_()
            replay()
            torch.cuda.synchronize()
            same = torch.equal(out.view(torch.int16), eager.view(torch.int16))
            shuffled = with_shuffled_scales(args)
            runs = {"mxgemm": lambda i: mxgemm.mx_gemm(*args, **kw), "mx-graph": lambda i: replay(),
                    "mx-shuffled": lambda i: mxgemm.mx_gemm(*shuffled, shuffled_scales=True, **kw)}
            runs.update({p: (lambda f: lambda i: f(*args, out))(f) for p, f in peers.items()})
            for impl, fn in runs.items():
                try:
                    us = bench(fn, 1, iters=50)
                except Exception as e:  # a peer without MX support in this torch / Triton
                    print(f"{M:>5} {N:>6} {K:>6} {name:>6} {impl:>10}  unavailable: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:80]}")
                    continue
                note = ""
                if impl == "mxgemm":
                    note = check(eager, args, fmts, 1) + f"  [{plan.variant['BM']}x{plan.variant['BN']}, " \
                        f"splits {plan.args['splits']}]"
                elif impl == "mx-graph":
                    note = "graph replay == eager" if same else "FAIL: graph replay differs from eager"
                elif impl == "mx-shuffled":
                    note = check(out, args, fmts, 1)
                else:
                    note = check(out, args, fmts, 2)
                print(f"{M:>5} {N:>6} {K:>6} {name:>6} {impl:>10} {us:>10.2f} {2 * M * N * K / us / 1e6:>8.1f}  "
                      f"{note}", flush=True)


def emulator_smoke() -> int:
    """Small cases on the emulator (bitwise vs the reference); 1 (exit status) if one fails."""
    from test_smallm_mxfp8 import report

    def case(name, M, N, K, shuffled=False):
        fmts = FORMATS[name]
        args = inputs(M, N, K, fmts, "cpu")
        given = with_shuffled_scales(args) if shuffled else args
        return lambda: check(mxgemm.mx_gemm(*given, a_format=fmts[0], b_format=fmts[1], shuffled_scales=shuffled),
                             args, fmts, 0)
    shapes = (("mxfp8", (70, 96, 384), False), ("mxfp4", (33, 64, 256), False), ("a8w4", (64, 64, 256), False),
              ("mxfp4", (33, 64, 384), True))
    return report({f"{name} M={M} N={N} K={K}{' shuffled scales' if sh else ''}": case(name, M, N, K, sh)
                   for name, (M, N, K), sh in shapes})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fmt", nargs="*", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--shapes", nargs="*", help="MxNxK, e.g. 4096x2112x7168")
    p.add_argument("--emulator", action="store_true", help="run the small emulator cases only")
    args = p.parse_args(argv)
    if args.emulator or toolchain.gpu_arch() != "gfx950":
        sys.exit(emulator_smoke())
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    hardware(shapes, args.fmt)


if __name__ == "__main__":
    main()
