// Small-M (decode-regime) MXFP8 GEMM family for gfx950.
//
//   out[m, n] = bf16( sum_kb 2^(SA[m,kb]-127) * 2^(SB[n,kb]-127) * sum_{k in kb} A[m,k] * B[n,k] )
//
// A [M, K] and B [N, K] are float8 e4m3 (K contiguous), SA [M, K/32] and SB [N, K/32] are e8m0
// bytes (OCP MX, one scale per 32 consecutive K). Three kernels, each emitted only when its
// defining variant parameter is set, so one build compiles one kernel:
//   N_SUB    -> smallm_mxfp8_gemv             M in 1..16, packed FMA, scales applied in registers
//   SPLIT_K  -> smallm_mxfp8_mfma             M in 1..64, v_mfma_scale_f32_16x16x128_f8f6f4
//   BLOCK_N  -> smallm_mxfp8_moe_grouped_gemm sorted-token MoE, the GEMV core per expert
// All workgroups are 256 threads (4 wave64s). Every tensor is addressed through one raw buffer
// resource (32-bit offsets: the host guarantees each is < 2^31 bytes; MoE weights are rebased
// per expert, so the rule applies to one expert's [N, K] slice).
//
// Rows/columns past M or N are clamped to the last valid one for loading and never stored, so
// the kernels do not depend on out-of-range buffer reads returning zero.
#include "mxgemm/mfma.h"

using namespace mxgemm;

// Promise 256-thread workgroups so the compiler may use up to 512 VGPRs instead of the 128 it
// must assume for the default 1024-thread maximum (the large GEMV tiles would spill).
#define SMALLM_WG256 __attribute__((amdgpu_flat_work_group_size(256, 256)))

#if defined(__gfx950__)
namespace {

constexpr uint32_t kThreads = 256;  // every launch uses 256-thread workgroups (kernel attribute)
constexpr uint32_t kMxBlock = 32;   // K elements per e8m0 scale

typedef float f32x2 __attribute__((ext_vector_type(2)));

MXGEMM_DEVICE uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

// 32 e4m3 values of one MX block as 16 float pairs (exact: every e4m3 value is an f32).
struct Block32 {
  f32x2 v[16];
};

// One MX block as loaded: 32 e4m3 bytes (two 128-bit loads) and its e8m0 scale. Kept raw until
// it is used, so a block in flight costs 9 VGPRs instead of the 32 of its decoded form.
struct RawBlock {
  u32x4 q[2];
  uint32_t s;
};

MXGEMM_DEVICE RawBlock load_block(buffer_rsrc r, buffer_rsrc rs, uint32_t row, uint32_t K, uint32_t kb) {
  const uint32_t off = row * K + kb * kMxBlock;
  return {{load_b128(r, off), load_b128(r, off + 16u)}, load_u8(rs, row * (K / kMxBlock) + kb)};
}

// The fp8 payloads of one block share one scale, so a lane always owns whole blocks.
MXGEMM_DEVICE Block32 decode(const RawBlock& raw) {
  Block32 b;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      b.v[8 * h + 2 * w] = __builtin_amdgcn_cvt_pk_f32_fp8((int)raw.q[h][w], false);
      b.v[8 * h + 2 * w + 1] = __builtin_amdgcn_cvt_pk_f32_fp8((int)raw.q[h][w], true);
    }
  return b;
}

// Unscaled block dot product with packed FMA (v_pk_fma_f32): e4m3 x e4m3 products are exact in
// f32, so the only roundings are the 31 additions (two interleaved chains, then one add).
MXGEMM_DEVICE float block_dot(const Block32& a, const Block32& b) {
  f32x2 acc = a.v[0] * b.v[0];
#pragma unroll
  for (int i = 1; i < 16; ++i) acc = __builtin_elementwise_fma(a.v[i], b.v[i], acc);
  return acc.x + acc.y;
}

