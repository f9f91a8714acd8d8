"""End to end: small MXFP8 and MXFP4 GEMMs written with the scaled MFMA builtin, compiled to
gfx950 assembly, executed on mxgemm.emu and compared with mxgemm.reference and with an
independent float64 computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hip_run import run
from mfma_model import decode

M = N = 64
K = 256

# One wave per 16x16 output tile, K in steps of 128. Lane l loads row m = l%16 of A (column n of
# B, B given as [N, K]) per the f8f6f4 layout: FP8 items are bytes K0+16(l/16)+0..15 and +64;
# FP4 items are nibbles K0+32(l/16)+0..31 (16 bytes). The scale of row m, K block kb comes from
# lane m + 16 kb, byte 0 (docs/gfx950_isa.md §1.5).
SRC = r"""
template <int FMT>
__device__ inline void mx_gemm(const unsigned char* A, const unsigned char* As, const unsigned char* B,
                               const unsigned char* Bs, float* D, int N, int K) {
  int l = mxgemm::thread_x(), tile = mxgemm::block_x();
  int row0 = (tile / (N / 16)) * 16, col0 = (tile % (N / 16)) * 16;
  int r = l % 16, g = l / 16;
  v4f acc = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 128) {
    v8i a, b;
    if (FMT == 4) {
      v4i z = {0, 0, 0, 0};
      v4i al = *(const v4i*)(A + (row0 + r) * (K / 2) + k0 / 2 + 16 * g);
      v4i bl = *(const v4i*)(B + (col0 + r) * (K / 2) + k0 / 2 + 16 * g);
      a = __builtin_shufflevector(al, z, 0, 1, 2, 3, 4, 5, 6, 7);
      b = __builtin_shufflevector(bl, z, 0, 1, 2, 3, 4, 5, 6, 7);
    } else {
      const unsigned char* pa = A + (row0 + r) * K + k0 + 16 * g;
      const unsigned char* pb = B + (col0 + r) * K + k0 + 16 * g;
      a = __builtin_shufflevector(*(const v4i*)pa, *(const v4i*)(pa + 64), 0, 1, 2, 3, 4, 5, 6, 7);
      b = __builtin_shufflevector(*(const v4i*)pb, *(const v4i*)(pb + 64), 0, 1, 2, 3, 4, 5, 6, 7);
    }
    int sa = As[(row0 + r) * (K / 32) + k0 / 32 + g];
    int sb = Bs[(col0 + r) * (K / 32) + k0 / 32 + g];
    acc = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, acc, FMT, FMT, 0, sa, 0, sb);
  }
  for (int i = 0; i < 4; ++i) D[(row0 + 4 * g + i) * N + col0 + r] = acc[i];
}
MXGEMM_KERNEL(mx_gemm_fp8)(const unsigned char* A, const unsigned char* As, const unsigned char* B,
                           const unsigned char* Bs, float* D, int N, int K) { mx_gemm<0>(A, As, B, Bs, D, N, K); }
MXGEMM_KERNEL(mx_gemm_fp4)(const unsigned char* A, const unsigned char* As, const unsigned char* B,
                           const unsigned char* Bs, float* D, int N, int K) { mx_gemm<4>(A, As, B, Bs, D, N, K); }
"""


def _operands(fmt, rng):
    bits = 4 if fmt == "e2m1" else 8
    codes = rng.integers(0, 1 << bits, size=(2, M, K)).astype(np.uint8)
    if fmt == "e4m3":
        codes = np.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes)      # no NaN codes
    scales = rng.integers(118, 136, size=(2, M, K // 32)).astype(np.uint8)  # per-row, per-block
    return codes, scales


def _payload(codes, fmt):
    return codes[..., 0::2] | (codes[..., 1::2] << 4) if fmt == "e2m1" else codes


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_mx_gemm_e2e(fmt):
    rng = np.random.default_rng(7)
    codes, scales = _operands(fmt, rng)
    a, b = (_payload(c, fmt) for c in codes)
    kern = "mx_gemm_fp4" if fmt == "e2m1" else "mx_gemm_fp8"
    d = np.zeros((M, N), np.float32)
    _, _, _, _, d = run(SRC, kern, a, scales[0], b, scales[1], d, grid=(M // 16) * (N // 16),
                        scalars=(N, K))

    # independent float64: exact per-element values x 2^(e-127), summed in float64
    sa = np.repeat(2.0 ** (scales[0].astype(np.float64) - 127), 32, axis=1)
    sb = np.repeat(2.0 ** (scales[1].astype(np.float64) - 127), 32, axis=1)
    ref64 = (decode(fmt, codes[0]) * sa) @ (decode(fmt, codes[1]) * sb).T
    np.testing.assert_allclose(d, ref64, rtol=1e-5, atol=1e-5 * np.abs(ref64).max())

    from mxgemm import reference
    from mxgemm.metrics import calc_diff
    t = [torch.from_numpy(x.copy()) for x in (a, scales[0], b, scales[1])]
    ref = reference.mx_gemm_ref(*t, a_fmt=fmt, b_fmt=fmt, out_dtype=torch.float32)
    got = torch.from_numpy(d)
    assert calc_diff(got, ref) < 1e-6
    # The reference rounds each 32-block to fp32 and adds in block order; the emulator's MFMA
    # rounds once per 128-K instruction (matrix.py model). Both are within a few fp32 ulps.
    ulp = np.spacing(np.abs(ref.numpy()).max().astype(np.float32))
    assert np.abs(d - ref.numpy()).max() <= 8 * ulp
