"""ds_read_b*_tr_b* and float atomics through compiled HIP builtins on the emulator."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from hip_run import run

SRC = r"""
typedef short v4s __attribute__((ext_vector_type(4)));
MXGEMM_KERNEL(tr_reads)(const int* src, const int* addr, int* out) {
  __shared__ int lds[1024];
  int t = mxgemm::thread_x();
  for (int i = t; i < 1024; i += 64) lds[i] = src[i];
  __builtin_amdgcn_s_waitcnt(0);
  __builtin_amdgcn_s_barrier();
  const char* base = (const char*)lds;
  v2i r4 = __builtin_amdgcn_ds_read_tr4_b64_v2i32(LDS_PTR(v2i, base + addr[t]));
  v2i r8 = __builtin_amdgcn_ds_read_tr8_b64_v2i32(LDS_PTR(v2i, base + addr[t] + 1024));
  v2i r16 = __builtin_bit_cast(v2i, __builtin_amdgcn_ds_read_tr16_b64_v4i16(LDS_PTR(v4s, base + addr[t] + 2048)));
  v3i r6 = __builtin_amdgcn_ds_read_tr6_b96_v3i32(LDS_PTR(v3i, base + addr[64 + t]));
  out[t * 9 + 0] = r4[0]; out[t * 9 + 1] = r4[1];
  out[t * 9 + 2] = r8[0]; out[t * 9 + 3] = r8[1];
  out[t * 9 + 4] = r16[0]; out[t * 9 + 5] = r16[1];
  out[t * 9 + 6] = r6[0]; out[t * 9 + 7] = r6[1]; out[t * 9 + 8] = r6[2];
}
MXGEMM_KERNEL(atomics)(v2bf* pb, v2h* ph, float* pf, unsigned* pu, const int* idx, const unsigned* val,
                       unsigned* ret) {
  int t = mxgemm::thread_x();
  int i = idx[t];
  unsigned v = val[t];
  v2bf vb = __builtin_bit_cast(v2bf, v);
  v2h vh = __builtin_bit_cast(v2h, v);
  __builtin_amdgcn_global_atomic_fadd_v2bf16(pb + i, vb);
  __builtin_amdgcn_global_atomic_fadd_v2f16(ph + i, vh);
  ret[t] = __builtin_bit_cast(unsigned, __builtin_amdgcn_global_atomic_fadd_f32(pf + i, __builtin_bit_cast(float, v)));
  unsigned expect = v & 7;
  __atomic_compare_exchange_n(pu + i, &expect, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  ret[64 + t] = expect;
}
"""


def tr_model(lds: bytes, addrs, nbytes, bits):
    """Triton's model (docs/gfx950_isa.md §3), 16-lane groups: lane i loads N = 8*nbytes/bits elements
    L[i][.]; lane j gets R[j][e] = L[(16/N) e + j/N][j % N]."""
    n = 8 * nbytes // bits
    out = []
    for lane in range(64):
        g, j = divmod(lane, 16)
        word = 0
        for e in range(n):
            src = 16 * g + (16 // n) * e + j // n
            blob = int.from_bytes(lds[addrs[src]: addrs[src] + nbytes], "little")
            item = (blob >> (bits * (j % n))) & ((1 << bits) - 1)
            word |= item << (bits * e)
        out.append([(word >> (32 * r)) & 0xFFFFFFFF for r in range(nbytes // 4)])
    return np.array(out, np.uint32)


def test_ds_read_tr():
    rng = np.random.default_rng(3)
    src = rng.integers(0, 1 << 32, 1024, dtype=np.uint64).astype(np.uint32)
    a8 = (rng.permutation(128)[:64] * 8).astype(np.int32)            # 8-byte aligned, < 1024
    a12 = (rng.permutation(80)[:64] * 12).astype(np.int32)           # 12-byte aligned (b96)
    out = run(SRC, "tr_reads", src, np.concatenate([a8, a12]), np.zeros(64 * 9, np.uint32))[2]
    out = out.reshape(64, 9)
    lds = src.tobytes()
    np.testing.assert_array_equal(out[:, 0:2], tr_model(lds, a8, 8, 4))
    np.testing.assert_array_equal(out[:, 2:4], tr_model(lds, a8 + 1024, 8, 8))
    np.testing.assert_array_equal(out[:, 4:6], tr_model(lds, a8 + 2048, 8, 16))
    np.testing.assert_array_equal(out[:, 6:9], tr_model(lds, a12, 12, 6))


def _seq_add(mem, idx, val, add):
    mem = mem.copy()
    old = np.zeros(64, mem.dtype)
    for lane in range(64):                       # same-address lanes apply in lane order
        old[lane] = mem[idx[lane]]
        mem[idx[lane]] = add(mem[idx[lane]], val[lane])
    return mem, old


def _half_add(dt):
    def add(o, v):
        a = np.array([o], np.uint32).view(dt).astype(np.float64)      # two halves
        b = np.array([v], np.uint32).view(dt).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            return (a + b).astype(dt).view(np.uint32)[0]               # RNE per half
    return add


def test_float_atomics():
    rng = np.random.default_rng(9)
    idx = rng.integers(0, 16, 64).astype(np.int32)                   # heavy contention
    val = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
    val = np.where((val & 0x7F800000) == 0x7F800000, val ^ 0x40000000, val)   # fewer NaN/Inf
    val = (val & 0x8FFF8FFF) | 0x30003000                              # moderate exponents
    init = (rng.integers(0, 1 << 32, 16, dtype=np.uint64).astype(np.uint32) & 0x8FFF8FFF) | 0x30003000
    cas = init.copy()
    cas[::2] = rng.integers(0, 8, 8)
    val[:16] = (val[:16] & ~np.uint32(7)) | (cas[idx[:16]] & 7)      # some compares succeed
    pb, ph, pf, pu, _, _, ret = run(SRC, "atomics", init, init, init, cas, idx, val, np.zeros(128, np.uint32))
    ref_b, _ = _seq_add(init, idx, val, _half_add(ml_dtypes.bfloat16))
    ref_h, _ = _seq_add(init, idx, val, _half_add(np.float16))
    f32 = lambda o, v: (np.array([o], np.uint32).view(np.float32).astype(np.float64)  # noqa: E731
                        + np.array([v], np.uint32).view(np.float32).astype(np.float64)).astype(np.float32).view(np.uint32)[0]
    ref_f, old_f = _seq_add(init, idx, val, f32)
    ref_u, old_u = _seq_add(cas, idx, val, lambda o, v: v if o == (v & 7) else o)
    np.testing.assert_array_equal(pb, ref_b)
    np.testing.assert_array_equal(ph, ref_h)
    np.testing.assert_array_equal(pf, ref_f)
    np.testing.assert_array_equal(ret[:64], old_f)
    np.testing.assert_array_equal(pu, ref_u)
    np.testing.assert_array_equal(ret[64:], old_u)


BUFFER_SRC = r"""
MXGEMM_KERNEL(buffer_atomics)(float* pf, unsigned* pb, v2h* ph, const int* off, const unsigned* val, int nbytes) {
  int t = mxgemm::thread_x();
  unsigned v = val[t];
  // num_records = nbytes: lanes whose offset reaches past it are dropped (raw buffer rule)
  __amdgpu_buffer_rsrc_t rf = __builtin_amdgcn_make_buffer_rsrc(pf, 0, nbytes, 0x00020000);
  __amdgpu_buffer_rsrc_t rb = __builtin_amdgcn_make_buffer_rsrc(pb, 0, nbytes, 0x00020000);
  __amdgpu_buffer_rsrc_t rh = __builtin_amdgcn_make_buffer_rsrc(ph, 0, nbytes, 0x00020000);
  __builtin_amdgcn_raw_ptr_buffer_atomic_fadd_f32(__builtin_bit_cast(float, v), rf, off[t], 0, 0);
  // clang has no raw-buffer bf16 atomic builtin: spell the instruction
  asm volatile("buffer_atomic_pk_add_bf16 %0, %1, %2, 0 offen" :: "v"(v), "v"(off[t]), "s"(rb) : "memory");
  __builtin_amdgcn_raw_ptr_buffer_atomic_fadd_v2f16(__builtin_bit_cast(v2h, v), rh, off[t], 0, 0);
}
"""


def test_buffer_float_atomics_drop_out_of_range_lanes():
    rng = np.random.default_rng(11)
    n = 16                                                            # 16 dwords = num_records 64 B
    dword = rng.integers(0, n + 4, 64).astype(np.int32)               # ~1/5 of lanes out of range
    val = (rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32) & 0x8FFF8FFF) | 0x30003000
    init = (rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32) & 0x8FFF8FFF) | 0x30003000
    pf, pb, ph, *_ = run(BUFFER_SRC, "buffer_atomics", init, init, init, dword * 4, val, scalars=(4 * n,))
    live = dword < n
    f32 = lambda o, v: (np.array([o], np.uint32).view(np.float32).astype(np.float64)  # noqa: E731
                        + np.array([v], np.uint32).view(np.float32).astype(np.float64)).astype(np.float32).view(np.uint32)[0]
    keep = lambda add: lambda o, v: add(o, v[1]) if v[0] else o  # noqa: E731  (dropped lanes: no effect)
    lanes = list(zip(live, val))
    idx = np.minimum(dword, n - 1)
    for got, add in ((pf, f32), (pb, _half_add(ml_dtypes.bfloat16)), (ph, _half_add(np.float16))):
        ref, _ = _seq_add(init, idx, lanes, keep(add))
        np.testing.assert_array_equal(got, ref)

