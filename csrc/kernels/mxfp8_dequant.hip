// Sample kernel of the HIP path: e8m0-scaled MXFP8 dequantise.
//   out[m, k] = e4m3(x[m, k]) * 2^(scale[m, k/32] - 127)     (scale 0xFF -> NaN)
// One thread per 4 consecutive elements (one 32-bit load, one 128-bit store); the 4 share a
// scale because K % 32 == 0 (checked on the host). Grid: ceil(M*K/4 / 256) workgroups of 256.
#include "mxgemm/mx_types.h"

using namespace mxgemm;

MXGEMM_KERNEL(mxfp8_dequant)(const uint32_t* __restrict__ x, const uint8_t* __restrict__ scale,
                             float* __restrict__ out, int M, int K) {
  const uint32_t quad = block_x() * 256u + thread_x();
  const uint32_t n_quads = (uint32_t)M * (uint32_t)K / 4u;
  if (quad >= n_quads) return;
  const uint32_t bits = x[quad];
  const uint32_t e = scale[quad / 8u];  // 8 quads per 32-element block, row-major [M, K/32]
  typedef float f4 __attribute__((ext_vector_type(4)));
  f4 v;
  v.x = e8m0_apply(decode_e4m3(bits & 0xFFu), e);
  v.y = e8m0_apply(decode_e4m3((bits >> 8) & 0xFFu), e);
  v.z = e8m0_apply(decode_e4m3((bits >> 16) & 0xFFu), e);
  v.w = e8m0_apply(decode_e4m3(bits >> 24), e);
  reinterpret_cast<f4*>(out)[quad] = v;
}