// s * 2^(sa-127) * 2^(sb-127) as ONE ldexp, so the product of two extreme scales (down to
// 2^-254) rounds once instead of flushing; an e8m0 0xFF on either side is NaN (OCP MX).
MXGEMM_DEVICE float apply_scales(float s, uint32_t sa, uint32_t sb) {
  const float v = __builtin_ldexpf(s, (int)(sa + sb) - 254);
  return (sa == 0xFFu || sb == 0xFFu) ? __builtin_nanf("") : v;
}

// GEMV core shared by the dense GEMV and the MoE kernel. The calling lane owns K blocks
// klane, klane + k_lanes, ... of MT rows of A and NS rows of B and accumulates their scaled
// block products into acc[m][j] in that order. Row arguments are row indices (already clamped
// in range). With few rows (MT + NS <= 3) the next step's blocks are requested before this
// step's are used, so one step of loads stays in flight instead of the loop waiting a full
// memory latency per step (the last step requests its own blocks again, a cache hit never
// used, rather than branch); with more rows the second set of raw blocks would cost occupancy.
template <uint32_t MT, uint32_t NS>
MXGEMM_DEVICE void gemv_accumulate(float (&acc)[MT][NS], buffer_rsrc a, buffer_rsrc a_scale,
                                   const uint32_t (&a_row)[MT], buffer_rsrc b, buffer_rsrc b_scale,
                                   const uint32_t (&b_row)[NS], uint32_t K, uint32_t klane,
                                   uint32_t k_lanes) {
  constexpr bool kAhead = MT + NS <= 3;
  const uint32_t k_blocks = K / kMxBlock, last = k_blocks - 1u;
  RawBlock aq[MT], bq[NS];  // this step's blocks (with kAhead: loaded during the previous step)
  if constexpr (kAhead) {
#pragma unroll
    for (uint32_t j = 0; j < NS; ++j) bq[j] = load_block(b, b_scale, b_row[j], K, min_u32(klane, last));
#pragma unroll
    for (uint32_t m = 0; m < MT; ++m) aq[m] = load_block(a, a_scale, a_row[m], K, min_u32(klane, last));
  }
  for (uint32_t kb = klane; kb < k_blocks; kb += k_lanes) {
    const uint32_t next = min_u32(kb + k_lanes, last);
    RawBlock an[MT], bn[NS];
    if constexpr (kAhead) {
#pragma unroll
      for (uint32_t j = 0; j < NS; ++j) bn[j] = load_block(b, b_scale, b_row[j], K, next);
#pragma unroll
      for (uint32_t m = 0; m < MT; ++m) an[m] = load_block(a, a_scale, a_row[m], K, next);
    } else {
#pragma unroll
      for (uint32_t j = 0; j < NS; ++j) bq[j] = load_block(b, b_scale, b_row[j], K, kb);
    }
    Block32 bd[NS];
#pragma unroll
    for (uint32_t j = 0; j < NS; ++j) bd[j] = decode(bq[j]);
#pragma unroll
    for (uint32_t m = 0; m < MT; ++m) {
      const RawBlock am = kAhead ? aq[m] : load_block(a, a_scale, a_row[m], K, kb);
      const Block32 ad = decode(am);
#pragma unroll
      for (uint32_t j = 0; j < NS; ++j) acc[m][j] += apply_scales(block_dot(ad, bd[j]), am.s, bq[j].s);
    }
    if constexpr (kAhead) {
#pragma unroll
      for (uint32_t j = 0; j < NS; ++j) bq[j] = bn[j];
#pragma unroll
      for (uint32_t m = 0; m < MT; ++m) aq[m] = an[m];
    }
  }
}

// Sum V partial values over the k_lanes consecutive lanes of each lane group, through LDS.
// red must hold kThreads * V floats. Writes, barriers, and returns nothing: afterwards the sum
// of value v of group g is red_sum(red, (g * V + v), k_lanes), read in a fixed lane order so the
// result does not depend on scheduling.
template <uint32_t V>
MXGEMM_DEVICE void lds_partials_store(float* red, const float (&vals)[V], uint32_t t,
                                      uint32_t k_lanes) {
  const uint32_t grp = t / k_lanes, klane = t % k_lanes;
#pragma unroll
  for (uint32_t v = 0; v < V; ++v) red[(grp * V + v) * k_lanes + klane] = vals[v];
  syncthreads();
}

