// The FP8 GEMM of AMD's CDNA4 GEMM blog, written here step by step as the blog describes its
// stages (docs/calibration_kernels.md): C[M, N] (bf16) = A[M, K] B[N, K]^T with
// E4M3 inputs, fp32 accumulation. They are the timing model's calibration corpus, not product
// kernels: each stage has a published MI355X time. M, N are multiples of the block tile and K
// of 128 (the blog's shapes); the launch grid is (N / BN, M / BM).
#include "mxgemm/mfma.h"

using namespace mxgemm;

namespace {

typedef __attribute__((address_space(3))) void lds_void;
typedef u32x4 __attribute__((address_space(3))) lds_u32x4;

MXGEMM_DEVICE uint16_t bf16_rne(float x) {
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);   // NaN stays NaN
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

MXGEMM_DEVICE float e4m3(uint8_t b) { return __builtin_amdgcn_cvt_f32_fp8((int)b, 0); }

}  // namespace

// Stage 1: one thread per output element, straight from global memory. Block 16 x 16.
MXGEMM_KERNEL(fp8_gemm_naive)(const uint8_t* A, const uint8_t* B, uint16_t* C, int M, int N, int K)
    __attribute__((amdgpu_flat_work_group_size(256, 256))) {
  const int row = block_y() * 16 + thread_y(), col = block_x() * 16 + thread_x();
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += e4m3(A[row * K + k]) * e4m3(B[col * K + k]);
  C[row * N + col] = bf16_rne(acc);
}

// Stage 2: 16 x 16 tiles of A and B staged in LDS as fp32 and reused by the block. Block 16 x 16.
// The indexing is the one the blog prints for this stage: a thread stages B at its own output
// column, so the 16 lanes of a row read 16 B rows K bytes apart (4 bytes of each line a wave).
MXGEMM_KERNEL(fp8_gemm_lds_tiled)(const uint8_t* A, const uint8_t* B, uint16_t* C, int M, int N, int K)
    __attribute__((amdgpu_flat_work_group_size(256, 256))) {
  __shared__ float as[16][16], bs[16][16];
  const int ty = thread_y(), tx = thread_x();
  const int row = block_y() * 16 + ty, col = block_x() * 16 + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += 16) {
    as[ty][tx] = e4m3(A[row * K + k0 + tx]);
    bs[ty][tx] = e4m3(B[col * K + k0 + ty]);
    syncthreads();
    for (int k = 0; k < 16; ++k) acc += as[ty][k] * bs[k][tx];
    syncthreads();
  }
  C[row * N + col] = bf16_rne(acc);
}

