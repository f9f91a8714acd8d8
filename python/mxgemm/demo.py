"""What `python -m mxgemm demo` runs: each sample op on the default backend vs the reference."""
from __future__ import annotations

import time

import torch


def _dequant_demo(language: str) -> str:
    from . import mxfp8_dequantize
    from .formats import decode, decode_e8m0
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 64), dtype=torch.uint8, generator=g)
    s = torch.randint(100, 150, (8, 2), dtype=torch.uint8, generator=g)
    t0 = time.perf_counter()
    got = mxfp8_dequantize(x, s, language=language)
    dt = time.perf_counter() - t0
    ref = decode(x, "e4m3") * decode_e8m0(s).repeat_interleave(32, dim=1)
    same = torch.equal(got.view(torch.int32)[~ref.isnan()], ref.view(torch.int32)[~ref.isnan()]) \
        and torch.equal(got.isnan(), ref.isnan())
    return f"mxfp8_dequantize[{language}] 8x64: {'bit-exact' if same else 'MISMATCH'} vs reference ({dt:.2f} s)"


def _moe_gemm2_demo() -> list:
    """a4w4 MoE down-projection, HIP and FlyDSL kernels vs the reference and each other."""
    from . import metrics, moe_gemm2_a4w4, quant, reference, routing
    g = torch.Generator().manual_seed(0)
    T, topk, E, N, K = 6, 2, 4, 256, 256
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)])
    r = routing.moe_sorting(ids, torch.rand(T, topk, generator=g), E, block_m=16)
    a, sa = quant.quantize_mx(torch.randn(T * topk, K, generator=g), "e2m1")
    w, sw = quant.quantize_mx(torch.randn(E, N, K, generator=g), "e2m1")
    ref = reference.moe_gemm2_a4w4_ref(a, sa, w, sw, r.sorted_token_ids, r.sorted_weights,
                                       r.sorted_expert_ids, r.num_valid_ids, 16, topk)
    lines, outs = [], {}
    for backend in ("hip", "flydsl"):
        t0 = time.perf_counter()
        out = outs[backend] = torch.zeros(T, N, dtype=torch.bfloat16)
        moe_gemm2_a4w4(a, sa, w, sw, r.sorted_token_ids, r.sorted_expert_ids, r.num_valid_ids,
                       r.sorted_weights, out, backend=backend)
        ulp = int(metrics.bf16_ulp_distance(out, ref).max())
        # On the CPU tensors run on the emulator in workgroup order = the reference's atomic order.
        lines.append(f"moe_gemm2_a4w4[{backend}] T={T} topk={topk} E={E} N={N} K={K}: max {ulp} bf16 ulp "
                     f"vs reference ({'ok' if ulp == 0 else 'MISMATCH'}, {time.perf_counter() - t0:.2f} s)")
    same = torch.equal(outs["hip"].view(torch.int16), outs["flydsl"].view(torch.int16))
    lines.append(f"moe_gemm2_a4w4 hip vs flydsl: {'bit-identical' if same else 'MISMATCH'}")
    return lines