MXGEMM_DEVICE float red_sum(const float* red, uint32_t slot, uint32_t k_lanes) {
  float s = 0.0f;
  for (uint32_t i = 0; i < k_lanes; ++i) s += red[slot * k_lanes + i];
  return s;
}

MXGEMM_DEVICE __bf16 to_bf16(float x) { return (__bf16)x; }  // RNE: v_cvt_pk_bf16_f32

// One row's e4m3 operand of a scaled 16x16x128 MFMA step at K offset k0 (the lane's two 16-byte
// pieces, mfma.h's layout).
MXGEMM_DEVICE i32x8 load_mfma_row(buffer_rsrc r, uint32_t row, uint32_t K, uint32_t k0, uint32_t lane) {
  return mfma_fp8_operand(load_b128(r, row * K + k0 + mfma_fp8_k_offset(lane, 0)),
                          load_b128(r, row * K + k0 + mfma_fp8_k_offset(lane, 1)));
}

// mma(load_step(s)) for s = first, first + stride, ... below steps, each step's operands loaded
// one step ahead: the next step's loads are in flight during this step's MFMAs instead of each
// step waiting a memory latency. Two steps an iteration alternate two register sets (copying a
// prefetched set would wait for its loads); sched barriers keep each step's loads ahead of the
// MFMAs before them. Past the last step the clamped index requests the last one again, a cache
// hit never used, rather than branch.
template <typename LoadStep, typename Mma>
MXGEMM_DEVICE void pipelined_steps(uint32_t first, uint32_t stride, uint32_t steps, LoadStep load_step, Mma mma) {
  const uint32_t last = steps - 1u;
  auto even = load_step(min_u32(first, last));
  uint32_t step = first;
  for (; step + stride < steps; step += 2u * stride) {
    const auto odd = load_step(step + stride);
    __builtin_amdgcn_sched_barrier(0);
    mma(even);
    even = load_step(min_u32(step + 2u * stride, last));
    __builtin_amdgcn_sched_barrier(0);
    mma(odd);
  }
  if (step < steps) mma(even);
}

}  // namespace
#endif  // __gfx950__

// ---------------------------------------------------------------------------------------------
// smallm_mxfp8_gemv: M_TILE rows of A x (256 / K_LANES lane groups x N_SUB) rows of B per
// workgroup. K_LANES lanes (16 unless the variant sets it) share one group of N_SUB B rows and
// split its K blocks; their partial sums are combined through LDS. More lanes per row means
// fewer rows per workgroup and more workgroups: narrow layers at M = 1 fill the chip.
// Grid: (ceil(N / (256 / K_LANES * N_SUB)), ceil(M / M_TILE)).
// ---------------------------------------------------------------------------------------------
#if defined(N_SUB)
#if !defined(K_LANES)
#define K_LANES 16
#endif
SMALLM_WG256 MXGEMM_KERNEL(smallm_mxfp8_gemv)(const uint8_t* __restrict__ a, const uint8_t* __restrict__ a_scale,
                                 const uint8_t* __restrict__ b, const uint8_t* __restrict__ b_scale,
                                 __bf16* __restrict__ out, int M, int N, int K) {
#if defined(__gfx950__)
  constexpr uint32_t MT = M_TILE, NS = N_SUB, KL = K_LANES, BLOCK_N = kThreads / KL * NS;
  __shared__ float red[kThreads * MT * NS];
  const uint32_t t = thread_x(), um = M, un = N, uk = K;
  const uint32_t n0 = block_x() * BLOCK_N, m0 = block_y() * MT;
  const buffer_rsrc ra = make_buffer(a, um * uk), rsa = make_buffer(a_scale, um * (uk / kMxBlock));
  const buffer_rsrc rb = make_buffer(b, un * uk), rsb = make_buffer(b_scale, un * (uk / kMxBlock));
  uint32_t a_row[MT], b_row[NS];
#pragma unroll
  for (uint32_t m = 0; m < MT; ++m) a_row[m] = min_u32(m0 + m, um - 1u);
#pragma unroll
  for (uint32_t j = 0; j < NS; ++j) b_row[j] = min_u32(n0 + (t / KL) * NS + j, un - 1u);
  float acc[MT][NS] = {};
  gemv_accumulate<MT, NS>(acc, ra, rsa, a_row, rb, rsb, b_row, uk, t % KL, KL);
  lds_partials_store<MT * NS>(red, reinterpret_cast<const float(&)[MT * NS]>(acc), t, KL);
  // Output slot o = (group * MT + m) * NS + j  ->  (m, n0 + group * NS + j).
  for (uint32_t o = t; o < BLOCK_N * MT; o += kThreads) {
    const uint32_t j = o % NS, m = (o / NS) % MT, n = n0 + (o / (NS * MT)) * NS + j;
    if (m0 + m < um && n < un) out[(m0 + m) * un + n] = to_bf16(red_sum(red, o, KL));
  }
#endif
}
#endif  // N_SUB

