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


def run_demos() -> int:
    from .toolchain import launch_backend
    print(f"running demos on backend: {launch_backend()}")
    failures = 0
    demos = [lambda: _dequant_demo("hip"), lambda: _dequant_demo("flydsl")]
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