def _smallm_demo() -> list[str]:
    """One GEMV and one MoE call on the default backend vs mxgemm.reference (max bf16 ulp)."""
    from . import explain, metrics, moe_mxfp8_grouped_gemm, quant, reference, routing, smallm_mxfp8_gemm
    from .launcher import default_backend
    dev = "cuda" if default_backend() == "hip" else "cpu"
    g = torch.Generator().manual_seed(0)
    lines = []
    M, N, K = 2, 128, 256
    a, sa = quant.quantize_mx(torch.randn(M, K, generator=g), "e4m3")
    b, sb = quant.quantize_mx(torch.randn(N, K, generator=g), "e4m3")
    t0 = time.perf_counter()
    got = smallm_mxfp8_gemm(a.to(dev), sa.to(dev), b.to(dev), sb.to(dev)).cpu()
    dt = time.perf_counter() - t0
    ulp = int(metrics.bf16_ulp_distance(got, reference.smallm_mxfp8_gemm_ref(a, sa, b, sb)).max())
    plan = explain("smallm_mxfp8_gemm", a, sa, b, sb)
    lines.append(f"smallm_mxfp8_gemm {M}x{N}x{K} [{plan.kernel}]: max {ulp} bf16 ulp vs reference "
                 f"({'ok' if ulp <= 1 else 'MISMATCH'}, {dt:.2f} s)")
    T, E, topk, N, K, bm = 3, 4, 2, 64, 128, 4
    x, xs = quant.quantize_mx(torch.randn(T, K, generator=g), "e4m3")
    w, ws = quant.quantize_mx(torch.randn(E, N, K, generator=g), "e4m3")
    ids = torch.randint(0, E, (T, topk), generator=g)
    tw = torch.rand(T, topk, generator=g)
    srt = routing.moe_sorting(ids, tw, E, block_m=bm)
    t0 = time.perf_counter()
    got = moe_mxfp8_grouped_gemm(x.to(dev), xs.to(dev), w.to(dev), ws.to(dev),
                                 srt.sorted_token_ids.to(dev), srt.sorted_expert_ids.to(dev),
                                 srt.num_valid_ids.to(dev), topk_weights=tw.to(dev), block_m=bm).cpu()
    dt = time.perf_counter() - t0
    ref = reference.moe_mxfp8_grouped_gemm_ref(x, xs, w, ws, srt.sorted_token_ids,
                                               srt.sorted_expert_ids, srt.num_valid_ids, bm,
                                               sorted_weights=srt.sorted_weights)
    ulp = int(metrics.bf16_ulp_distance(got[:ref.shape[0]], ref).max())
    lines.append(f"moe_mxfp8_grouped_gemm T={T} E={E} topk={topk} N={N} K={K}: max {ulp} bf16 ulp "
                 f"vs reference ({'ok' if ulp <= 1 else 'MISMATCH'}, {dt:.2f} s)")
    return lines


def _grouped_fp8_demo() -> str:
    """One forward + backward of mxgemm.grouped_gemm_fp8 (e4m3, three groups, one empty) on the
    default backend: SNR of out, grad_a and grad_b against fp32 autograd on the unquantised inputs."""
    from . import grouped_gemm_fp8, metrics
    from .launcher import default_backend
    dev = "cuda" if default_backend() == "hip" else "cpu"
    g = torch.Generator().manual_seed(0)
    lens, N, K = [24, 0, 40], 64, 128
    x = torch.randn(sum(lens), K, generator=g)
    w = torch.randn(len(lens), N, K, generator=g) * 0.05
    dy = torch.randn(sum(lens), N, generator=g)
    t0 = time.perf_counter()
    xq, wq = (t.bfloat16().to(dev).requires_grad_() for t in (x, w))
    y = grouped_gemm_fp8(xq, wq, torch.tensor(lens, device=dev))
    y.backward(dy.bfloat16().to(dev))
    dt = time.perf_counter() - t0
    xf, wf = (t.bfloat16().float().requires_grad_() for t in (x, w))   # fp32 math on the same bf16 inputs
    yf = torch.cat([xg @ wf[i].T for i, xg in enumerate(xf.split(lens))])
    yf.backward(dy.bfloat16().float())
    snrs = [metrics.snr_db(t.detach().float().cpu(), r.detach()) for t, r in
            ((y, yf), (xq.grad, xf.grad), (wq.grad, wf.grad))]
    ok = all(s >= 25 for s in snrs)
    return (f"grouped_gemm_fp8 e4m3 G={len(lens)} (rows {lens}) N={N} K={K}, forward + backward: SNR vs fp32 "
            f"autograd out {snrs[0]:.1f} dB, grad_a {snrs[1]:.1f} dB, grad_b {snrs[2]:.1f} dB "
            f"({'ok' if ok else 'FAIL'}: >= 25 dB, {dt:.2f} s)")
