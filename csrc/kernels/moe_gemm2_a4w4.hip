// a4w4 MXFP4 MoE gemm2 (down-projection) for gfx950: the HIP reference kernel.
// flydsl_kernels/moe_gemm2_a4w4.py is its 1:1 FlyDSL port; the two must stay bit-identical,
// so any change to tiles, MFMA order or epilog arithmetic goes into both. Where a load is issued
// may differ (the port reads the top-k weights in its prologue).
//
//   out[token, n] += bf16( w_topk * sum_k A[token*topk + slot, k] * W[expert, n, k] )
//
// Operands (all row-major, natural layout: no weight pre-shuffle is needed because each lane
// loads 32 contiguous bytes of one row, see "K mapping" below):
//   a        [T*topk, K/2]  packed e2m1 (even k in the low nibble); row = token*topk + slot
//   a_scale  [T*topk, K/32] e8m0
//   w        [E, N, K/2]    packed e2m1
//   w_scale  [E, N, K/32]   e8m0
//   sorted_token_ids [num_blocks*BM] int32, (slot << 24) | token; padding has token >= T
//   sorted_expert_ids [num_blocks] int32 (the expert of each BM-row block)
//   num_valid_ids [>=1] int32: sorted rows below num_valid_ids[0] are live
//   sorted_weights [num_blocks*BM] f32 (top-k weight of each sorted row)
//   out      [T, N] bf16, accumulated with global_atomic_pk_add_bf16; with ROUTE_ROWS
//            [T*topk, N] bf16, row token*topk + slot written with plain stores (no sum)
// Launch: grid = (N/256, blocks, 1), block = (256, 1, 1), blocks = the routing's block count (also
// an argument: the tile order of ROUTE_ROWS permutes the grid). K % 256 == 0, N % 256 == 0.
//
// Tiles: a workgroup owns BM sorted rows x 256 output columns; wave w owns columns
// [64w, 64w+64) as 4 MFMA n-tiles. The MFMA computes D^T = W * A^T (src0 = W rows = n,
// src1 = activation rows = m) so that each lane ends up holding 4 consecutive output
// columns of ONE token row, which is what a packed bf16 atomic needs.
//
// K mapping (per 256-wide K step, two v_mfma_scale_f32_16x16x128_f8f6f4 "k-steps" s = 0, 1):
// lane l (g = l/16) of an operand holds row l%16 and, in k-step s, the 32-wide K block
// 2g+s. So a lane's data for both k-steps is 32 contiguous bytes (two 128-bit loads) and
// its two e8m0 scales are 2 contiguous bytes (one ushort load; op_sel picks byte s). The
// hardware reads the scale of row r, block b from lane r+16*(b%4-block slot) == the lane
// that holds the data, so data and scale of a lane always match. Both operands use the
// same K permutation, so the dot product is over the same K pairs as the plain order.
//
// Activations: BM rows x 128 bytes per K step go to LDS with buffer_load_dwordx4 ... lds
// (in DMA round r, lane t of wave w writes 16 bytes at r*4096 + w*1024 + t*16; BM 64 / 128
// take 2 / 4 rounds) into two buffers of max(4 KiB, BM * 128 B). The 16-byte
// chunk c of row r is stored at chunk c ^ (r & 7) to spread the ds_read_b128 of one MFMA
// operand over the banks. Rows that are padding (or beyond num_valid_ids) load from an
// out-of-range voffset, so the DMA writes zeros and their atomics are skipped. With BM=16
// waves 2-3 carry no rows: they DMA zeros from an empty resource into the unused upper
// half of the buffer, so that every wave runs the same branch-free step.
//
// Pipeline, one barrier per K step kt (W and scales are prefetched one step ahead into two
// register sets used alternately; K steps run in pairs plus an odd tail step):
//   s_waitcnt vmcnt(0) ; fence ; s_barrier ; fence   (A(kt) DMA and W(kt) landed for every
//                                                     wave; every wave has finished reading
//                                                     the LDS buffer A(kt+1) overwrites)
//   ds_read A(kt) ; issue W(kt+1), scales(kt+1), DMA A(kt+1) -> other buffer (after the
//   last step: empty resource, loads return zeros without touching memory)
//   s_waitcnt lgkmcnt(0) ; 2 x M_TILES x 4 MFMAs ; sched_barrier (keeps them in this step)
// Epilog: per m-tile (lanes of padding rows skip), per n-tile: f32 * top-k weight, RNE to
// bf16, two global_atomic_pk_add_bf16 into the token's row; with ROUTE_ROWS one 8-byte store
// into the route's row instead (the top-k sum is left to the caller, as vLLM's fused MoE does:
// at prefill the atomics, one per packed pair and route, are what the L2 spends its time on).
#include "mxgemm/device.h"

