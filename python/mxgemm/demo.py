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


def run_demos() -> int:
    from .toolchain import launch_backend
    print(f"running demos on backend: {launch_backend()}")
    failures = 0
    demos = [lambda: _dequant_demo("hip"), lambda: _dequant_demo("flydsl"), _moe_gemm2_demo]
    try:
        from .ops import smallm_mxfp8
        demos.append(smallm_mxfp8.demo)
    except (ImportError, AttributeError):
        pass
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
