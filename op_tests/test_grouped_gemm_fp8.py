"""Tensorwise FP8 grouped GEMM (forward NT, dgrad NN, variable-K wgrad TN): hardware check +
benchmark on an MI355X.

On a gfx950 GPU (ROCm torch) it first runs the small bit-exactness cases on the GPU against
mxgemm.reference, then, for the MoE up-projection of each model (N = 2 * inter, K = hidden,
G = experts / EP groups, balanced and skewed token splits), checks the three GEMMs against fp32
torch math (calc_diff) and times them with CUDA events (median of 50 calls) next to peers:
  * triton    - one Triton launch over all groups (tl.dot on fp8, tensorwise scales)
  * hipblaslt - torch._scaled_mm per group (hipBLASLt; B pre-transposed outside the timing
                where it needs column-major, groups with a contraction not multiple of 16 skip it)
and prints µs and TFLOPS per GEMM:

    python op_tests/test_grouped_gemm_fp8.py                              # all models, EP 8, 2048 rows/group
    python op_tests/test_grouped_gemm_fp8.py --model DeepSeek-V3 --ep 8 -M 512 4096

Without a GPU (or with --emulator) it runs the small cases on the emulator against the
reference, so the script cannot rot.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch
from test_smallm_mxfp8 import bench, report

import mxgemm
from mxgemm import metrics, reference, toolchain

# (hidden, moe intermediate, routed experts)
MODELS = {"DeepSeek-V3": (7168, 2048, 256), "Qwen3-235B": (4096, 1536, 128), "GPT-OSS": (2880, 2880, 128)}
E4M3 = torch.float8_e4m3fn


def split_rows(total: int, G: int, skewed: bool, seed=0) -> list[int]:
    """Rows per group summing to total: equal (balanced), or Zipf-like weights 1/(rank+1) dealt in a
    seeded random order (skewed: the largest group gets ~G/ln(G) times the mean, the smallest few rows)."""
    if not skewed:
        return [total // G + (g < total % G) for g in range(G)]
    order = torch.randperm(G, generator=torch.Generator().manual_seed(seed)).tolist()
    w = [1.0 / (order[g] + 1) for g in range(G)]
    lens = [int(total * x / sum(w)) for x in w]
    lens[order.index(0)] += total - sum(lens)
    return lens


def problems(lens, n, k, device, seed=0):
    """fp8 operands of the three GEMMs of one MoE projection: x [sum_m, k], w [G, n, k], dy [sum_m, n]."""
    g = torch.Generator(device).manual_seed(seed)   # drawn on the device: the model shapes are GBs in fp32
    G, sum_m = len(lens), sum(lens)
    x, w, dy = (torch.randn(*s, generator=g, device=device).to(E4M3) for s in ((sum_m, k), (G, n, k), (sum_m, n)))
    scales = [torch.tensor(v, device=device) for v in (0.5, 0.25, 0.75)]
    return x, w, dy, scales, torch.tensor(lens, dtype=torch.int64, device=device)


def gemms(lens, n, k, device, seed=0):
    """{layout: (op, args, kwargs, flops)}: forward NT, dgrad NN (b [G, n, k] read as [G, K=n, N=k]),
    wgrad TN (out [G, n, k] = dy_g^T x_g)."""
    x, w, dy, (sx, sw, sd), lens_t = problems(lens, n, k, device, seed)
    flops = 2 * sum(lens) * n * k
    return {"NT": (mxgemm.grouped_gemm_fp8_kernel, (x, sx, w, sw, lens_t), {}, flops),
            "NN": (mxgemm.grouped_gemm_fp8_kernel, (dy, sd, w, sw, lens_t), {"trans_b": False}, flops),
            "TN": (mxgemm.grouped_gemm_fp8_variable_k, (dy, sd, x, sx, lens_t), {}, flops)}


def reference_of(layout, args, kw):
    cpu = [t.cpu() for t in args]
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), cpu[4].cumsum(0)])
    if layout == "TN":
        return reference.grouped_gemm_fp8_variable_k_ref(*cpu[:4], offs)
    return reference.grouped_gemm_fp8_ref(*cpu[:4], offs, trans_b=kw.get("trans_b", True))


def fp32_of(layout, args, kw):
    """The same GEMM in fp32 torch math on the operands' device (the large-shape check)."""
    a, sa, b, sb, lens = args
    a, b = a.float() * sa, b.float() * sb
    parts_a = a.split(lens.tolist())
    if layout == "TN":
        return torch.stack([pa.T @ pb for pa, pb in zip(parts_a, b.split(lens.tolist()))])
    return torch.cat([pa @ (b[g].T if kw.get("trans_b", True) else b[g]) for g, pa in enumerate(parts_a)])