// ---------------------------------------------------------------------------------------------
// smallm_mxfp8_mfma: each wave computes M_TILE x 16 outputs with M_TILE/16 scaled MFMAs per
// 128-wide K step, sharing one B operand. The 4 waves are SPLIT_K slices of K x (4 / SPLIT_K)
// column tiles; K slices are summed through LDS in slice order. Requires K % 128 == 0.
// Grid: (ceil(N / (16 * 4 / SPLIT_K)), ceil(M / M_TILE)).
// ---------------------------------------------------------------------------------------------
#if defined(SPLIT_K)
SMALLM_WG256 MXGEMM_KERNEL(smallm_mxfp8_mfma)(const uint8_t* __restrict__ a, const uint8_t* __restrict__ a_scale,
                                 const uint8_t* __restrict__ b, const uint8_t* __restrict__ b_scale,
                                 __bf16* __restrict__ out, int M, int N, int K) {
#if defined(__gfx950__)
  constexpr uint32_t MI = M_TILE / kMfmaRows, WAVES_N = 4 / SPLIT_K, BLOCK_N = kMfmaRows * WAVES_N;
  const uint32_t t = thread_x(), lane = t % 64u, wave = t / 64u;
  const uint32_t wn = wave % WAVES_N, ks = wave / WAVES_N;
  const uint32_t um = M, un = N, uk = K, k_blocks = uk / kMxBlock;
  const uint32_t n_tile = block_x() * BLOCK_N + wn * kMfmaRows, m0 = block_y() * M_TILE;
  const buffer_rsrc ra = make_buffer(a, um * uk), rsa = make_buffer(a_scale, um * k_blocks);
  const buffer_rsrc rb = make_buffer(b, un * uk), rsb = make_buffer(b_scale, un * k_blocks);
  const uint32_t r = lane % kMfmaRows, kb_lane = mfma_scale_block(lane);
  const uint32_t b_row = min_u32(n_tile + r, un - 1u);
  uint32_t a_row[MI];
#pragma unroll
  for (uint32_t mi = 0; mi < MI; ++mi) a_row[mi] = min_u32(m0 + mi * kMfmaRows + r, um - 1u);

  struct Step {  // one K step's operands
    i32x8 b, a[MI];
    uint32_t sb, sa[MI];
  };
  f32x4 acc[MI];
#pragma unroll
  for (uint32_t mi = 0; mi < MI; ++mi) acc[mi] = f32x4{0.f, 0.f, 0.f, 0.f};
  const auto load_step = [&](uint32_t step) {
    const uint32_t k0 = step * kMfmaK, kb = k0 / kMxBlock + kb_lane;
    Step s;
    s.b = load_mfma_row(rb, b_row, uk, k0, lane);
    s.sb = load_u8(rsb, b_row * k_blocks + kb);
#pragma unroll
    for (uint32_t mi = 0; mi < MI; ++mi) {
      s.a[mi] = load_mfma_row(ra, a_row[mi], uk, k0, lane);
      s.sa[mi] = load_u8(rsa, a_row[mi] * k_blocks + kb);
    }
    return s;
  };

  const auto mma = [&](const Step& s) {
#pragma unroll
    for (uint32_t mi = 0; mi < MI; ++mi)
      acc[mi] = mfma_scale_16x16x128_e4m3(s.a[mi], s.b, acc[mi], s.sa[mi], s.sb);
  };
  pipelined_steps(ks, SPLIT_K, uk / kMfmaK, load_step, mma);
#if SPLIT_K > 1
  __shared__ f32x4 red[(SPLIT_K - 1) * WAVES_N * MI * 64];
  if (ks > 0) {
#pragma unroll
    for (uint32_t mi = 0; mi < MI; ++mi) red[(((ks - 1) * WAVES_N + wn) * MI + mi) * 64 + lane] = acc[mi];
  }
  syncthreads();
  if (ks > 0) return;
  for (uint32_t s = 0; s + 1 < SPLIT_K; ++s)
#pragma unroll
    for (uint32_t mi = 0; mi < MI; ++mi) acc[mi] += red[((s * WAVES_N + wn) * MI + mi) * 64 + lane];
#endif
  const uint32_t n = n_tile + r;
#pragma unroll
  for (uint32_t mi = 0; mi < MI; ++mi)
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t m = m0 + mi * kMfmaRows + 4u * (lane / 16u) + i;  // D layout: see mfma.h
      if (m < um && n < un) out[m * un + n] = to_bf16(acc[mi][i]);
    }
