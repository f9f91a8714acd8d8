"""What `python -m mxgemm demo` runs: every op spec's smoke checks on the default backend vs
the reference, under the spec's numerical contract."""
from __future__ import annotations

import time


def run_demos() -> int:
    from ..launcher import MOCKS, default_backend, hip_library
    from ..specs import SPECS
    backend = default_backend()
    print(f"running demos on backend: {backend}")
    # the mock HIP runtime takes CPU tensors through the hip launch path
    device = "cuda" if backend == "hip" and hip_library() not in MOCKS else "cpu"
    failures = 0
    for spec in SPECS:
        try:
            for smoke in spec.smoke(device):
                t0 = time.perf_counter()
                verdict = smoke.check(spec.contract)
                print(f"  {smoke.label}: {verdict} vs reference ({time.perf_counter() - t0:.2f} s)")
                failures += "MISMATCH" in verdict
        except Exception as e:  # a demo failing must be visible, not fatal to the others
            failures += 1
            print(f"  {spec.name} FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return 1 if failures else 0