namespace {

enum Load { kScalar, kVector, kDirect };   // global -> LDS: bytes or 16 B through VGPRs, or LDS DMA

// The blog's LDS swizzle for ds_read_b128: 16-byte column c of row r is stored at c ^ perm(r).
MXGEMM_DEVICE uint32_t swizzled(uint32_t row, uint32_t col16, bool swizzle) {
  const uint32_t pair = (row >> 1) & 7u;
  return swizzle ? col16 ^ (pair ^ (((pair >> 1) ^ (pair >> 2)) & 1u)) : col16;
}

// One LDS DMA instruction: rows 8 * chunk .. + 7 of a 128-byte-wide tile (rows from `row0`, K
// bytes from `k0`) fill 1024 contiguous LDS bytes (64 lanes x 16 B). The lane writing LDS column
// c of row r fetches the global column that belongs there.
template <bool SWIZZLE>
MXGEMM_DEVICE void dma_chunk(buffer_rsrc rsrc, int row0, int K, int k0, uint8_t* lds, uint32_t chunk, uint32_t lane) {
  const uint32_t r = chunk * 8u + lane / 8u, c = swizzled(r, lane % 8u, SWIZZLE);
  __builtin_amdgcn_raw_ptr_buffer_load_lds(rsrc, (lds_void*)(lds + chunk * 1024u), 16,
                                           (int)((row0 + r) * K + c * 16u), k0, 0, 0);
}

// Global -> LDS copy of one ROWS x 128-byte tile (rows from `row0`, K bytes from `k0`).
template <int ROWS, int THREADS, Load LOAD, bool SWIZZLE>
MXGEMM_DEVICE void load_tile(const uint8_t* g, buffer_rsrc rsrc, int row0, int K, int k0, uint8_t* lds) {
  const uint32_t tid = thread_x();
  if constexpr (LOAD == kScalar) {
    for (uint32_t i = tid; i < ROWS * 128u; i += THREADS) {
      const uint32_t r = i / 128u, c = i % 128u;
      lds[r * 128u + swizzled(r, c / 16u, SWIZZLE) * 16u + c % 16u] = g[(row0 + r) * K + k0 + c];
    }
  } else if constexpr (LOAD == kVector) {
    for (uint32_t i = tid; i < ROWS * 8u; i += THREADS) {
      const uint32_t r = i / 8u, c = i % 8u;
      *(lds_u32x4*)(lds_void*)(lds + r * 128u + swizzled(r, c, SWIZZLE) * 16u) =
          load_b128(rsrc, (row0 + r) * K + k0 + c * 16u);
    }
  } else {
    for (uint32_t chunk = tid / 64u; chunk < ROWS / 8u; chunk += THREADS / 64u)
      dma_chunk<SWIZZLE>(rsrc, row0, K, k0, lds, chunk, tid % 64u);
  }
}

// One MFMA operand (16 rows x 128 K) from an LDS tile at row `row`: two ds_read_b128.
template <bool SWIZZLE>
MXGEMM_DEVICE i32x8 read_operand(const uint8_t* lds, uint32_t row, uint32_t lane) {
  const uint32_t r = row + lane % 16u;
  const u32x4 lo = *(const lds_u32x4*)(const lds_void*)(lds + r * 128u + swizzled(r, lane / 16u, SWIZZLE) * 16u);
  const u32x4 hi = *(const lds_u32x4*)(const lds_void*)(lds + r * 128u + swizzled(r, 4u + lane / 16u, SWIZZLE) * 16u);
  return mfma_fp8_operand(lo, hi);
}

// A wave's TM x TN 16 x 16 MFMA tiles of C from (row0, col0), rounded to bf16. D[i][j] of a
// 16 x 16 tile sits in lane j + 16 * (i / 4), register i % 4.
template <int TM, int TN>
MXGEMM_DEVICE void store_tile(uint16_t* C, int N, const f32x4 (&acc)[TM][TN], int row0, int col0, uint32_t lane) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row0 + 16 * i + 4 * (lane / 16u) + r, col = col0 + 16 * j + lane % 16u;
        C[row * N + col] = bf16_rne(acc[i][j][r]);
      }
}

// Stages 3-8: a BM x BN block tile of WM x WN waves, each owning (BM / WM) x (BN / WN) outputs
// as 16 x 16 MFMA tiles, K in 128-byte tiles through LDS (BUFFERS = 2: the next tile is loaded
// while the current one is computed).
template <int BM, int BN, int WM, int WN, Load LOAD, bool SWIZZLE, int BUFFERS>
MXGEMM_DEVICE void mfma_gemm(const uint8_t* A, const uint8_t* B, uint16_t* C, int M, int N, int K) {
  constexpr int THREADS = 64 * WM * WN, TM = BM / WM / 16, TN = BN / WN / 16;
  constexpr int TILE = (BM + BN) * 128;
  __shared__ __attribute__((aligned(16))) uint8_t lds[BUFFERS * TILE];
  const uint32_t tid = thread_x(), lane = tid % 64u, wave = tid / 64u;
  const int m0 = block_y() * BM, n0 = block_x() * BN;
  const uint32_t wm = wave / WN * (BM / WM), wn = wave % WN * (BN / WN);
  const buffer_rsrc ra = make_buffer(A, (uint32_t)(M * K)), rb = make_buffer(B, (uint32_t)(N * K));
  f32x4 acc[TM][TN] = {};
  auto load = [&](int kt, uint8_t* buf) {
    load_tile<BM, THREADS, LOAD, SWIZZLE>(A, ra, m0, K, kt * 128, buf);
    load_tile<BN, THREADS, LOAD, SWIZZLE>(B, rb, n0, K, kt * 128, buf + BM * 128);
  };
  auto compute = [&](const uint8_t* buf) {
    i32x8 b[TN];
#pragma unroll
    for (int j = 0; j < TN; ++j) b[j] = read_operand<SWIZZLE>(buf + BM * 128, wn + 16u * j, lane);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const i32x8 a = read_operand<SWIZZLE>(buf, wm + 16u * i, lane);
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = mfma_scale_16x16x128_e4m3(a, b[j], acc[i][j], 127, 127);
    }
  };
  const int steps = K / 128;
  if constexpr (BUFFERS == 1) {
    for (int kt = 0; kt < steps; ++kt) {
      load(kt, lds);
      syncthreads();   // its release fence waits for the loads (vmcnt), LDS DMA included
      compute(lds);
      syncthreads();
    }
  } else {
    load(0, lds);
    syncthreads();
    for (int kt = 0; kt < steps; ++kt) {
      if (kt + 1 < steps) load(kt + 1, lds + ((kt + 1) & 1) * TILE);
      compute(lds + (kt & 1) * TILE);
      syncthreads();
    }
  }
  store_tile<TM, TN>(C, N, acc, m0 + wm, n0 + wn, lane);
}

}  // namespace

