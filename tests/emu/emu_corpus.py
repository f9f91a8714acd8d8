"""Small HIP kernels exercising each instruction class of the emulator core, with numpy
references. Shared by the corpus, race and bench tests."""
from __future__ import annotations

import functools

import numpy as np
import torch

PRELUDE = r"""
#include "mxgemm/device.h"
using namespace mxgemm;
#define LDS(T, p) ((__attribute__((address_space(3))) T*)(p))
#define GLB(T, p) ((__attribute__((address_space(1))) T*)(p))
// __syncthreads as HIP defines it: release fence, barrier, acquire fence (the fences make
// clang wait for outstanding LDS/memory ops before the barrier).
#define SYNC() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); \
                    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)
"""

KERNELS = {}


def kernel(name, src):
    KERNELS[name] = PRELUDE + src
    return name


kernel("lds_reverse", r"""
MXGEMM_KERNEL(lds_reverse)(float* __restrict__ y, const float* __restrict__ x, float a, int n) {
  __shared__ float tile[256];
  int i = block_x() * 256 + thread_x();
  tile[thread_x()] = i < n ? x[i] : 0.f;
  SYNC();
  if (i < n) y[i] = a * tile[255 - thread_x()] + y[i];
}""")

kernel("divergent", r"""
MXGEMM_KERNEL(divergent)(int* __restrict__ out, const int* __restrict__ in, int n) {
  int i = block_x() * blockDim() + thread_x();
  if (i >= n) return;
  int v = in[i], acc = 0;
  for (int k = 0; k < (v & 15); ++k) {          // per-lane trip count
    if (k & 1) acc += k * v; else acc ^= (v >> k);
  }
  if (v < 0) acc = -acc - 7; else if (v % 3 == 0) acc = acc * 3 + (unsigned)v / 5u;
  out[i] = acc;
}""".replace("blockDim()", "__builtin_amdgcn_workgroup_size_x()"))

kernel("math", r"""
MXGEMM_KERNEL(math)(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b, int n) {
  int i = block_x() * 64 + thread_x();
  float x = a[i], y = b[i];
  float* o = out + 12 * i;
  o[0] = __builtin_fmaf(x, y, 1.5f);
  o[1] = x / y;
  o[2] = __builtin_sqrtf(__builtin_fabsf(x));
  o[3] = __builtin_fminf(x, y) - __builtin_fmaxf(x, 0.25f);
  o[4] = (float)(int)(x * 100.f);
  o[5] = (float)((unsigned)(__builtin_fabsf(y) * 1000.f) >> 3);
  o[6] = (float)(_Float16)(x * y);
  o[7] = __builtin_ldexpf(x, (int)(y * 4.f));
  o[8] = __builtin_floorf(x * 3.f) + __builtin_truncf(y * 7.f);
  o[9] = x > y ? x - 1.0f : y * 0.5f;
  o[10] = (float)((long)(x * 1e6f) * 3 / 7);
  o[11] = __builtin_copysignf(2.0f, y) * __builtin_amdgcn_rcpf(4.0f);
}""")

kernel("addr64", r"""
MXGEMM_KERNEL(addr64)(float* __restrict__ big, const float* __restrict__ src, long stride, int rows) {
  int r = block_x() * 64 + thread_x();
  if (r >= rows) return;
  big[(long)r * stride + r] = src[r] * 2.0f;     // offsets beyond 4 GB
}""")

kernel("buffer_oob", r"""
MXGEMM_KERNEL(buffer_oob)(float* __restrict__ y, const float* __restrict__ x, int nbytes, int shift) {
  auto rx = __builtin_amdgcn_make_buffer_rsrc((void*)x, 0, nbytes, 0x00027000);
  auto ry = __builtin_amdgcn_make_buffer_rsrc((void*)y, 0, nbytes, 0x00027000);
  int off = (thread_x() + shift) * 4;
  float v = __builtin_bit_cast(float, __builtin_amdgcn_raw_buffer_load_b32(rx, off, 0, 0));      // OOB lanes read 0
  __builtin_amdgcn_raw_buffer_store_b32(__builtin_bit_cast(unsigned, v + 1.0f), ry, thread_x() * 4 + 4 * shift, 0, 0);   // OOB dropped
}""")

