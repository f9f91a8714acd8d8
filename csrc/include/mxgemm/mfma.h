// gfx950 scaled MFMA wrapper and its operand layout (docs/gfx950_isa.md §1.3-1.5).
//
// v_mfma_scale_f32_16x16x128_f8f6f4 with E4M3 A and B (cbsz = blgp = 0):
//   D[i][j] = C[i][j] + sum_kb 2^(SA[i][kb]-127) * 2^(SB[j][kb]-127) * sum_{k in kb} A[i][k] B[k][j]
// Operand bytes (8 VGPRs per lane): lane l, byte i holds row (A) / column (B) l % 16 and
//   K = 16 * (l / 16) + i % 16 + 64 * (i / 16),
// i.e. two runs of 16 consecutive K: [16g, 16g + 16) and [64 + 16g, 64 + 16g + 16), g = l / 16.
// Scales: lane l supplies the byte for row/column l % 16 and K block kb = l / 16 (opsel 0 reads
// bits [7:0]). Result: D[i][j] is in lane j + 16 * (i / 4), register i % 4.
#pragma once
#include "mxgemm/buffer.h"

namespace mxgemm {

typedef int i32x8 __attribute__((ext_vector_type(8)));
typedef float f32x4 __attribute__((ext_vector_type(4)));

constexpr uint32_t kMfmaK = 128;     // K per 16x16x128 instruction
constexpr uint32_t kMfmaRows = 16;   // rows of A (= columns of B) per instruction

// Byte offset (within one 128-wide K step) of the 16-byte run `half` (0 or 1) that `lane` holds.
MXGEMM_DEVICE uint32_t mfma_fp8_k_offset(uint32_t lane, uint32_t half) {
  return 16u * (lane / 16u) + 64u * half;
}

// K block (0..3 within one 128-wide K step) whose scale byte `lane` supplies.
MXGEMM_DEVICE uint32_t mfma_scale_block(uint32_t lane) { return lane / 16u; }

// Two 16-byte runs (K offsets mfma_fp8_k_offset(lane, 0) and (lane, 1)) -> one FP8 operand.
MXGEMM_DEVICE i32x8 mfma_fp8_operand(u32x4 lo, u32x4 hi) {
  return i32x8{(int)lo.x, (int)lo.y, (int)lo.z, (int)lo.w, (int)hi.x, (int)hi.y, (int)hi.z, (int)hi.w};
}

// acc += A * B on E4M3 operands with e8m0 scale bytes `scale_a`, `scale_b` (bits [7:0]).
MXGEMM_DEVICE f32x4 mfma_scale_16x16x128_e4m3(i32x8 a, i32x8 b, f32x4 acc, uint32_t scale_a,
                                              uint32_t scale_b) {
  return __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, acc, /*cbsz=E4M3*/ 0,
                                                          /*blgp=E4M3*/ 0, /*opselA*/ 0,
                                                          (int)scale_a, /*opselB*/ 0, (int)scale_b);
}

}  // namespace mxgemm
