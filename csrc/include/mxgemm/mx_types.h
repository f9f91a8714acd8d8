// OCP MX element and scale formats, decoded exactly in f32 with integer ops (portable across
// gfx950 and gfx1250; kernels on the hot path use the hardware conversions instead).
#pragma once
#include "mxgemm/device.h"

namespace mxgemm {

// float8 e4m3fn: bias 7, no inf, 0x7F/0xFF = NaN; subnormals m * 2^-9.
MXGEMM_DEVICE float decode_e4m3(uint32_t b) {
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  float v = (b & 0x7Fu) == 0x7Fu ? __builtin_nanf("")
          : e ? __builtin_ldexpf((float)(8u + m), (int)e - 10)
              : __builtin_ldexpf((float)m, -9);
  return (b & 0x80u) ? -v : v;
}

}  // namespace mxgemm