kernel("to_lds", r"""
MXGEMM_KERNEL(to_lds)(float* __restrict__ y, const float* __restrict__ x, int nbytes) {
  __shared__ float t[64 * 8];
  auto r = __builtin_amdgcn_make_buffer_rsrc((void*)x, 0, nbytes, 0x00027000);
  int w = thread_x() / 64;
  __builtin_amdgcn_raw_ptr_buffer_load_lds(r, LDS(void, t + 64 * w), 4, thread_x() * 4, 0, 0, 0);
  __builtin_amdgcn_global_load_lds(GLB(void, x + thread_x()), LDS(void, t + 256 + 64 * w), 4, 0, 0);
  __builtin_amdgcn_s_waitcnt(0x0070);     // vmcnt(0) lgkmcnt(0)
  SYNC();
  int j = 255 - thread_x();
  y[thread_x()] = t[j] * 2.0f + t[256 + j];
}""")

kernel("xlane", r"""
MXGEMM_KERNEL(xlane)(int* __restrict__ out, const int* __restrict__ in) {
  int l = thread_x();
  int v = in[block_x() * 64 + l];
  // DPP row reduction, then swizzle and bpermute across rows
  v += __builtin_amdgcn_update_dpp(0, v, 0x111, 0xf, 0xf, false);   // row_shr:1
  v += __builtin_amdgcn_update_dpp(0, v, 0x112, 0xf, 0xf, false);   // row_shr:2
  v += __builtin_amdgcn_update_dpp(0, v, 0x114, 0xf, 0xf, false);   // row_shr:4
  v += __builtin_amdgcn_update_dpp(0, v, 0x118, 0xf, 0xf, false);   // row_shr:8
  int q = __builtin_amdgcn_mov_dpp(v, 0x1b, 0xf, 0xf, true);        // quad_perm [3,2,1,0]
  int s = __builtin_amdgcn_ds_swizzle(v, 0x401f);                    // swap 16
  int b = __builtin_amdgcn_ds_bpermute(((l + 17) & 63) * 4, v);
  int p = __builtin_amdgcn_ds_permute(((l + 5) & 63) * 4, v);
  int rl = __builtin_amdgcn_readfirstlane(v + 3);
  out[(block_x() * 64 + l) * 6 + 0] = v;
  out[(block_x() * 64 + l) * 6 + 1] = q;
  out[(block_x() * 64 + l) * 6 + 2] = s;
  out[(block_x() * 64 + l) * 6 + 3] = b;
  out[(block_x() * 64 + l) * 6 + 4] = p;
  out[(block_x() * 64 + l) * 6 + 5] = rl + __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0));
}""")

kernel("atomics", r"""
MXGEMM_KERNEL(atomics)(unsigned* __restrict__ hist, int* __restrict__ mx, const unsigned* __restrict__ in,
                       unsigned* __restrict__ ret) {
  int i = block_x() * 256 + thread_x();
  unsigned v = in[i];
  ret[i] = __atomic_fetch_add(&hist[v & 15], 1u, __ATOMIC_RELAXED) < 1000000u;
  __atomic_fetch_max(&mx[v & 3], (int)v, __ATOMIC_RELAXED);
  __shared__ unsigned cnt[16];
  if (thread_x() < 16) cnt[thread_x()] = 0;
  SYNC();
  __atomic_fetch_add(&cnt[(v >> 4) & 15], 1u, __ATOMIC_RELAXED);
  SYNC();
  if (thread_x() < 16) __atomic_fetch_add(&hist[16 + thread_x()], cnt[thread_x()], __ATOMIC_RELAXED);
}""")

