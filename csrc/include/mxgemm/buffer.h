// Raw buffer resources (V#) and the loads/stores kernels issue through them.
//
// Why buffers: a raw buffer load takes a 64-bit base in SGPRs and a 32-bit per-lane byte
// offset (voffset), so address arithmetic stays in 32-bit VALU ops and out-of-range lanes read
// 0 instead of faulting. The price is the 2 GB rule: voffset is unsigned 32-bit and sentinel
// schemes (Triton, CK) reserve offsets >= 2^31, so every tensor a kernel addresses through ONE
// resource must be smaller than 2^31 bytes (checked on the host by mxgemm.guards.check_voffset).
// Kernels that address more rebase the 64-bit base per slice (e.g. per MoE expert) instead.
#pragma once
#include "mxgemm/device.h"

namespace mxgemm {

typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));
typedef __amdgpu_buffer_rsrc_t buffer_rsrc;

// V# dword3 for raw (untyped) access on gfx9/CDNA: DATA_FORMAT = 32 (a valid dfmt, so bounds
// checking applies), NUM_FORMAT = float, no swizzle, no add_tid. Same value as CK and Triton.
constexpr int kRawBufferDword3 = 0x00027000;

// Resource covering bytes [base, base + num_bytes); reads past the end return 0.
MXGEMM_DEVICE buffer_rsrc make_buffer(const void* base, uint32_t num_bytes) {
  return __builtin_amdgcn_make_buffer_rsrc(const_cast<void*>(base), (short)0, (int)num_bytes,
                                           kRawBufferDword3);
}

// 16 bytes at byte offset `voffset` (16-byte aligned): buffer_load_dwordx4.
MXGEMM_DEVICE u32x4 load_b128(buffer_rsrc r, uint32_t voffset) {
  return __builtin_amdgcn_raw_buffer_load_b128(r, (int)voffset, 0, 0);
}

// One byte, zero-extended: buffer_load_ubyte (e8m0 scales).
MXGEMM_DEVICE uint32_t load_u8(buffer_rsrc r, uint32_t voffset) {
  return __builtin_amdgcn_raw_buffer_load_b8(r, (int)voffset, 0, 0);
}

}  // namespace mxgemm