#endif
}
#endif  // SPLIT_K

// ---------------------------------------------------------------------------------------------
// smallm_mxfp8_moe_grouped_gemm: sorted-token MoE GEMM (aiter / mxgemm.routing layout).
//   sorted_token_ids[p] = (slot << 24) | token, expert runs padded to block_m rows with token T;
//   sorted_expert_ids[blk] = expert of rows [blk * block_m, +block_m) (-1: none);
//   num_valid_ids[0] = number of sorted rows in use (padding included).
// For each route p < num_valid_ids[0] (token < T, in a block with an expert), in route order:
//   out[token * topk + slot, n] = (topk_weights[token, slot] if flags & 1)
//                                 * sum_k A[a_row, k] W[expert, n, k]
//   (MX scales as above), a_row = token * topk + slot if flags & 2 (one A row per (token, slot)),
//   else token. Padding rows and rows p >= num_valid_ids[0] write nothing.
// A workgroup owns BLOCK_N weight rows of one sorted block; sorted rows are taken M_CHUNK at a
// time and all-padding chunks are skipped (a uniform branch), so padding costs only its ids.
// M_CHUNK 2 / 4: 256 / BLOCK_N lanes split K per weight row (the GEMV core). M_CHUNK 16
// (BLOCK_N 64, K % 128 == 0): the chunk is one scaled MFMA tile, each wave 16 of the columns.
// Grid: (ceil(N / BLOCK_N), grid_blocks): workgroup row y takes sorted blocks y, y + grid_blocks,
// ... below num_valid_ids[0], so the host may launch fewer rows than the worst-case buffer has
// blocks (decode: a few live blocks in a buffer of E * block_m rows) and every live block is still
// covered. flags bit 2: fp32 output (else bf16).
// ---------------------------------------------------------------------------------------------
#if defined(BLOCK_N)
#if defined(__gfx950__)
namespace {
// One M_CHUNK of 16 sorted rows x the workgroup's 64 columns on scaled MFMAs: wave w owns columns
// n0 + 16 w .. + 15, lane r = lane % 16 gathers A row r of the chunk (its sorted id by lane
// exchange), K runs in 128-wide steps loaded a step ahead; each route's row is stored at its route.
MXGEMM_DEVICE void moe_mfma_chunk(void* out, buffer_rsrc ra, buffer_rsrc rsa, buffer_rsrc rw,
                                  buffer_rsrc rsw, const float* topk_weights, uint32_t my_id, uint32_t seg,
                                  uint32_t r0, uint32_t rows_end, uint32_t n0, uint32_t un, uint32_t uk,
                                  uint32_t ut, uint32_t utopk, bool per_slot, int flags) {
  const uint32_t t = thread_x(), lane = t % 64u, r = lane % kMfmaRows, k_blocks = uk / kMxBlock;
  const uint32_t n = n0 + (t / 64u) * kMfmaRows + r, w_row = min_u32(n, un - 1u);
  f32x4 acc = f32x4{0.f, 0.f, 0.f, 0.f};
  const uint32_t id = (uint32_t)__builtin_amdgcn_ds_bpermute((int)(4u * (r0 - seg + r)), (int)my_id);
  const uint32_t token = id & 0xFFFFFFu;
  const uint32_t a_row = token < ut ? (per_slot ? token * utopk + (id >> 24) : token) : 0u;
  const uint32_t kb_lane = mfma_scale_block(lane);
  struct Step {  // one K step's operands
    i32x8 w, a;
    uint32_t sw, sa;
  };
  const auto load_step = [&](uint32_t step) {
    const uint32_t k0 = step * kMfmaK, kb = k0 / kMxBlock + kb_lane;
    return Step{load_mfma_row(rw, w_row, uk, k0, lane), load_mfma_row(ra, a_row, uk, k0, lane),
                load_u8(rsw, w_row * k_blocks + kb), load_u8(rsa, a_row * k_blocks + kb)};
  };
  pipelined_steps(0u, 1u, uk / kMfmaK, load_step,
                  [&](const Step& s) { acc = mfma_scale_16x16x128_e4m3(s.a, s.w, acc, s.sa, s.sw); });
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
    const uint32_t row = r0 + 4u * (lane / 16u) + i;  // D layout: see mfma.h
    const uint32_t id = (uint32_t)__builtin_amdgcn_ds_bpermute((int)(4u * (row - seg)), (int)my_id);
    const uint32_t token = id & 0xFFFFFFu, route = token * utopk + (id >> 24);
    if (row < rows_end && n < un && token < ut) {
      const float v = (flags & 1) ? acc[i] * topk_weights[route] : acc[i];
      if (flags & 4) static_cast<float*>(out)[route * un + n] = v;
      else static_cast<__bf16*>(out)[route * un + n] = to_bf16(v);
    }
  }
}
}  // namespace
#endif  // __gfx950__
SMALLM_WG256 MXGEMM_KERNEL(smallm_mxfp8_moe_grouped_gemm)(
    const uint8_t* __restrict__ a, const uint8_t* __restrict__ a_scale,
    const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scale,
    const int32_t* __restrict__ sorted_token_ids, const int32_t* __restrict__ sorted_expert_ids,
    const int32_t* __restrict__ num_valid_ids, const float* __restrict__ topk_weights,
    void* __restrict__ out, int T, int topk, int N, int K, int a_rows, int block_m, int flags,
    int grid_blocks) {
#if defined(__gfx950__)
  constexpr uint32_t KL = kThreads / BLOCK_N, MC = M_CHUNK;
  static_assert(MC != kMfmaRows || BLOCK_N == 4 * kMfmaRows, "the MFMA chunk is 4 waves x 16 columns");
  __shared__ float red[MC == kMfmaRows ? 1 : kThreads * MC];  // the GEMV core's K-lane partials
  const uint32_t t = thread_x(), un = N, uk = K, k_blocks = uk / kMxBlock;
  const uint32_t n_valid = (uint32_t)num_valid_ids[0], bm = block_m;
  const buffer_rsrc ra = make_buffer(a, (uint32_t)a_rows * uk);
  const buffer_rsrc rsa = make_buffer(a_scale, (uint32_t)a_rows * k_blocks);
  const uint32_t n0 = block_x() * BLOCK_N;
  const uint32_t w_row[1] = {min_u32(n0 + t / KL, un - 1u)};
  const bool per_slot = flags & 2;
  const uint32_t lane = t % 64u;
  for (uint32_t blk = block_y(); blk * bm < n_valid; blk += (uint32_t)grid_blocks) {
    const uint32_t row0 = blk * bm;
    const int32_t expert = sorted_expert_ids[blk];
    const uint32_t e = expert < 0 ? 0u : (uint32_t)expert;
    // No expert: every row of the block is padding (T is the "no token" id).
    const uint32_t ut = expert < 0 ? 0u : (uint32_t)T, utopk = topk;
    const uint32_t rows_end = min_u32(row0 + bm, n_valid);
    const buffer_rsrc rw = make_buffer(w + (uint64_t)e * un * uk, un * uk);
    const buffer_rsrc rsw = make_buffer(w_scale + (uint64_t)e * un * k_blocks, un * k_blocks);
    // The block's sorted ids, 64 rows at a time, one per lane of every wave: the chunks below
    // take theirs by lane exchange, so a chunk (padding or not) waits on no memory for its ids.
    for (uint32_t seg = row0; seg < rows_end; seg += 64u) {
      const uint32_t seg_rows = min_u32(rows_end - seg, 64u);
      const uint32_t my_id = lane < seg_rows ? (uint32_t)sorted_token_ids[seg + lane] : 0xFFFFFFu;
      const uint64_t live = __builtin_amdgcn_ballot_w64((my_id & 0xFFFFFFu) < ut);
      for (uint32_t r0 = seg; r0 < seg + seg_rows; r0 += MC) {
        const bool any = (live >> (r0 - seg)) & ((1u << MC) - 1u);
        if (!any) continue;
        if constexpr (MC == kMfmaRows) {
          moe_mfma_chunk(out, ra, rsa, rw, rsw, topk_weights, my_id, seg, r0, rows_end, n0, un, uk, ut, utopk,
                         per_slot, flags);
        } else {
          uint32_t a_row[MC];
#pragma unroll
          for (uint32_t i = 0; i < MC; ++i) {  // uniform: read from one lane
            const uint32_t id = (uint32_t)__builtin_amdgcn_readlane((int)my_id, (int)(r0 - seg + i));
            const uint32_t token = id & 0xFFFFFFu, slot = id >> 24;
            a_row[i] = token < ut ? (per_slot ? token * utopk + slot : token) : 0u;
          }
          float acc[MC][1] = {};
          gemv_accumulate<MC, 1>(acc, ra, rsa, a_row, rw, rsw, w_row, uk, t % KL, KL);
          lds_partials_store<MC>(red, reinterpret_cast<const float(&)[MC]>(acc), t, KL);
          // slot o = group * MC + i  ->  (sorted row r0 + i, n0 + group); every lane takes part in
          // the exchange, and only the slot's lanes of a route store, at the route's row.
          const uint32_t i = t % MC, n = n0 + t / MC, r = r0 + i;
          const uint32_t id = (uint32_t)__builtin_amdgcn_ds_bpermute((int)(4u * (r - seg)), (int)my_id);
          const uint32_t token = id & 0xFFFFFFu, route = token * utopk + (id >> 24);
          if (t < BLOCK_N * MC && r < rows_end && n < un && token < ut) {
            float v = red_sum(red, t, KL);
            if (flags & 1) v *= topk_weights[route];
            if (flags & 4) static_cast<float*>(out)[route * un + n] = v;
            else static_cast<__bf16*>(out)[route * un + n] = to_bf16(v);
          }
          syncthreads();  // red is rewritten by the next chunk (of this block or the next)
        }
      }
    }
  }
#endif
}
#endif  // BLOCK_N