# LDS-tiled GEMM: C[M,N] = A[M,K] @ B[K,N], 16x16 tiles, 256 threads, double-buffered.
kernel("gemm", r"""
MXGEMM_KERNEL(gemm)(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
                    int M, int N, int K) {
  __shared__ float As[2][16][17], Bs[2][16][17];
  int tx = thread_x() & 15, ty = thread_x() >> 4;
  int row = block_y() * 16 + ty, col = block_x() * 16 + tx;
  float acc = 0.f;
  As[0][ty][tx] = A[row * K + tx];
  Bs[0][ty][tx] = B[ty * N + col];
  SYNC();
  for (int k0 = 0; k0 < K; k0 += 16) {
    int cur = (k0 / 16) & 1;
    if (k0 + 16 < K) {
      As[cur ^ 1][ty][tx] = A[row * K + k0 + 16 + tx];
      Bs[cur ^ 1][ty][tx] = B[(k0 + 16 + ty) * N + col];
    }
    #pragma unroll 4
    for (int k = 0; k < 16; ++k) acc = __builtin_fmaf(As[cur][ty][k], Bs[cur][k][tx], acc);
    SYNC();
  }
  C[row * N + col] = acc;
}""")


@functools.lru_cache(maxsize=None)
def asm_of(name, arch="gfx950"):
    from mxgemm.toolchain import compile_hip_source
    return compile_hip_source(KERNELS[name], arch)


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------- cases
# Each case: name -> fn(emu, prog) running the kernel and asserting against numpy.

def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def case_lds_reverse(emu, prog):
    n = 1000
    x, y = rng(1).standard_normal(1024).astype(np.float32), rng(2).standard_normal(1024).astype(np.float32)
    yt = _t(y.copy())
    emu.launch(prog, "lds_reverse", grid=(4, 1, 1), block=(256, 1, 1), args=[yt, _t(x), 2.5, n])
    xs = np.where(np.arange(1024) < n, x, 0).reshape(4, 256)[:, ::-1].reshape(-1)
    ref = y.copy()
    ref[:n] = np.float32(2.5) * xs[:n] + y[:n]
    np.testing.assert_allclose(yt.numpy(), ref, rtol=1e-6, atol=1e-6)


def case_divergent(emu, prog):
    n = 300
    v = rng(3).integers(-1000, 1000, 320).astype(np.int32)
    out = torch.zeros(320, dtype=torch.int32)
    emu.launch(prog, "divergent", grid=(5, 1, 1), block=(64, 1, 1), args=[out, _t(v), n])
    ref = np.zeros(320, np.int64)
    for i in range(n):
        x, acc = int(v[i]), 0
        for k in range(x & 15):
            acc = acc + k * x if k & 1 else acc ^ (x >> k)
        acc = ((acc + 2**31) % 2**32) - 2**31
        if x < 0:
            acc = -acc - 7
        elif x % 3 == 0:
            acc = acc * 3 + (x & 0xFFFFFFFF) // 5
        ref[i] = ((acc + 2**31) % 2**32) - 2**31
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.int32))


