"""gfx1250 (wave32) corpus: the wave-size independent kernels of emu_corpus, compiled for
gfx1250, plus kernels whose meaning depends on 32-lane waves, each with a numpy reference."""
from __future__ import annotations

import emu_corpus as C
import numpy as np
import torch
from emu_corpus import kernel, rng

ARCH = "gfx1250"
SHARED = ("lds_reverse", "divergent", "math", "addr64", "buffer_oob", "atomics", "gemm")

kernel("xlane32", r"""
MXGEMM_KERNEL(xlane32)(int* __restrict__ out, const int* __restrict__ in) {
  int l = thread_x() & 31;
  int v = in[block_x() * 64 + thread_x()];
  v += __builtin_amdgcn_update_dpp(0, v, 0x111, 0xf, 0xf, false);   // row_shr:1
  v += __builtin_amdgcn_update_dpp(0, v, 0x112, 0xf, 0xf, false);   // row_shr:2
  v += __builtin_amdgcn_update_dpp(0, v, 0x114, 0xf, 0xf, false);   // row_shr:4
  v += __builtin_amdgcn_update_dpp(0, v, 0x118, 0xf, 0xf, false);   // row_shr:8
  int q = __builtin_amdgcn_mov_dpp(v, 0x1b, 0xf, 0xf, true);        // quad_perm [3,2,1,0]
  int s = __builtin_amdgcn_ds_swizzle(v, 0x401f);                    // swap 16
  int b = __builtin_amdgcn_ds_bpermute(((l + 17) & 31) * 4, v);
  int p = __builtin_amdgcn_ds_permute(((l + 5) & 31) * 4, v);
  int x = __builtin_amdgcn_permlanex16(0, v, 0x01234567u, 0x89abcdefu, false, false);   // other row, each 8 lanes reversed
  int rl = __builtin_amdgcn_readfirstlane(v + 3);
  int* o = out + (block_x() * 64 + thread_x()) * 7;
  o[0] = v; o[1] = q; o[2] = s; o[3] = b; o[4] = p; o[5] = x;
  o[6] = rl + __builtin_amdgcn_mbcnt_lo(~0u, 0);
}""")

kernel("ballot32", r"""
MXGEMM_KERNEL(ballot32)(unsigned* __restrict__ out, const int* __restrict__ in, int n) {
  int i = block_x() * 64 + thread_x();
  int v = i < n ? in[i] : 0;
  unsigned m = __builtin_amdgcn_ballot_w32(v > 0);      // 32-bit lane mask of this wave
  if (v & 1) v = __builtin_popcount(m) * 3 + v; else if (v < -50) v = -v;
  if (i < n) { out[2 * i] = m; out[2 * i + 1] = (unsigned)v; }
}""")


def case_xlane32(emu, prog):
    v = rng(10).integers(-1000, 1000, 128).astype(np.int32)
    out = torch.zeros(128 * 7, dtype=torch.int32)
    emu.launch(prog, "xlane32", grid=(2, 1, 1), block=(64, 1, 1), args=[out, C._t(v)])
    o = out.numpy().reshape(128, 7)
    l = np.arange(32)
    for w in range(4):
        x = v[w * 32:(w + 1) * 32].astype(np.int64)
        for sh in (1, 2, 4, 8):
            x = x + np.where((l & 15) >= sh, x[np.maximum(l - sh, 0)], 0)
        p = np.zeros(32, np.int64)
        p[(l + 5) & 31] = x
        ref = np.stack([x, x[(l & ~3) + 3 - (l & 3)], x[l ^ 16], x[(l + 17) & 31], p,
                        x[(16 - (l & ~15)) + (l & 8) + 7 - (l & 7)], x[0] + 3 + l], 1)
        np.testing.assert_array_equal(o[w * 32:(w + 1) * 32], ref.astype(np.int32))


def case_ballot32(emu, prog):
    n = 120
    v = rng(14).integers(-100, 100, 128).astype(np.int32)
    out = torch.zeros(256, dtype=torch.int32)
    emu.launch(prog, "ballot32", grid=(2, 1, 1), block=(64, 1, 1), args=[out, C._t(v), n])
    vv = np.where(np.arange(128) < n, v, 0).astype(np.int64)
    ref = np.zeros((128, 2), np.int64)
    for w in range(4):
        x = vv[w * 32:(w + 1) * 32]
        m = sum(1 << k for k in range(32) if x[k] > 0)
        y = np.where(x & 1, bin(m).count("1") * 3 + x, np.where(x < -50, -x, x))
        ref[w * 32:(w + 1) * 32] = np.stack([np.full(32, m), y], 1)
    np.testing.assert_array_equal(out.numpy().reshape(128, 2)[:n], (ref[:n] & 0xFFFFFFFF).astype(np.uint32).view(np.int32))


CASES = {**{n: C.CASES[n] for n in SHARED}, "xlane32": case_xlane32, "ballot32": case_ballot32}
