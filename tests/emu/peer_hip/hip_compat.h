// The HIP runtime names public kernels use, for mxgemm's header-free device compile
// (csrc/include/mxgemm/device.h): built-in variables and the few intrinsics those kernels call.
#pragma once
#include "mxgemm/device.h"

struct hip_dim3 { unsigned x, y, z; };
#define threadIdx (hip_dim3{__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), \
                            __builtin_amdgcn_workitem_id_z()})
#define blockIdx (hip_dim3{__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), \
                           __builtin_amdgcn_workgroup_id_z()})
#define blockDim (hip_dim3{__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(), \
                           __builtin_amdgcn_workgroup_size_z()})
#define __syncthreads() mxgemm::syncthreads()
#define __ffs(x) __builtin_ffs(x)

// __shfl(value, lane): the value of `value` in lane `lane` of the wave (ds_bpermute)
__device__ inline float __shfl(float v, int lane) {
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(lane << 2, __builtin_bit_cast(int, v)));
}