def _mx_gemm_demo() -> list[str]:
    """One MXFP4 and one MXFP8 prefill-shaped mx_gemm on the default backend vs the reference
    (bitwise on the emulator: the reference follows the kernel's 128-K MMA order)."""
    from . import explain, metrics, mx_gemm, quant, reference
    from .launcher import default_backend
    dev = "cuda" if default_backend() == "hip" else "cpu"
    g = torch.Generator().manual_seed(0)
    lines = []
    for fmt, (M, N, K) in (("e2m1", (96, 128, 512)), ("e4m3", (80, 96, 384))):
        a, sa = quant.quantize_mx(torch.randn(M, K, generator=g), fmt)
        b, sb = quant.quantize_mx(torch.randn(N, K, generator=g), fmt)
        t0 = time.perf_counter()
        got = mx_gemm(a.to(dev), sa.to(dev), b.to(dev), sb.to(dev), a_format=fmt, b_format=fmt).cpu()
        dt = time.perf_counter() - t0
        ref = reference.mx_gemm_ref(a, sa, b, sb, fmt, fmt, chunk=reference.MX_MMA_K)
        ulp = int(metrics.bf16_ulp_distance(got, ref).max())
        plan = explain("mx_gemm", a, sa, b, sb, a_format=fmt, b_format=fmt)
        tile = f"{plan.variant['BM']}x{plan.variant['BN']}"
        lines.append(f"mx_gemm {'MXFP4' if fmt == 'e2m1' else 'MXFP8'} {M}x{N}x{K} [{tile}]: max {ulp} bf16 ulp "
                     f"vs reference ({'ok' if ulp <= (0 if dev == 'cpu' else 1) else 'MISMATCH'}, {dt:.2f} s)")
    return lines


def _mx_gemm_gfx1250_demo() -> str:
    """One MXFP8 mx_gemm built for gfx1250 (scaled WMMA, Tensor Data Mover) on the gfx1250
    emulator target vs the reference (bitwise: the same 128-K MMA order as gfx950)."""
    from . import launcher, quant, reference, registry
    v = registry.get("mx_gemm").variants_for("gfx1250")[0]
    g = torch.Generator().manual_seed(0)
    M, N, K = 80, 96, 384
    a, sa = quant.quantize_mx(torch.randn(M, K, generator=g), v["A_FMT"])
    b, sb = quant.quantize_mx(torch.randn(N, K, generator=g), v["B_FMT"])
    out = torch.zeros(M, N, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    launcher.launch_variant("mx_gemm", v, "gfx1250", "emu", writes=(out,), a=a, a_scale=sa, b=b, b_scale=sb, out=out,
                            M=M, N=N, K=K, splits=1)
    dt = time.perf_counter() - t0
    same = torch.equal(out, reference.mx_gemm_ref(a, sa, b, sb, v["A_FMT"], v["B_FMT"], chunk=reference.MX_MMA_K))
    return (f"mx_gemm gfx1250 MXFP8 {M}x{N}x{K} [{v['BM']}x{v['BN']}, scales by {v['SCALE_PATH']}] on the gfx1250 "
            f"emulator: {'bit-exact' if same else 'MISMATCH'} vs reference ({dt:.2f} s)")


def run_demos() -> int:
    from .launcher import default_backend
    print(f"running demos on backend: {default_backend()}")
    failures = 0
    demos = [lambda: _dequant_demo("hip"), lambda: _dequant_demo("flydsl"), _moe_gemm2_demo, _smallm_demo,
             _grouped_fp8_demo, _mx_gemm_demo, _mx_gemm_gfx1250_demo]
    for d in demos:
        try:
            out = d()
            for line in ([out] if isinstance(out, str) else out):
                print("  " + line)
                failures += "MISMATCH" in line or "FAIL" in line
        except Exception as e:  # a demo failing must be visible, not fatal to the others
            failures += 1
            print(f"  FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return 1 if failures else 0