def small_cases(device) -> dict:
    """{case: () -> verdict}: bit-exactness vs mxgemm.reference, each layout, on a skewed split
    with an empty group and sizes off the tile."""
    def check(layout, op, args, kw):
        got = op(*args, **kw).cpu()
        same = torch.equal(got.view(torch.int16), reference_of(layout, args, kw).view(torch.int16))
        plan = mxgemm.explain(op.name, *args, **kw)
        return (f"{'ok: bit-exact vs' if same else 'FAIL: differs from'} reference "
                f"[{plan.variant['BM']}x{plan.variant['BN']}, grid {plan.grid[0]}]")
    return {f"{layout} rows {lens} N=64 K=128": functools.partial(check, layout, op, args, kw)
            for lens in ([100, 0, 7, 37],)
            for layout, (op, args, kw, _) in gemms(lens, 64, 128, device).items()}


# ---- peers (GPU only) ----
def triton_grouped():
    """One Triton launch over all groups: program (tile, g) computes a BM x BN tile of group g's
    out_g = A_g B_g from per-group base offsets and strides (NT / NN / TN alike)."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(a, b, c, a_off, b_off, c_off, m_g, k_g, N, sam, sak, sbk, sbn, scale,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        g = tl.program_id(1)
        M, K = tl.load(m_g + g), tl.load(k_g + g)
        n_tiles = tl.cdiv(N, BN)
        pm, pn = tl.program_id(0) // n_tiles, tl.program_id(0) % n_tiles
        if pm * BM >= M:
            return
        rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
        pa = a + tl.load(a_off + g) + rm[:, None] * sam + rk[None, :] * sak
        pb = b + tl.load(b_off + g) + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            x = tl.load(pa, mask=(rm[:, None] < M) & (k0 + rk[None, :] < K), other=0.0)
            y = tl.load(pb, mask=(k0 + rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
            pa += BK * sak
            pb += BK * sbk
        pc = c + tl.load(c_off + g) + rm[:, None] * N + rn[None, :]
        tl.store(pc, (acc * tl.load(scale)).to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(layout, args, kw, out):
        a, sa, b, sb, lens = args
        G = lens.numel()
        offs = torch.cat([lens.new_zeros(1), lens.cumsum(0)])[:-1]
        gi = torch.arange(G, device=a.device)
        if layout == "TN":   # out[g] [M, N] = a_g^T b_g, a [sum_k, M], b [sum_k, N]
            M, N = a.shape[1], b.shape[1]
            geo = (offs * M, offs * N, gi * M * N, torch.full_like(lens, M), lens, N, 1, M, N, 1)
        else:
            K = a.shape[1]
            N = b.shape[1] if kw.get("trans_b", True) else b.shape[2]
            strides = (1, K) if kw.get("trans_b", True) else (N, 1)
            geo = (offs * K, gi * N * K, offs * N, lens, torch.full_like(lens, K), N, K, 1, *strides)
        m_max = int(lens.max()) if layout != "TN" else a.shape[1]
        BM, BN, BK = 128, 128, 128
        grid = (triton.cdiv(m_max, BM) * triton.cdiv(N, BN), G)
        kernel[grid](a, b, out, *geo, (sa * sb).reshape(1), BM=BM, BN=BN, BK=BK)
    return run


def hipblaslt_per_group(layout, args, kw):
    """torch._scaled_mm per group (B as hipBLASLt wants it, column-major, prepared here, untimed)."""
    a, sa, b, sb, lens = args
    sizes = lens.tolist()
    if layout == "TN":
        if any(s % 16 for s in sizes):
            return None
        aT = [p.T.contiguous() for p in a.split(sizes)]       # [M, k_g] row-major
        bs = [p for p in b.split(sizes)]                      # [k_g, N] row-major -> needs column-major
        bs = [p.T.contiguous().T for p in bs]
        return lambda out: [torch._scaled_mm(x, y, sa, sb, out_dtype=torch.bfloat16, out=out[g])
                            for g, (x, y) in enumerate(zip(aT, bs)) if sizes[g]]
    bg = [w.T if kw.get("trans_b", True) else w.T.contiguous().T for w in b]
    parts = a.split(sizes)
    outs = lambda out: out.split(sizes)  # noqa: E731
    return lambda out: [torch._scaled_mm(p, bg[g], sa, sb, out_dtype=torch.bfloat16, out=o)
                        for g, (p, o) in enumerate(zip(parts, outs(out))) if sizes[g]]


def hardware(models, ep, rows_per_group) -> int:
    """Prints the table; 1 (the exit status) if a check fails."""
    failed = report(small_cases("cuda"), "GPU")
    try:
        tri = triton_grouped()
    except Exception as e:  # Triton missing
        tri = None
        print(f"(triton peer unavailable: {type(e).__name__}: {e})")
    print(f"{'model':>12} {'G':>3} {'rows':>6} {'split':>8} {'gemm':>4} {'impl':>10} {'us':>9} {'TFLOPS':>8}  check")
    for name in models:
        hidden, inter, experts = MODELS[name]
        G = experts // ep
        for m in rows_per_group:
            for skewed in (False, True):
                lens = split_rows(G * m, G, skewed)
                for layout, (op, args, kw, flops) in gemms(lens, 2 * inter, hidden, "cuda").items():
                    got = op(*args, **kw)
                    diff = metrics.calc_diff(got.float(), fp32_of(layout, args, kw))
                    failed |= diff >= 1e-4
                    plan = mxgemm.explain(op.name, *args, **kw)
                    out = torch.empty_like(got)
                    runs = {"mxgemm": lambda: op(*args, **kw, out=out)}
                    if tri is not None:
                        runs["triton"] = lambda: tri(layout, args, kw, out)
                    blas = hipblaslt_per_group(layout, args, kw)
                    if blas is not None:
                        runs["hipblaslt"] = lambda: blas(out)
                    for impl, fn in runs.items():
                        try:
                            us = bench(lambda i: fn(), 1, iters=50)
                        except Exception as e:  # a peer that cannot run this shape
                            print(f"{name:>12} {G:>3} {m:>6} {layout:>4} {impl:>10} unavailable: {e}")
                            continue
                        note = (f"{'ok' if diff < 1e-4 else 'FAIL'}: calc_diff {diff:.1e} vs fp32 "
                                f"[{plan.variant['BM']}x{plan.variant['BN']} {plan.reason.split(';')[0]}]"
                                if impl == "mxgemm" else "")
                        print(f"{name:>12} {G:>3} {m:>6} {'skewed' if skewed else 'balanced':>8} {layout:>4} "
                              f"{impl:>10} {us:>9.1f} {flops / us / 1e6:>8.1f}  {note}", flush=True)
    return int(failed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--ep", type=int, default=8, help="expert parallelism: G = experts / ep groups per rank")
    p.add_argument("-M", type=int, nargs="*", default=[2048], help="mean rows (routed tokens) per group")
    p.add_argument("--emulator", action="store_true", help="run the small emulator cases only")
    args = p.parse_args(argv)
    if args.emulator or toolchain.gpu_arch() != "gfx950":
        sys.exit(report(small_cases("cpu")))
    sys.exit(hardware(args.model, args.ep, args.M))


if __name__ == "__main__":
    main()
