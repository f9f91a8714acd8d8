"""`python -m mxgemm bench {dispatch,emu}`: benchmarks that print numbers."""
from __future__ import annotations


def main(what: str) -> int:
    if what == "dispatch":
        from .ops import smallm_mxfp8
        n = 20000
        us = smallm_mxfp8.bench_dispatch(n)
        print(f"smallm_mxfp8_gemm dispatch (cached path, planner only): {us:.2f} us/call over {n} calls "
              f"(target <= 5 us, goal 2 us)")
        return 0
    if what == "emu":
        from .emu.__main__ import main as emu_main
        return emu_main(["bench"])
    raise ValueError(what)
