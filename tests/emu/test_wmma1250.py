"""gfx1250 WMMA forms through compiled HIP builtins on the gfx1250 target vs an independent numpy
model: operands are packed into lane registers by the layouts of docs/gfx1250_emulator.md §3
(written out here, not taken from the emulator), decoded with ml_dtypes, multiplied exactly,
and the accumulator unpacked by the documented D layout. Inputs are small multiples of powers of
two so every sum is exact in fp32: a wrong lane, register, K block or scale byte shows."""
import functools

import ml_dtypes
import numpy as np
import pytest
import torch

from mxgemm.emu import Emulator

ARCH = "gfx1250"
SRC = r"""
#include "mxgemm/device.h"
typedef int v16i __attribute__((ext_vector_type(16)));
typedef int v8i __attribute__((ext_vector_type(8)));
typedef float v8f __attribute__((ext_vector_type(8)));
typedef float v16f __attribute__((ext_vector_type(16)));
typedef __bf16 v16bf __attribute__((ext_vector_type(16)));
using namespace mxgemm;
#define LOAD(T, v, p, n) T v; for (int i = 0; i < n; ++i) v[i] = p[l * n + i];
#define KERNEL(name, CT, NC, call) \
MXGEMM_KERNEL(name)(float* d, const int* a, const int* b, const float* c, const int* sa, const int* sb) { \
  int l = thread_x(); LOAD(v16i, va, a, 16) LOAD(v16i, vb, b, 16) LOAD(CT, vc, c, NC) \
  v8i va8, vb8; for (int i = 0; i < 8; ++i) va8[i] = va[i], vb8[i] = vb[i]; \
  int sA = sa[l], sB = sb[l]; long sA16 = (unsigned)sA | (long)sa[32 + l] << 32, sB16 = (unsigned)sB | (long)sb[32 + l] << 32; \
  CT r = call; for (int i = 0; i < NC; ++i) d[l * NC + i] = r[i]; }
KERNEL(fp8_fp8, v8f, 8, __builtin_amdgcn_wmma_f32_16x16x128_fp8_fp8(va, vb, (short)0, vc, false, false))
KERNEL(scale_fp8_bf8, v8f, 8, __builtin_amdgcn_wmma_scale_f32_16x16x128_f8f6f4(0, va, 1, vb, (short)0, vc, 1, 0, sA, 0, 0, sB, false, false))
KERNEL(scale_fp4_fp4, v8f, 8, __builtin_amdgcn_wmma_scale_f32_16x16x128_f8f6f4(4, va, 4, vb, (short)0, vc, 0, 0, sA, 1, 0, sB, false, false))
KERNEL(scale_fp6_fp8, v8f, 8, __builtin_amdgcn_wmma_scale_f32_16x16x128_f8f6f4(2, va, 0, vb, (short)0, vc, 0, 0, sA, 0, 0, sB, false, false))
KERNEL(scale_f4_32x16, v16f, 16, __builtin_amdgcn_wmma_scale_f32_32x16x128_f4(va, vb8, (short)0, vc, 1, 0, sA, 1, 0, sB, false, false))
KERNEL(scale_bf6_fp4, v8f, 8, __builtin_amdgcn_wmma_scale_f32_16x16x128_f8f6f4(3, va, 4, vb, (short)0, vc, 0, 0, sA, 1, 0, sB, false, false))
KERNEL(scale16_fp8_fp6, v8f, 8, __builtin_amdgcn_wmma_scale16_f32_16x16x128_f8f6f4(0, va, 2, vb, (short)0, vc, 1, 0, sA16, 0, 0, sB16, false, false))
KERNEL(bf16, v8f, 8, __builtin_amdgcn_wmma_f32_16x16x32_bf16(false, __builtin_bit_cast(v16bf, va8), false, __builtin_bit_cast(v16bf, vb8), (short)0, vc, false, false))
"""
DT = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m3": ml_dtypes.float6_e2m3fn,
      "e3m2": ml_dtypes.float6_e3m2fn, "e2m1": ml_dtypes.float4_e2m1fn, "bf16": ml_dtypes.bfloat16}
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4, "bf16": 16}
# kernel -> (M, K, A format, B format, scale block (0: unscaled), scale lane half of A, of B)
FORMS = {"fp8_fp8": (16, 128, "e4m3", "e4m3", 0, 0, 0), "scale_fp8_bf8": (16, 128, "e4m3", "e5m2", 32, 1, 0),
         "scale_fp4_fp4": (16, 128, "e2m1", "e2m1", 32, 0, 1), "scale_fp6_fp8": (16, 128, "e2m3", "e4m3", 32, 0, 0),
         "scale_bf6_fp4": (16, 128, "e3m2", "e2m1", 32, 0, 1), "scale16_fp8_fp6": (16, 128, "e4m3", "e2m3", 16, 1, 0),
         "scale_f4_32x16": (32, 128, "e2m1", "e2m1", 32, None, 1), "bf16": (16, 32, "bf16", "bf16", 0, 0, 0)}