def case_math(emu, prog):
    a = rng(4).uniform(-4, 4, 128).astype(np.float32)
    b = rng(5).uniform(0.1, 4, 128).astype(np.float32) * np.where(rng(6).random(128) < 0.5, -1, 1).astype(np.float32)
    out = torch.zeros(128 * 12)
    emu.launch(prog, "math", grid=(2, 1, 1), block=(64, 1, 1), args=[out, _t(a), _t(b), 128])
    o = out.numpy().reshape(128, 12)
    f = np.float32
    ref = np.stack([
        (a.astype(np.float64) * b + 1.5).astype(f), a / b, np.sqrt(np.abs(a)),
        np.minimum(a, b) - np.maximum(a, f(0.25)), np.trunc(a * f(100)),
        ((np.abs(b) * f(1000)).astype(np.uint32) >> 3).astype(f), (a * b).astype(np.float16).astype(f),
        np.ldexp(a, np.trunc(b * f(4)).astype(int)).astype(f), np.floor(a * f(3)) + np.trunc(b * f(7)),
        np.where(a > b, a - f(1), b * f(0.5)), ((np.trunc(a * f(1e6)).astype(np.int64) * 3) // 7).astype(f),
        np.copysign(f(2), b) * f(0.25)], axis=1)
    # C division truncates toward zero
    q = np.trunc(a * f(1e6)).astype(np.int64) * 3
    ref[:, 10] = (np.sign(q) * (np.abs(q) // 7)).astype(f)
    np.testing.assert_allclose(o, ref, rtol=2e-7, atol=0)


def case_addr64(emu, prog):
    rows, stride = 100, (5 << 30) // 4 // 64     # rows * stride * 4 bytes spans > 4 GB... at r >= 64
    stride = 50_000_000                           # 200 MB per row -> 20 GB buffer
    big = emu.sparse_buffer(rows * stride * 4 + 4 * rows)
    src = rng(7).standard_normal(rows).astype(np.float32)
    emu.launch(prog, "addr64", grid=(2, 1, 1), block=(64, 1, 1), args=[big, _t(src), stride, rows])
    for r in (0, 1, 21, 63, 64, 99):
        got = big.read((r * stride + r) * 4, 4).view(torch.float32).item()
        assert got == np.float32(src[r] * 2), (r, got)


def case_buffer_oob(emu, prog):
    for shift in (0, 3, -2):
        x = rng(8).standard_normal(64).astype(np.float32)
        y = torch.full((64,), -9.0)
        nbytes = 40 * 4
        emu.launch(prog, "buffer_oob", grid=1, block=64, args=[y, _t(x), nbytes, shift])
        lanes = np.arange(64)
        src = lanes + shift
        v = np.where((src >= 0) & (src < 40), x[np.clip(src, 0, 63)], 0).astype(np.float32) + 1
        dst = lanes + shift
        ref = np.full(64, -9.0, np.float32)
        ok = (dst >= 0) & (dst < 40)        # negative offsets are huge unsigned: out of range
        ref[dst[ok]] = v[ok]
        np.testing.assert_array_equal(y.numpy(), ref)


def case_to_lds(emu, prog):
    x = rng(9).standard_normal(256).astype(np.float32)
    y = torch.zeros(256)
    emu.launch(prog, "to_lds", grid=1, block=256, args=[y, _t(x), 200 * 4])
    xb = np.where(np.arange(256) < 200, x, 0)
    j = 255 - np.arange(256)
    np.testing.assert_array_equal(y.numpy(), xb[j] * 2 + x[j])


def case_xlane(emu, prog):
    v = rng(10).integers(-1000, 1000, 128).astype(np.int32)
    out = torch.zeros(128 * 6, dtype=torch.int32)
    emu.launch(prog, "xlane", grid=(2, 1, 1), block=(64, 1, 1), args=[out, _t(v)])
    o = out.numpy().reshape(128, 6)
    for b in range(2):
        x = v[b * 64:(b + 1) * 64].astype(np.int64)
        for sh in (1, 2, 4, 8):
            l = np.arange(64)
            src = np.where((l & 15) >= sh, x[np.maximum(l - sh, 0)], 0)
            x = x + src
        l = np.arange(64)
        q = x[(l & ~3) + 3 - (l & 3)]
        s = x[l ^ 16]
        bp = x[(l + 17) & 63]
        p = np.zeros(64, np.int64)
        p[(l + 5) & 63] = x
        rl = x[0] + 3 + l
        np.testing.assert_array_equal(o[b * 64:(b + 1) * 64], np.stack([x, q, s, bp, p, rl], 1).astype(np.int32))


def case_atomics(emu, prog):
    v = rng(11).integers(0, 2**31, 512).astype(np.uint32)
    hist = torch.zeros(32, dtype=torch.int32)
    mx = torch.full((4,), -1, dtype=torch.int32)
    ret = torch.zeros(512, dtype=torch.int32)
    emu.launch(prog, "atomics", grid=(2, 1, 1), block=(256, 1, 1), args=[hist, mx, _t(v), ret])
    ref = np.bincount(v & 15, minlength=16)
    ref2 = np.bincount((v >> 4) & 15, minlength=16)
    np.testing.assert_array_equal(hist.numpy(), np.concatenate([ref, ref2]))
    np.testing.assert_array_equal(mx.numpy(), [v[(v & 3) == k].astype(np.int64).max() for k in range(4)])
    assert (ret.numpy() == 1).all()


def case_gemm(emu, prog, M=32, N=64, K=64):
    a = rng(12).standard_normal((M, K)).astype(np.float32)
    b = rng(13).standard_normal((K, N)).astype(np.float32)
    c = torch.zeros(M, N)
    emu.launch(prog, "gemm", grid=(N // 16, M // 16, 1), block=(256, 1, 1), args=[c, _t(a), _t(b), M, N, K])
    np.testing.assert_allclose(c.numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}