#ifndef BM
#define BM 32
#endif
#ifndef NT
#define NT 0
#endif
#ifndef ROUTE_ROWS
#define ROUTE_ROWS 0
#endif

using namespace mxgemm;

namespace {

constexpr int kThreads = 256;
constexpr int kBlockN = 256;                // output columns per workgroup
constexpr int kBlockK = 256;                // K per pipeline step (two MFMA k-steps)
constexpr int kRowBytes = kBlockK / 2;      // bytes of one packed fp4 row per step
constexpr int kWaveN = kBlockN / 4;         // columns per wave
constexpr int kNTiles = kWaveN / 16;        // MFMA n-tiles per wave
constexpr int kMTiles = BM / 16;            // MFMA m-tiles per workgroup
constexpr int kTileBytes = BM * kRowBytes;  // A bytes per K step
constexpr int kRoundBytes = 4 * 64 * 16;    // one 16 B/lane DMA by every wave
constexpr int kDmaRounds = kTileBytes > kRoundBytes ? kTileBytes / kRoundBytes : 1;  // DMAs per wave per step
constexpr int kDmaWaves = kTileBytes / (kDmaRounds * 64 * 16);  // waves whose DMA carries A
constexpr int kBufBytes = kDmaRounds * kRoundBytes;              // one LDS buffer: every DMA slot
constexpr unsigned kInvalidOffset = 0x80000000u;   // raw-buffer voffset out of range -> 0
constexpr unsigned kBufferFlags = 0x00027000u;     // dword3 of a raw gfx9 buffer V#
constexpr int kAuxW = NT ? 2 : 0;                  // cache policy bit 1 = nt on gfx950
// Tiles in XCD order (xcd_tile) for a row per route above 16-row blocks: a decode block's expert
// rarely fills a second block, so there the order saves nothing and its scalar math only delays
// the start (T 1: 4.63 -> 5.00 us). The summing form keeps grid order, the order its bf16 sums
// are tested in.
constexpr bool kXcdOrder = ROUTE_ROWS && BM > 16;
static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "BM must be 16, 32, 64 or 128");
static_assert(kDmaWaves >= 1 && kDmaWaves <= 4, "A tile must be 1..4 waves of 16-byte DMA");
static_assert(kTileBytes <= kBufBytes, "A tile must fit one LDS buffer");

typedef int v4i __attribute__((ext_vector_type(4)));
typedef int v8i __attribute__((ext_vector_type(8)));
typedef float v4f __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x2 __attribute__((ext_vector_type(2)));
typedef __bf16 bf16x4 __attribute__((ext_vector_type(4)));
typedef __attribute__((address_space(3))) void lds_void;

MXGEMM_DEVICE __amdgpu_buffer_rsrc_t make_rsrc(const void* base, uint32_t bytes) {
  return __builtin_amdgcn_make_buffer_rsrc(const_cast<void*>(base), (short)0, (int)bytes, (int)kBufferFlags);
}

// s_waitcnt vmcnt(n) with lgkmcnt/expcnt left alone (gfx9 encoding: vmcnt split over
// bits [3:0] and [15:14]; docs/gfx950_isa.md §7).
#define WAIT_VMCNT(n) __builtin_amdgcn_s_waitcnt(((n) & 0xF) | (((n) >> 4) << 14) | (0x7 << 4) | (0xF << 8))
// s_waitcnt lgkmcnt(0) only.
#define WAIT_LGKMCNT0() __builtin_amdgcn_s_waitcnt(0xC07F)