// Launch bounds: the workgroup size, so the compiler may give each wave its share of 512 registers.
#define STAGE(name, BM, BN, WM, WN, LOAD, SWIZZLE, BUFFERS)                                           \
  MXGEMM_KERNEL(name)(const uint8_t* A, const uint8_t* B, uint16_t* C, int M, int N, int K)             \
      __attribute__((amdgpu_flat_work_group_size(64 * WM * WN, 64 * WM * WN))) {                        \
    mfma_gemm<BM, BN, WM, WN, LOAD, SWIZZLE, BUFFERS>(A, B, C, M, N, K);                             \
  }

// 4 waves (2 x 2) on a 64 x 64 tile: MFMA, then 16-byte loads, then LDS DMA, then swizzle,
// then double buffering; then more waves and larger tiles.
STAGE(fp8_gemm_mfma, 64, 64, 2, 2, kScalar, false, 1)
STAGE(fp8_gemm_vector_loads, 64, 64, 2, 2, kVector, false, 1)
STAGE(fp8_gemm_direct_to_lds, 64, 64, 2, 2, kDirect, false, 1)
STAGE(fp8_gemm_swizzled, 64, 64, 2, 2, kDirect, true, 1)
STAGE(fp8_gemm_double_buffer, 64, 64, 2, 2, kDirect, true, 2)
STAGE(fp8_gemm_128x128_8wave, 128, 128, 2, 4, kDirect, true, 2)
STAGE(fp8_gemm_256x256_8wave, 256, 256, 2, 4, kDirect, true, 2)
STAGE(fp8_gemm_256x256_16wave, 256, 256, 4, 4, kDirect, true, 2)

namespace {

// s_waitcnt immediates (docs/gfx950_isa.md §7: vmcnt [3:0] and [15:14], expcnt [6:4], lgkmcnt
// [11:8]); the counters not named stay at their maximum, i.e. are not waited for.
constexpr int vmcnt(int n) { return (n & 15) | (n >> 4) << 14 | 7 << 4 | 15 << 8; }
constexpr int lgkmcnt(int n) { return 15 | 3 << 14 | 7 << 4 | n << 8; }

}  // namespace

