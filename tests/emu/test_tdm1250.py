"""gfx1250 Tensor Data Mover through __builtin_amdgcn_tensor_load_to_lds_d2 / tensor_store_from_lds_d2
on the gfx1250 target vs numpy: a 2-D tile with a row stride, a tail outside the tensor (zero
filled), LDS padding, completion through s_wait_tensorcnt (race mode: a deleted wait raises)."""
import functools

import numpy as np
import pytest
import torch

from mxgemm.emu import Emulator, RaceError

ARCH = "gfx1250"
SRC = r"""
#include "mxgemm/device.h"
typedef int v4i __attribute__((ext_vector_type(4)));
typedef int v8i __attribute__((ext_vector_type(8)));
using namespace mxgemm;
// D# of a TILE_R x TILE_C fp32 tile at x (row stride ld elements) of a rows x cols tensor, into LDS
// at byte lds; pad: PAD_AMT dwords after every 2^(PAD_LOG+1) dwords when PAD_ON.
__device__ inline void dsc(v4i& g0, v8i& g1, const void* x, unsigned lds, int rows, int cols, int ld, int pad) {
  unsigned long ga = (unsigned long)x;
  g0 = (v4i){1, (int)lds, (int)ga, (int)((ga >> 32) | 0x80000000u)};
  g1 = (v8i){(2 << 16) | pad, cols << 16, (cols >> 16) | (rows << 16), (rows >> 16) | (TILE_C << 16), TILE_R, ld, 0, 0};
}
MXGEMM_KERNEL(tdm_copy)(float* out, const float* x, int rows, int cols, int ld, int pad) {
  __shared__ float t[2048];
  v4i g0; v8i g1;
  const unsigned lds = (unsigned)(unsigned long)(__attribute__((address_space(3))) float*)t;
  dsc(g0, g1, x, lds, rows, cols, ld, pad);
  if (thread_x() < 32) __builtin_amdgcn_tensor_load_to_lds_d2(g0, g1, 0);   // wave 0 moves the tile
  __builtin_amdgcn_s_wait_tensorcnt(0);
  syncthreads();
  for (int i = thread_x(); i < 2048; i += blockDim) out[i] = t[i] * 2.0f;
  syncthreads();
  dsc(g0, g1, out + 2048, lds, rows, cols, ld, 0);
  if (thread_x() < 32) __builtin_amdgcn_tensor_store_from_lds_d2(g0, g1, 0);  // and back, unpadded
  __builtin_amdgcn_s_wait_tensorcnt(0);
}
"""
TILE_R, TILE_C = 8, 48


@functools.lru_cache(maxsize=None)
def _asm():
    from mxgemm.toolchain import compile_hip_source
    return compile_hip_source(SRC.replace("blockDim", "64"), ARCH, {"TILE_R": TILE_R, "TILE_C": TILE_C})


def _run(asm, rows, cols, ld, pad):
    rng = np.random.default_rng(rows * 100 + cols)
    x = rng.standard_normal(TILE_R * ld + 64).astype(np.float32)
    out = torch.full((2048 + TILE_R * ld,), -1.0)
    emu = Emulator(arch=ARCH, race_check=True)
    emu.launch(emu.load(asm), "tdm_copy", grid=1, block=64, args=[out, torch.from_numpy(x), rows, cols, ld, pad])
    return x, out.numpy(), emu.last_stats


@pytest.mark.parametrize("rows,cols,pad", [(8, 48, 0), (5, 40, 0), (8, 48, (1 << 20) | (3 << 22) | (1 << 25))])
def test_tile_load_and_store(rows, cols, pad):
    ld = 64
    x, out, stats = _run(_asm(), rows, cols, ld, pad)
    tile = np.zeros((TILE_R, TILE_C), np.float32)
    tile[:rows, :cols] = x[:TILE_R * ld].reshape(TILE_R, ld)[:rows, :cols]
    stream = tile.ravel()
    lds = np.zeros(2048, np.float32)
    if pad:     # pad interval 2^(3+1) = 16 dwords, pad amount 2 dwords
        idx = np.arange(stream.size)
        lds[idx + idx // 16 * 2] = stream
    else:
        lds[:stream.size] = stream
    np.testing.assert_array_equal(out[:2048], lds * 2)
    # the store writes the LDS stream's first rows x cols elements back with row stride ld
    back = out[2048:].reshape(TILE_R, ld)
    src = lds[:TILE_R * TILE_C].reshape(TILE_R, TILE_C)
    np.testing.assert_array_equal(back[:rows, :cols], src[:rows, :cols])
    assert (back[:, cols:] == -1).all() and (back[rows:] == -1).all()
    assert stats["tdm_load"] == 1 and stats["tdm_store"] == 1


def test_deleted_tensor_wait_raises():
    asm = _asm()
    i = asm.index("s_wait_tensorcnt")
    cut = asm[:i] + ";" + asm[i:]
    with pytest.raises(RaceError, match="direct-to-LDS|tensor"):
        _run(cut, 8, 48, 64, 0)