// A sorted row -> (expanded activation row, token, index safe to load at); arow < 0 for
// padding. sorted_token_ids is read at idx when idx < num_valid, else at 0 (the kernel only
// runs when num_valid > 0), so every load is in bounds and there is no branch.
struct SortedRow {
  int arow;
  int token;
  int safe;
};
MXGEMM_DEVICE SortedRow sorted_row(const int32_t* sorted_token_ids, int idx, int num_valid, int tokens, int topk) {
  const bool live = idx < num_valid;
  const int safe = live ? idx : 0;
  const uint32_t id = (uint32_t)sorted_token_ids[safe];
  const int token = (int)(id & 0xFFFFFFu), slot = (int)(id >> 24);
  const bool ok = live && token < tokens && slot < topk;
  return SortedRow{ok ? token * topk + slot : -1, token, safe};
}

// One MFMA k-step S (compile-time: it is the op_sel byte of both scales) over all tiles,
// m-tile outer, n-tile inner.
struct StepRegs {
  v4i wf[kNTiles][2];     // W data: n-tile, k-step
  uint32_t ws[kNTiles];   // W scales: byte s = k-step s
  uint32_t as[kMTiles];   // activation scales: byte s = k-step s
};

template <int S>
MXGEMM_DEVICE void mfma_k_step(v4f (&acc)[kNTiles][kMTiles], const StepRegs& r, const v4i (&af)[kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      // e2m1 uses the low 4 of the 8 operand registers.
      const v8i wa = {r.wf[nt][S][0], r.wf[nt][S][1], r.wf[nt][S][2], r.wf[nt][S][3], 0, 0, 0, 0};
      const v8i ab = {af[mt][S][0], af[mt][S][1], af[mt][S][2], af[mt][S][3], 0, 0, 0, 0};
      // cbsz = blgp = 4: both operands e2m1; op_sel S picks byte S of each scale word.
      acc[nt][mt] = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(wa, ab, acc[nt][mt], 4, 4, S, (int)r.ws[nt], S,
                                                                     (int)r.as[mt]);
    }
}

// The tile (column block, row block) of grid workgroup (x, y), x fastest. The hardware deals
// workgroup ids to the 8 XCDs in turn, so in grid order an expert's next row block, 28 ids on at
// N 7168, runs on another XCD and reads the expert's weights from memory again. Instead, per chunk
// of 8 row blocks (its first id a multiple of 8), each XCD takes a contiguous run of the
// chunk's tiles in column-major order: a column's row blocks one after another, on one XCD. The
// last ids % 8 of a chunk keep their place; a permutation of the grid (rows: its y size).
struct Tile {
  int column;
  int row;
};
MXGEMM_DEVICE Tile xcd_tile(int x, int y, int columns, int grid_rows) {
  constexpr int kXcds = 8;
  const int first = y - y % kXcds, rows = grid_rows - first < kXcds ? grid_rows - first : kXcds;
  const int count = rows * columns, dealt = count - count % kXcds, w = (y - first) * columns + x;
  const int q = w < dealt ? w % kXcds * (dealt / kXcds) + w / kXcds : w;
  return Tile{q / rows, first + q % rows};
}

}  // namespace

