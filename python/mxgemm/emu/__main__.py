"""python -m mxgemm.emu bench  -- wave-instructions per second on a fixed LDS-tiled GEMM (seeded
inputs), with race checking on and off, for the lockstep scheduler and the reference one
(every wave on its own).
python -m mxgemm.emu coverage --arch gfx950|gfx1250 [-v]  -- the instruction forms of LLVM's
AMDGPU assembler tests by class: checked by the tests, executes, unsupported, unparsed
(``mxgemm.emu.coverage``)."""
from __future__ import annotations

import sys
import time

_GEMM = r"""
#include "mxgemm/device.h"
using namespace mxgemm;
#define SYNC() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); \
                    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)
MXGEMM_KERNEL(gemm)(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                    int M, int N, int K) {
  __shared__ float As[16][17], Bs[16][17];
  int tx = thread_x() & 15, ty = thread_x() >> 4;
  int row = block_y() * 16 + ty, col = block_x() * 16 + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += 16) {
    As[ty][tx] = A[row * K + k0 + tx];
    Bs[ty][tx] = B[(k0 + ty) * N + col];
    SYNC();
    #pragma unroll 4
    for (int k = 0; k < 16; ++k) acc = __builtin_fmaf(As[ty][k], Bs[k][tx], acc);
    SYNC();
  }
  C[row * N + col] = acc;
}"""


def bench(race_check=True, lockstep=True, M=16, N=256, K=1024, seed=0):
    import torch

    from mxgemm.toolchain import compile_hip_source

    from . import Emulator
    emu = Emulator(race_check=race_check, lockstep=lockstep)
    prog = emu.load(compile_hip_source(_GEMM, "gfx950"))
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    c = torch.zeros(M, N)
    t = time.perf_counter()
    emu.launch(prog, "gemm", grid=(N // 16, M // 16, 1), block=(256, 1, 1), args=[c, a, b, M, N, K])
    dt = time.perf_counter() - t
    err = float((c - a.double() @ b.double()).abs().max())
    n = emu.wave_instructions
    print(f"gemm M={M} N={N} K={K} race_check={race_check} lockstep={lockstep}: {n} wave-instructions "
          f"in {dt:.2f} s = {n / dt:,.0f} wave-instr/s (max |err| {err:.2e})")
    return n / dt


def main(argv):
    if argv and argv[0] == "coverage":
        from .coverage import main as coverage
        return coverage(argv[1:])
    if not argv or argv[0] != "bench":
        print(__doc__.strip())
        return 2
    for race_check in (True, False):
        for lockstep in (False, True):
            bench(race_check, lockstep)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
