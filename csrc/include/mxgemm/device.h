// Header-free HIP device prelude: kernels are compiled with -nogpuinc -nogpulib so the same
// sources build with a ROCm clang or the clang bundled in the ziglang wheel. Only what the
// kernels use lives here; everything maps to __builtin_amdgcn_* builtins.
#pragma once

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __host__ __attribute__((host))
#define MXGEMM_DEVICE __device__ inline __attribute__((always_inline))
#define MXGEMM_KERNEL(name) extern "C" __global__ void name

#include <stdint.h>

namespace mxgemm {

MXGEMM_DEVICE uint32_t thread_x() { return __builtin_amdgcn_workitem_id_x(); }
MXGEMM_DEVICE uint32_t thread_y() { return __builtin_amdgcn_workitem_id_y(); }
MXGEMM_DEVICE uint32_t thread_z() { return __builtin_amdgcn_workitem_id_z(); }
MXGEMM_DEVICE uint32_t block_x() { return __builtin_amdgcn_workgroup_id_x(); }
MXGEMM_DEVICE uint32_t block_y() { return __builtin_amdgcn_workgroup_id_y(); }
MXGEMM_DEVICE uint32_t block_z() { return __builtin_amdgcn_workgroup_id_z(); }
// Like HIP's __syncthreads: a bare s_barrier does not make this wave's pending LDS writes
// visible (clang emits no s_waitcnt before it on gfx950), so fence around it.
MXGEMM_DEVICE void syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// e8m0 scale byte -> 2^(e-127) applied with ldexp (exact; e = 0xFF is NaN per OCP MX).
MXGEMM_DEVICE float e8m0_apply(float x, uint32_t e) {
  return e == 0xFFu ? __builtin_nanf("") : __builtin_ldexpf(x, (int)e - 127);
}

}  // namespace mxgemm