def codes_of(fmt, rng, shape):
    """Random codes whose values are small multiples of 1/8 (|v| <= 4)."""
    allc = np.arange(1 << BITS[fmt], dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        v = values(fmt, allc)
        ok = allc[np.isfinite(v) & (np.abs(v) <= 4) & (v * 8 == np.round(v * 8))]
    return rng.choice(ok, shape)


def values(fmt, codes):
    if fmt == "bf16":
        return codes.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    return codes.astype(np.uint8).view(DT[fmt]).astype(np.float64)


def pack(codes, bits):
    """Lane registers uint32 [32, nregs] of an operand's codes [rows, K] (A, or B transposed)."""
    rows, K = codes.shape
    kw = {16: 8, 8: 16, 6: 32, 4: 32}[bits]      # K run of a lane half
    per_lane = rows * K // 32
    out = []
    for l in range(32):
        h, L = l // 16, l % 16
        bitstr = 0
        for i in range(per_lane):
            g, p = divmod(i, K // 2)
            r = L + 16 * g              # the 32-row A: two 16-row operands, VGPRs 0-7 and 8-15
            k = p % kw + kw * h + 2 * kw * (p // kw)
            bitstr |= int(codes[r, k]) << (bits * i)
        out.append([(bitstr >> (32 * j)) & 0xFFFFFFFF for j in range(16)])
    return np.array(out, np.uint32)


def d_row(l, r):
    """Accumulator row of VGPR r in lane l (column l % 16): 8 rows per lane half, 32-row forms
    stacking two 16-row tiles."""
    return r % 8 + 8 * (l // 16) + 16 * (r // 8)


def d_of(raw, M):
    """[M, 16] accumulator from the raw lane-major output [32, M / 2]."""
    d = np.zeros((M, 16), np.float32)
    for l in range(32):
        for r in range(M // 2):
            d[d_row(l, r), l % 16] = raw[l, r]
    return d


@functools.lru_cache(maxsize=None)
def _prog():
    from mxgemm.toolchain import compile_hip_source
    emu = Emulator(arch=ARCH)
    asm = compile_hip_source(SRC, ARCH)
    return emu, emu.load(asm), asm


@pytest.mark.parametrize("name", sorted(FORMS))
def test_wmma_form_matches_numpy(name):
    M, K, fa, fb, block, sel_a, sel_b = FORMS[name]
    rng = np.random.default_rng(sorted(FORMS).index(name))
    A, B = codes_of(fa, rng, (M, K)), codes_of(fb, rng, (16, K))      # B as [N, K]
    C = rng.integers(-64, 64, (M, 16)).astype(np.float32) / 8
    blk = block or 32
    nb = K // blk
    ea = rng.integers(126, 129, (M, nb)) if block else np.full((M, nb), 127)
    eb = rng.integers(126, 129, (16, nb)) if block else np.full((16, nb), 127)
    ref = C.astype(np.float64) + np.einsum("mkb,nkb->mn", (values(fa, A) * np.repeat(np.exp2(ea - 127.0), blk, 1)
                                                           ).reshape(M, -1, 1),
                                           (values(fb, B) * np.repeat(np.exp2(eb - 127.0), blk, 1)).reshape(16, -1, 1))
    a_regs, b_regs = pack(A, BITS[fa]), pack(B, BITS[fb])
    # scale bytes: row m's K blocks in lane m (+16 for the upper half); byte j of the lane's 32-bit
    # register (scale16: of its 64-bit pair, low word in sa[:32], high in sa[32:])
    sa, sb = np.zeros(64, np.uint32), np.zeros(64, np.uint32)
    for scale, e, rows, sel in ((sa, ea, M, sel_a or 0), (sb, eb, 16, sel_b)):
        for r in range(rows):
            v = sum(int(e[r, j]) << (8 * j) for j in range(nb))
            scale[r + 16 * sel], scale[32 + r + 16 * sel] = v & 0xFFFFFFFF, v >> 32
    c_raw = np.zeros((32, M // 2), np.float32)
    for l in range(32):
        for r in range(M // 2):
            c_raw[l, r] = C[d_row(l, r), l % 16]
    emu, prog, _ = _prog()
    d = torch.zeros(32 * (M // 2))
    t = [torch.from_numpy(np.ascontiguousarray(x).view(np.int32).copy()) for x in (a_regs, b_regs)]
    emu.launch(prog, name, grid=1, block=32, args=[d, t[0], t[1],
                                                   torch.from_numpy(c_raw.ravel().copy()),
                                                   torch.from_numpy(sa.view(np.int32)), torch.from_numpy(sb.view(np.int32))])
    np.testing.assert_array_equal(d_of(d.numpy().reshape(32, M // 2), M), ref.astype(np.float32))
    assert emu.last_stats["mfma_by_mnemonic"]


def test_scale_byte_and_lane_half_matter():
    """Moving row 0's scale to the other lane half (or K block 0's byte to block 1) changes D:
    the scale operand really is read per documented lane and byte."""
    M, K, fa, fb, _, _, _ = FORMS["scale_fp8_bf8"]
    rng = np.random.default_rng(5)
    A, B = codes_of(fa, rng, (M, K)), codes_of(fb, rng, (16, K))
    emu, prog, _ = _prog()

    def run(sa):
        d = torch.zeros(256)
        emu.launch(prog, "scale_fp8_bf8", grid=1, block=32,
                   args=[d, torch.from_numpy(pack(A, 8).view(np.int32)), torch.from_numpy(pack(B, 8).view(np.int32)),
                         torch.zeros(256), torch.from_numpy(sa.view(np.int32)),
                         torch.from_numpy(np.full(64, 0x7F7F7F7F, np.uint32).view(np.int32))])
        return d_of(d.numpy().reshape(32, 8), 16)
    ones = np.full(64, 0x7F7F7F7F, np.uint32)
    base = run(ones)
    moved = ones.copy()
    moved[16] = 0x7F7F7F80          # row 0, K block 0 doubled
    d = run(moved)
    a0, b0 = values(fa, A)[0, :32], values(fb, B)[:, :32]
    np.testing.assert_array_equal(d[0], (base[0] + a0 @ b0.T).astype(np.float32))
    np.testing.assert_array_equal(d[1:], base[1:])