// Stage 11: the 256 x 256 8-wave tile with the ping-pong schedule (HipKittens'). The two waves of
// a SIMD (w and w + 4) run one barrier apart, the wave_m == 1 half of the workgroup stalled by one
// extra s_barrier at the start, so that while one issues its LDS reads and global -> LDS loads the
// other runs its MFMA cluster (at raised priority). LDS: two buffers of four 128 x 128-byte halves
// (A rows 0-127, 128-255, B rows 0-127, 128-255), 128 KB. Each wave owns 64 rows of each A half
// times 32 rows of each B half: four 64 x 32 blocks, one per phase pair. K tile t + 2 is loaded
// into t's buffer half by half as soon as every wave has read that half of tile t; explicit
// vmcnt waits before the barriers make tile t + 1 visible, so no wave drains its loads.
MXGEMM_KERNEL(fp8_gemm_256x256_pingpong)(const uint8_t* A, const uint8_t* B, uint16_t* C, int M, int N, int K)
    __attribute__((amdgpu_flat_work_group_size(512, 512))) {
  constexpr int HALF = 128 * 128;
  __shared__ __attribute__((aligned(16))) uint8_t lds[2][4][HALF];
  const uint32_t lane = thread_x() % 64u, wave = __builtin_amdgcn_readfirstlane(thread_x() / 64u);
  const uint32_t wm = wave / 4u * 64u, wn = wave % 4u * 32u;
  const int m0 = block_y() * 256, n0 = block_x() * 256;
  const buffer_rsrc ra = make_buffer(A, (uint32_t)(M * K)), rb = make_buffer(B, (uint32_t)(N * K));
  enum { A0, A1, B0, B1 };
  auto load = [&](int kt, int half) {   // a 128 x 128-byte half: two LDS DMA instructions per wave
    const bool b = half >= B0;
    const int row0 = (b ? n0 : m0) + 128 * (half & 1);
    dma_chunk<true>(b ? rb : ra, row0, K, kt * 128, lds[kt & 1][half], wave, lane);
    dma_chunk<true>(b ? rb : ra, row0, K, kt * 128, lds[kt & 1][half], wave + 8u, lane);
  };
  auto sync = [] {   // the phase boundary: no instruction is scheduled across it
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_sched_barrier(0);
  };
  f32x4 acc[4][4][2] = {};   // [A half * 2 + B half][16-row tile][16-column tile]
  i32x8 a[4], b[2][2];       // the A half being used, both B halves' operands
  auto read_a = [&](int kt, int half) {   // 8 ds_read_b128
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = read_operand<true>(lds[kt & 1][half], wm + 16u * i, lane);
  };
  auto read_b = [&](int kt, int half) {   // 4 ds_read_b128
#pragma unroll
    for (int j = 0; j < 2; ++j) b[half][j] = read_operand<true>(lds[kt & 1][B0 + half], wn + 16u * j, lane);
  };
  auto mma = [&](int ah, int bh) {
    __builtin_amdgcn_s_setprio(1);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        acc[ah * 2 + bh][i][j] = mfma_scale_16x16x128_e4m3(a[i], b[bh][j], acc[ah * 2 + bh][i][j], 127, 127);
    __builtin_amdgcn_s_setprio(0);
  };
  // One K tile in eight phases, memory and MFMA alternating. `ahead`: how many of the next two
  // tiles are still to load (2 in the steady state; 1, 0 for the last two tiles).
  auto tile = [&](int kt, int ahead) {
    read_b(kt, 0);
    read_a(kt, A0);
    if (ahead >= 1) load(kt + 1, A1);
    __builtin_amdgcn_s_waitcnt(lgkmcnt(8));   // B half 0 read: A half 0 is still arriving
    sync();
    __builtin_amdgcn_s_waitcnt(lgkmcnt(0));
    mma(0, 0);
    sync();
    read_b(kt, 1);
    if (ahead == 2) load(kt + 2, A0);         // every wave read tile kt's A half 0 a phase ago
    sync();
    __builtin_amdgcn_s_waitcnt(lgkmcnt(0));
    mma(0, 1);
    sync();
    read_a(kt, A1);
    if (ahead == 2) load(kt + 2, B0);
    sync();
    __builtin_amdgcn_s_waitcnt(lgkmcnt(0));
    mma(1, 0);
    sync();
    if (ahead == 2) {
      load(kt + 2, B1);
      __builtin_amdgcn_s_waitcnt(vmcnt(6));   // tile kt + 1 landed; kt + 2's first three halves may fly
    } else if (ahead == 1) {
      __builtin_amdgcn_s_waitcnt(vmcnt(0));
    }
    sync();
    mma(1, 1);
    sync();
  };
  const int steps = K / 128;
  load(0, B0);
  load(0, A0);
  load(0, B1);
  load(0, A1);
  if (wm) __builtin_amdgcn_s_barrier();        // the second wave of each SIMD starts a phase late
  __builtin_amdgcn_s_waitcnt(vmcnt(4));        // tile 0's B half 0 and A half 0
  sync();
  if (steps > 1) {
    load(1, A0);
    load(1, B0);
    load(1, B1);
    __builtin_amdgcn_s_waitcnt(vmcnt(6));      // all of tile 0
  } else {
    __builtin_amdgcn_s_waitcnt(vmcnt(0));
  }
  sync();
  // Unrolled by two by hand (the barriers are convergent: LLVM will not unroll a runtime count),
  // so each copy's LDS buffer is a constant.
  int kt = 0;
  for (; kt + 1 < steps - 2; kt += 2) {
    tile(kt, 2);
    tile(kt + 1, 2);
  }
  if (kt < steps - 2) tile(kt, 2);
  if (steps > 1) tile(steps - 2, 1);
  tile(steps - 1, 0);
  if (!wm) __builtin_amdgcn_s_barrier();       // the same barrier count for every wave
#pragma unroll
  for (int h = 0; h < 4; ++h) store_tile<4, 2>(C, N, acc[h], m0 + h / 2 * 128 + wm, n0 + h % 2 * 128 + wn, lane);
}