// 256 threads exactly: lets the compiler use up to 512 VGPRs per lane (default bounds assume 1024).
extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(kThreads, kThreads))) void moe_gemm2_a4w4(const uint8_t* __restrict__ a, const uint8_t* __restrict__ a_scale,
                              const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scale,
                              const int32_t* __restrict__ sorted_token_ids,
                              const int32_t* __restrict__ sorted_expert_ids,
                              const int32_t* __restrict__ num_valid_ids,
                              const float* __restrict__ sorted_weights, __bf16* __restrict__ out,
                              int tokens, int topk, int experts, int n, int k, int blocks) {
#if defined(__gfx950__)
  // Two A buffers: with BM=16 waves 2-3 DMA zeros (empty resource) into the upper half, so
  // that every wave runs the same branch-free step.
  __shared__ __attribute__((aligned(16))) uint8_t lds[2 * kBufBytes];

  const Tile tile = kXcdOrder ? xcd_tile((int)block_x(), (int)block_y(), n / kBlockN, blocks)
                              : Tile{(int)block_x(), (int)block_y()};
  const int block_m = tile.row, m0 = block_m * BM;
  const int num_valid = num_valid_ids[0];
  if (m0 >= num_valid) return;
  const int expert = sorted_expert_ids[block_m];
  if (expert < 0 || expert >= experts) return;

  const int tid = (int)thread_x(), lane = tid % 64;
  const int wave = __builtin_amdgcn_readfirstlane(tid / 64);  // uniform: scalar branches
  const int g = lane / 16, r16 = lane % 16;
  const int n_wave = tile.column * kBlockN + wave * kWaveN;
  const uint32_t k_bytes = (uint32_t)k / 2, k_scales = (uint32_t)k / 32;
  const int k_steps = k / kBlockK;

  // Buffer resources: A over all expanded rows, W rebased to this expert (so only one
  // expert's slice has to fit the 2 GB raw-buffer range).
  const uint32_t a_rows = (uint32_t)tokens * (uint32_t)topk;
  const auto a_rsrc = make_rsrc(a, a_rows * k_bytes);
  const auto as_rsrc = make_rsrc(a_scale, a_rows * k_scales);
  const uint64_t w_expert_bytes = (uint64_t)n * k_bytes, ws_expert_bytes = (uint64_t)n * k_scales;
  const auto w_rsrc = make_rsrc(w + (uint64_t)expert * w_expert_bytes, (uint32_t)w_expert_bytes);
  const auto ws_rsrc = make_rsrc(w_scale + (uint64_t)expert * ws_expert_bytes, (uint32_t)ws_expert_bytes);

  // This lane's share of the A DMA: in round r, slot t = r*256 + wave*64 + lane holds row
  // t/8, LDS chunk t%8, i.e. memory chunk (t%8) ^ (row & 7).
  const bool dma_wave = wave < kDmaWaves;
  uint32_t dma_voff[kDmaRounds];
#pragma unroll
  for (int r = 0; r < kDmaRounds; ++r) {
    const int t = r * 256 + wave * 64 + lane, row = t / 8, chunk = (t % 8) ^ (row & 7);
    const SortedRow sr = sorted_row(sorted_token_ids, m0 + row, num_valid, tokens, topk);
    dma_voff[r] = dma_wave && sr.arow >= 0 ? (uint32_t)sr.arow * k_bytes + (uint32_t)chunk * 16u : kInvalidOffset;
  }

  // The rows this lane feeds to the MFMA (src1) and later accumulates into out.
  SortedRow rows[kMTiles];
  uint32_t as_voff[kMTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    rows[mt] = sorted_row(sorted_token_ids, m0 + mt * 16 + r16, num_valid, tokens, topk);
    as_voff[mt] = rows[mt].arow >= 0 ? (uint32_t)rows[mt].arow * k_scales + 2u * (uint32_t)g : kInvalidOffset;
  }
  // W rows of this lane (src0), one per n-tile.
  uint32_t w_voff[kNTiles], ws_voff[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const uint32_t nrow = (uint32_t)(n_wave + nt * 16 + r16);
    w_voff[nt] = nrow * k_bytes + 32u * (uint32_t)g;
    ws_voff[nt] = nrow * k_scales + 2u * (uint32_t)g;
  }
  // LDS byte offsets of this lane's two A chunks (2g, 2g+1) per m-tile (swizzled).
  uint32_t a_lds_off[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int row = mt * 16 + r16;
      a_lds_off[mt][s] = (uint32_t)(row * kRowBytes + (((2 * g + s) ^ (row & 7)) * 16));
    }

  v4f acc[kNTiles][kMTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) acc[nt][mt] = v4f{0.f, 0.f, 0.f, 0.f};

  // Register operands of one K step, loaded one step ahead of their MFMAs. `live` false
  // (the prefetch after the last step) swaps in empty buffer resources: every load then
  // returns zeros without touching memory, and there is no branch for the compiler to
  // schedule around.
  const auto null_rsrc = make_rsrc(nullptr, 0);
  auto load_step = [&](int kt, bool live) {
    StepRegs r;
    const auto wr = live ? w_rsrc : null_rsrc, wsr = live ? ws_rsrc : null_rsrc, asr = live ? as_rsrc : null_rsrc;
    const int soff_data = kt * kRowBytes, soff_scale = kt * (kBlockK / 32);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int s = 0; s < 2; ++s)
        r.wf[nt][s] = __builtin_bit_cast(
            v4i, __builtin_amdgcn_raw_buffer_load_b128(wr, (int)w_voff[nt] + 16 * s, soff_data, kAuxW));
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
      r.ws[nt] = __builtin_amdgcn_raw_buffer_load_b16(wsr, (int)ws_voff[nt], soff_scale, kAuxW);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      r.as[mt] = __builtin_amdgcn_raw_buffer_load_b16(asr, (int)as_voff[mt], soff_scale, 0);
    return r;
  };
  // A(kt) -> LDS buffer kt&1. Waves without A rows, and the DMA after the last step, write
  // zeros (empty resource) into LDS nobody reads.
  auto dma_step = [&](int kt, bool live) {
    const auto rsrc = live && dma_wave ? a_rsrc : null_rsrc;
#pragma unroll
    for (int r = 0; r < kDmaRounds; ++r)  // LDS destination: wave-uniform, becomes M0
      __builtin_amdgcn_raw_ptr_buffer_load_lds(
          rsrc, (lds_void*)(lds + (kt & 1) * kBufBytes + r * kRoundBytes + wave * 1024), 16, (int)dma_voff[r],
          kt * kRowBytes, 0, 0);
  };

  // One K step: MFMAs on `cur` (loaded one step earlier) while step kt+1 is prefetched into
  // `nxt` (W and scales to registers, A to the other LDS buffer).
  auto run_step = [&](int kt, const StepRegs& cur, StepRegs& nxt) {
    // Everything issued so far belongs to step kt: wait for all of it; then the barrier
    // makes every wave's A(kt) DMA visible and proves every wave is done reading the LDS
    // buffer that the A(kt+1) DMA overwrites (it was read in step kt-1).
    WAIT_VMCNT(0);
    // Fences as in HIP's __syncthreads: they keep the compiler from moving LDS reads across
    // the barrier (s_barrier alone is not a memory operation to LLVM).
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
    const uint8_t* a_tile = lds + (kt & 1) * kBufBytes;
    v4i af[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int s = 0; s < 2; ++s)
        af[mt][s] = *(const __attribute__((address_space(3))) v4i*)(const lds_void*)(a_tile + a_lds_off[mt][s]);
    const bool live = kt + 1 < k_steps;
    nxt = load_step(kt + 1, live);
    dma_step(kt + 1, live);
    WAIT_LGKMCNT0();
    mfma_k_step<0>(acc, cur, af);
    mfma_k_step<1>(acc, cur, af);
    // Keep this step's MFMAs ahead of the next step's wait + barrier (the scheduler may
    // otherwise sink them there, forcing waits on the prefetch).
    __builtin_amdgcn_sched_barrier(0);
  };

  // Two register sets used alternately (a copy nxt -> cur would make the compiler wait for
  // the prefetch before this step's MFMAs).
  StepRegs regs0 = load_step(0, true), regs1;
  dma_step(0, true);
  int kt = 0;
  for (; kt + 2 <= k_steps; kt += 2) {
    run_step(kt, regs0, regs1);
    run_step(kt + 1, regs1, regs0);
  }
  if (kt < k_steps) run_step(kt, regs0, regs1);

  // Epilog: lane holds D^T[n = 4g + i][m = r16] for i < 4, i.e. out[token, 4 consecutive
  // columns]. Scale by the top-k weight in f32, round to bf16 (RNE); two packed atomics into
  // the token's row, or (ROUTE_ROWS) one store into the route's row.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    if (rows[mt].arow < 0) continue;
    const float topk_w = sorted_weights[rows[mt].safe];
    const uint32_t out_row = ROUTE_ROWS ? (uint32_t)rows[mt].arow : (uint32_t)rows[mt].token;
    __bf16* const orow = out + (uint64_t)out_row * (uint32_t)n + n_wave + 4 * g;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const v4f v = acc[nt][mt] * topk_w;
      if constexpr (ROUTE_ROWS) {
        const bf16x4 pk = {(__bf16)v[0], (__bf16)v[1], (__bf16)v[2], (__bf16)v[3]};
        *(__attribute__((address_space(1))) bf16x4*)(orow + nt * 16) = pk;
      } else {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const bf16x2 pk = {(__bf16)v[2 * p], (__bf16)v[2 * p + 1]};
          __builtin_amdgcn_global_atomic_fadd_v2bf16(
              (__attribute__((address_space(1))) bf16x2*)(orow + nt * 16 + 2 * p), pk);
        }
      }
    }
  }
#endif
}
