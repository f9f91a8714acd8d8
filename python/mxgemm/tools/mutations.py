"""The mutation catalogue: seeded bugs the kernel tests must catch.

Each mutation is data: exact snippets of repo files (each must occur exactly once) and their
replacements, plus the registry kernels it targets (their tests are run). When a refactor
moves a snippet, re-point the entry; a snippet that no longer matches is a harness error,
never a silent skip. Emulator mutations target every kernel: a kernel test, not only the
emulator's own tests, must notice them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..specs import SPECS

SMALLM_SRC = "csrc/kernels/smallm_mxfp8.hip"
A4W4_HIP = "csrc/kernels/moe_gemm2_a4w4.hip"
A4W4_FLY = "flydsl_kernels/moe_gemm2_a4w4.py"
DEQUANT_HIP = "csrc/kernels/mxfp8_dequant.hip"
DEQUANT_FLY = "flydsl_kernels/mxfp8_dequant.py"
BLOCKSCALE = "flydsl_kernels/blockscale_grouped_gemm.py"
TRAIN_GROUPED = "flydsl_kernels/train_grouped_gemm.py"
MX_GEMM = "flydsl_kernels/mx_gemm.py"
IR_BUILDER = "flydsl_kernels/ir_builder.py"
VALU = "python/mxgemm/emu/valu.py"
ATOMICS = "python/mxgemm/emu/float_atomics.py"
EMU_LAUNCH = "python/mxgemm/emu/launch.py"

GEMV, MFMA, MOE = "smallm_mxfp8_gemv", "smallm_mxfp8_mfma", "smallm_mxfp8_moe_grouped_gemm"
A4W4 = ("moe_gemm2_a4w4", "moe_gemm2_a4w4_flydsl")
ALL = ("every kernel",)

# Kernel -> its kernel tests (the harness runs the union for a mutation, in this order): the op specs'.
KERNEL_TESTS = {k: s.tests for s in SPECS for k in s.kernels}

_TRUNC_BF16 = "__builtin_bit_cast(__bf16, (unsigned short)(__builtin_bit_cast(unsigned int, {x}) >> 16))"
_A4W4_HIP_TRUNCATE = (A4W4_HIP, "const bf16x2 pk = {(__bf16)v[2 * p], (__bf16)v[2 * p + 1]};",
                      "const bf16x2 pk = {" + _TRUNC_BF16.format(x="v[2 * p]") + ", "
                      + _TRUNC_BF16.format(x="v[2 * p + 1]") + "};")


@dataclass(frozen=True)
class Mutation:
    name: str
    kernels: tuple          # registry names, or ALL
    edits: tuple            # ((repo-relative file, exact original, replacement), ...)
    what: str

    def tests(self) -> list:
        kernels = KERNEL_TESTS if self.kernels == ALL else self.kernels
        return list(dict.fromkeys(t for k in kernels for t in KERNEL_TESTS[k]))


CATALOGUE = (
    # ---- small-M MXFP8 (HIP)
    Mutation("smallm-bf16-truncate", (GEMV, MFMA, MOE), (
        (SMALLM_SRC, "__bf16 to_bf16(float x) { return (__bf16)x; }",
         "__bf16 to_bf16(float x) { return " + _TRUNC_BF16.format(x="x") + "; }"),),
        "bf16 output conversion truncates instead of RNE"),
    Mutation("smallm-gemv-drop-b-scale", (GEMV, MOE), (
        (SMALLM_SRC, "__builtin_ldexpf(s, (int)(sa + sb) - 254)", "__builtin_ldexpf(s, (int)(sa + 127u) - 254)"),),
        "GEMV core ignores the weight's e8m0 scale"),
    Mutation("smallm-mfma-drop-b-scale", (MFMA,), (
        (SMALLM_SRC, "mfma_scale_16x16x128_e4m3(s.a[mi], s.b, acc[mi], s.sa[mi], s.sb);",
         "mfma_scale_16x16x128_e4m3(s.a[mi], s.b, acc[mi], s.sa[mi], 127u);"),),
        "scaled MFMA gets scale 1.0 for B"),
    Mutation("smallm-mfma-swap-operands", (MFMA,), (
        (SMALLM_SRC, "mfma_scale_16x16x128_e4m3(s.a[mi], s.b, acc[mi], s.sa[mi], s.sb)",
         "mfma_scale_16x16x128_e4m3(s.b, s.a[mi], acc[mi], s.sb, s.sa[mi])"),),
        "A and B (with their scales) swapped: the transposed tile"),
    Mutation("smallm-mfma-drop-last-odd-step", (MFMA, MOE), (
        (SMALLM_SRC, "  if (step < steps) mma(even);", ""),),
        "MFMA K loops (dense, MoE chunk) skip a wave's last K step when it has an odd number"),
    Mutation("smallm-mfma-prefetch-same-step", (MFMA, MOE), (
        (SMALLM_SRC, "const auto odd = load_step(step + stride);", "const auto odd = load_step(step);"),),
        "MFMA K loops' prefetch loads the current K step again instead of the next"),
    Mutation("smallm-gemv-row-off-by-one", (GEMV,), (
        (SMALLM_SRC, "a_row[m] = min_u32(m0 + m, um - 1u);", "a_row[m] = min_u32(m0 + m + 1u, um - 1u);"),),
        "GEMV reads the next A row"),
    Mutation("smallm-moe-drop-topk-weight", (MOE,), (
        (SMALLM_SRC, "if (flags & 1) v *= topk_weights[route];", "(void)topk_weights;"),),
        "MoE grouped GEMM ignores the top-k weight"),
    Mutation("smallm-moe-mfma-drop-topk-weight", (MOE,), (
        (SMALLM_SRC, "(flags & 1) ? acc[i] * topk_weights[route] : acc[i]", "acc[i]"),),
        "MoE MFMA chunk ignores the top-k weight"),
    Mutation("smallm-moe-mfma-a-row-of-lane-0", (MOE,), (
        (SMALLM_SRC, "ds_bpermute((int)(4u * (r0 - seg + r)), (int)my_id)",
         "ds_bpermute((int)(4u * (r0 - seg)), (int)my_id)"),),
        "MoE MFMA chunk multiplies the chunk's first row into all 16"),
    Mutation("smallm-gemv-prefetch-next-a", (GEMV, MOE), (
        (SMALLM_SRC, "const RawBlock am = kAhead ? aq[m] :", "const RawBlock am = kAhead ? an[m] :"),),
        "GEMV core multiplies the next step's A block (the one in flight) with this step's B"),
    Mutation("smallm-moe-no-block-stride", (MOE,), (
        (SMALLM_SRC, "blk += (uint32_t)grid_blocks) {", "blk = n_valid) {"),),
        "MoE workgroup row computes only its first sorted block"),
    Mutation("smallm-moe-ids-first-segment-only", (MOE,), (
        (SMALLM_SRC, "(uint32_t)sorted_token_ids[seg + lane]", "(uint32_t)sorted_token_ids[row0 + lane]"),),
        "MoE blocks of more than 64 rows reuse their first 64 rows' ids"),
    Mutation("smallm-moe-store-id-of-chunk-row-0", (MOE,), (
        (SMALLM_SRC, "ds_bpermute((int)(4u * (r - seg)), (int)my_id)",
         "ds_bpermute((int)(4u * (r0 - seg)), (int)my_id)"),),
        "MoE epilogue stores every row of a chunk at (and weighted as) the chunk's first row's route"),
    Mutation("smallm-moe-store-at-sorted-row", (MOE,), (
        (SMALLM_SRC, "static_cast<__bf16*>(out)[route * un + n] = to_bf16(v);\n          }",
         "static_cast<__bf16*>(out)[r * un + n] = to_bf16(v);\n          }"),),
        "MoE GEMV core stores bf16 rows at their sorted position instead of their route"),
    Mutation("smallm-moe-mfma-store-at-sorted-row", (MOE,), (
        (SMALLM_SRC, "static_cast<float*>(out)[route * un + n] = v;\n      else",
         "static_cast<float*>(out)[row * un + n] = v;\n      else"),),
        "MoE MFMA chunk stores fp32 rows at their sorted position instead of their route"),
    Mutation("smallm-moe-padding-rows-store", (MOE,), (
        (SMALLM_SRC, "r < rows_end && n < un && token < ut) {", "r < rows_end && n < un) {"),),
        "MoE GEMV core stores padding rows too (at token T's route, past out)"),
    Mutation("smallm-delete-lds-barrier", (GEMV, MOE), (
        (SMALLM_SRC, "red[(grp * V + v) * k_lanes + klane] = vals[v];\n  syncthreads();",
         "red[(grp * V + v) * k_lanes + klane] = vals[v];"),),
        "partial sums read from LDS without the barrier after their writes"),
    # ---- a4w4 MoE gemm2 (HIP and FlyDSL)
    Mutation("a4w4-hip-bf16-truncate", ("moe_gemm2_a4w4",), (_A4W4_HIP_TRUNCATE,),
        "HIP epilog truncates to bf16 (FlyDSL still RNE)"),
    Mutation("a4w4-both-bf16-truncate", A4W4, (
        _A4W4_HIP_TRUNCATE,
        (A4W4_FLY, "pk = arith.truncf(b.v2bf16, pair)",
         "v2i32 = ir.VectorType.get([2], b.i32)\n"
         "                    hi = arith.shrui(llvm.bitcast(v2i32, pair), arith.constant(v2i32, "
         "ir.DenseElementsAttr.get_splat(v2i32, ir.IntegerAttr.get(b.i32, 16))))\n"
         "                    pk = llvm.bitcast(b.v2bf16, arith.trunci(ir.VectorType.get([2], "
         "ir.IntegerType.get_signless(16)), hi))")),
        "both backends truncate to bf16: HIP == FlyDSL parity cannot see it"),
    Mutation("a4w4-hip-drop-topk-weight", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "const v4f v = acc[nt][mt] * topk_w;", "const v4f v = acc[nt][mt];"),),
        "epilog ignores the top-k weight"),
    Mutation("a4w4-flydsl-drop-topk-weight", ("moe_gemm2_a4w4_flydsl",), (
        (A4W4_FLY, "v = arith.mulf(acc[ntile][mt], wsplat)", "v = acc[ntile][mt]"),),
        "FlyDSL epilog ignores the top-k weight"),
    Mutation("a4w4-flydsl-prefetched-weight-of-next-row", ("moe_gemm2_a4w4_flydsl",), (
        (A4W4_FLY, "b.gload(b.f32, sorted_weights, b.mul(safe, b.c(4)), 4)",
         "b.gload(b.f32, sorted_weights, b.mul(b.add(safe, b.c(1)), b.c(4)), 4)"),),
        "FlyDSL prologue prefetches the top-k weight of the next sorted row"),
    Mutation("a4w4-hip-drop-a-scale", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "(int)r.as[mt]);", "0x7F7F7F7F);"),),
        "scaled MFMA gets scale 1.0 for the activations"),
    Mutation("a4w4-hip-swap-operands", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "f8f6f4(wa, ab, acc[nt][mt], 4, 4, S, (int)r.ws[nt], S,\n"
                   "                                                                     (int)r.as[mt]);",
         "f8f6f4(ab, wa, acc[nt][mt], 4, 4, S, (int)r.as[mt], S, (int)r.ws[nt]);"),),
        "MFMA operands (and scales) swapped: the transposed tile"),
    Mutation("a4w4-hip-scale-row-off-by-one", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "ws_voff[nt] = nrow * k_scales + 2u * (uint32_t)g;",
         "ws_voff[nt] = (nrow + 1u) * k_scales + 2u * (uint32_t)g;"),),
        "weight scales of the next row"),
    Mutation("a4w4-hip-delete-k-step-barrier", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "    __builtin_amdgcn_s_barrier();\n    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE",
         "    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE"),),
        "A(kt) read from LDS without the barrier that makes every wave's DMA visible"),
    Mutation("a4w4-hip-dma-rounds-one-slot", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "r * kRoundBytes + wave * 1024", "wave * 1024"),),
        "BM 64 / 128: every DMA round of a step lands in round 0's LDS rows"),
    Mutation("a4w4-flydsl-dma-rounds-rows-of-round-0", ("moe_gemm2_a4w4_flydsl",), (
        (A4W4_FLY, "t = b.add(b.c(r * 256), b.add(b.mul(wave, b.c(64)), lane))",
         "t = b.add(b.mul(wave, b.c(64)), lane)"),),
        "BM 64 / 128: every DMA round copies round 0's activation rows"),
    Mutation("a4w4-hip-route-rows-at-token-row", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "ROUTE_ROWS ? (uint32_t)rows[mt].arow : (uint32_t)rows[mt].token",
         "ROUTE_ROWS ? (uint32_t)rows[mt].token : (uint32_t)rows[mt].token"),),
        "a row per route: every route of a token stored into row token, not token * topk + slot"),
    Mutation("a4w4-flydsl-route-rows-n-tiles-swapped", ("moe_gemm2_a4w4_flydsl",), (
        (A4W4_FLY, "b.gep(orow, b.c(2 * ntile * 16, b.i64))", "b.gep(orow, b.c(2 * (ntile ^ 1) * 16, b.i64))"),),
        "a row per route: neighbouring n-tiles stored into each other's columns"),
    Mutation("a4w4-hip-xcd-order-not-a-permutation", ("moe_gemm2_a4w4",), (
        (A4W4_HIP, "return Tile{q / rows, first + q % rows};", "return Tile{q / rows, first};"),),
        "XCD tile order: every tile of a chunk on its first row block (the others never run)"),
    Mutation("a4w4-flydsl-xcd-order-partial-chunk-as-full", ("moe_gemm2_a4w4_flydsl",), (
        (A4W4_FLY, "rows = b.sel(b.cmp(\"slt\", left, b.c(XCDS)), left, b.c(XCDS))", "rows = b.c(XCDS)"),),
        "XCD tile order: the grid's last, partial chunk of row blocks taken as 8 rows"),
    # ---- MXFP8 dequant (HIP and FlyDSL)
    Mutation("dequant-hip-drop-scale", ("mxfp8_dequant",), (
        (DEQUANT_HIP, "v.x = e8m0_apply(decode_e4m3(bits & 0xFFu), e);", "v.x = decode_e4m3(bits & 0xFFu);"),),
        "first element of each quad unscaled"),
    Mutation("dequant-hip-scale-off-by-one", ("mxfp8_dequant",), (
        (DEQUANT_HIP, "scale[quad / 8u]", "scale[(quad + 1u) / 8u]"),),
        "last quad of each block takes the next block's scale"),
    Mutation("dequant-flydsl-drop-scale", ("mxfp8_dequant_flydsl",), (
        (DEQUANT_FLY, "[v, arith.subi(s, c(127))]", "[v, c(0)]"),),
        "FlyDSL dequant ignores the scale"),
    # ---- DeepGEMM-compatible FP8 grouped GEMM (FlyDSL)
    Mutation("deep-gemm-drop-sfb", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "arith.mulf(sa[mt], sb[0])", "sa[mt]"),
        (BLOCKSCALE, "acc[nt][mt], FMT_CODE[t.b_fmt], 0, 0, sb[nt], 0, sa[mt]]",
         "acc[nt][mt], FMT_CODE[t.b_fmt], 0, 0, one, 0, sa[mt]]")),
        "weight scales ignored: fp32 promotion by sfa alone, hardware e8m0 scale 1.0 for B"),
    Mutation("deep-gemm-bf16-truncate", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "packed = llvm.bitcast(v2i32, arith.truncf(out_t, acc[nt][mt]))",
         "v4i16 = ir.VectorType.get([4], ir.IntegerType.get_signless(16))\n"
         "            hi = arith.shrui(llvm.bitcast(B.v4i32, acc[nt][mt]), arith.constant(B.v4i32, "
         "ir.DenseElementsAttr.get_splat(B.v4i32, B.c_attr(16))))\n"
         "            packed = llvm.bitcast(v2i32, arith.trunci(v4i16, hi) if out == \"bf16\" "
         "else arith.truncf(out_t, acc[nt][mt]))"),),
        "bf16 output conversion truncates the fp32 bits instead of RNE"),
    Mutation("deep-gemm-sfa-next-k-block", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "sfa_voff[mt], k_block(kt, sfa_sk4, sfa_sk1)",
         "sfa_voff[mt], k_block(B.add(kt, B.c(1)), sfa_sk4, sfa_sk1)"),),
        "activation scale of the next 128-K block (off by one in the K-block scale index)"),
    Mutation("deep-gemm-sfa-window-next-k-block", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "sfa_voff[mt] + kt * 4, B.c(0)", "sfa_voff[mt] + (kt + 1) * 4, B.c(0)"),),
        "row-major activation scales: each window starts one K block late"),
    Mutation("deep-gemm-sfa-window-first-block", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "llvm.extractelement(w, B.c(at))", "llvm.extractelement(w, B.c(0))"),),
        "row-major activation scales: every step takes the first K block of its lane group's part of the window"),
    Mutation("deep-gemm-sfa-window-own-part", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "t.r16 * 4 + holder * 64", "t.r16 * 4 + t.g * 64"),),
        "row-major activation scales: each lane takes its own lane group's part of the window, not the step's"),
    Mutation("deep-gemm-sfa-window-parts-overlap", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "quarter = t.g * t.window if t.window", "quarter = t.g * 4 if t.window"),),
        "row-major activation scales: the lane groups' parts of a window start one K block apart"),
    Mutation("deep-gemm-sfa-window-unbounded", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "t.rows * t.sfa_st[1] if t.window", "B.c(INVALID_OFFSET - 1) if t.window"),),
        "row-major activation scales: the last window reads past the tensor's end"),
    Mutation("deep-gemm-sfa-window-wait-counts-every-step", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "sfa_loads = t.m_tiles if window_at(slot + 1) == 0 else 0", "sfa_loads = t.m_tiles"),),
        "sfa windows, loads two steps ahead: a barrier counts window loads the step before did not issue"),
    Mutation("deep-gemm-sfb-per-block-only", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "(c >> sfb_shift) * sfb_sn", "(c >> 7) * sfb_sn"),),
        "UE8M0 weight scales always read per 128 rows of b: per-row (packed recipe) scales ignored"),
    Mutation("deep-gemm-partial-k-block-unmasked", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, 'return [B.sel(B.cmp("ult", c, t.tail), o, B.c(INVALID_OFFSET))',
         "return [o"),),
        "a partial last K block reads on into the next row instead of zeros past K"),
    Mutation("deep-gemm-fp4-scale-block", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "sfb_voff = [sfb_group + c * sfb_sn + t.g * sfb_sk1 for c in cols]",
         "sfb_voff = [sfb_group + c * sfb_sn for c in cols]"),),
        "FP4 weight scales: every lane reads the first 32-K block's scale of its 128-K block"),
    Mutation("k-loop-steps-reuse-first-registers", ("blockscale_grouped_gemm", "moe_gemm2_a4w4_flydsl"), (
        (IR_BUILDER, "acc, regs = run_step(kt + j if j else kt, acc, regs, j)",
         "acc, _ = run_step(kt + j if j else kt, acc, regs, j)"),),
        "K loop in groups of steps: every step of an iteration multiplies the first step's operands"),
    Mutation("k-loop-remainder-dropped", ("blockscale_grouped_gemm", "moe_gemm2_a4w4_flydsl"), (
        (IR_BUILDER, "arith.cmpi(arith.CmpIPredicate.slt, kt, k_steps)",
         "arith.cmpi(arith.CmpIPredicate.sgt, kt, k_steps)"),),
        "K loop in groups of steps: the remainder loses its steps"),
    Mutation("deep-gemm-wait-one-op-short", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "(len(sb) if t.ue8m0 else 0) + t.dmas + t.bdmas\n",
         "(len(sb) if t.ue8m0 else 0) + t.dmas + t.bdmas + 1\n"),),
        "loads two steps ahead: the step's barrier leaves one op too many in flight (its oldest DMA unwaited)"),
    Mutation("deep-gemm-xcd-last-band-full", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "rows_in_band = Int(B.sel(B.cmp(\"slt\", m_tiles - first, band), m_tiles - first, band))",
         "rows_in_band = Int(band)"),),
        "the XCD tile order takes a partial last band of row tiles as a whole one"),
    Mutation("deep-gemm-xcd-divide-no-margin", ("blockscale_grouped_gemm",), (
        (IR_BUILDER, "Int(q) * 2 + 1), half_rcp", "Int(q) * 2), half_rcp"),),
        "the tile order's float division without its half step: an exact multiple can land one below"),
    Mutation("deep-gemm-xcd-order-drops-round", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "w % XCDS * (dealt // XCDS) + w // XCDS", "w % XCDS * (dealt // XCDS)"),),
        "the XCD tile order maps each XCD's workgroups to its first tile"),
    Mutation("deep-gemm-b-dma-first-column-tile", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "lambda rl: (t.n0 + rl) * row_bytes", "lambda rl: rl * row_bytes"),),
        "e4m3 b through LDS: every workgroup's B tile DMA reads the group's first BN rows of b"),
    Mutation("deep-gemm-b-lds-first-wave-column", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "_tile_lds_offsets(t, t.bm * BLOCK_K, t.wn * t.wn_cols + (nt * 16 + t.r16))",
         "_tile_lds_offsets(t, t.bm * BLOCK_K, nt * 16 + t.r16)"),),
        "e4m3 b through LDS: both wave columns read the first half of the B tile"),
    Mutation("deep-gemm-padding-tiles-skipped", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "active = arith.ori(run, pad)", "active = run"),),
        "ensure_zero_padding: tiles made only of padding rows exit without writing their zeros"),
    Mutation("deep-gemm-psum-group-off-by-one", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, 'B.cmp("sle", (end + (M_ALIGN - 1)) & -M_ALIGN, row_base)',
         'B.cmp("slt", (end + (M_ALIGN - 1)) & -M_ALIGN, row_base)'),),
        "psum layout: a tile starting exactly at a group's aligned end is given the previous group"),
    Mutation("deep-gemm-psum-first-chunk-only", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, 'more = arith.andi(B.cmp("eq", count, B.c(64)),',
         'more = arith.andi(B.cmp("eq", count, B.c(65)),'),),
        "psum layout: the group search stops after the first 64 group ends (more than 64 groups)"),
    Mutation("deep-gemm-bf16-chunks-out-of-order", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "            for h in range(2):\n                for mt in range(t.m_tiles):",
         "            for h in (1, 0):\n                for mt in range(t.m_tiles):"),),
        "bf16: each K block's second 32-K MFMA is accumulated before its first (summation order)"),
    Mutation("deep-gemm-bf16-a-half-mismatched", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "llvm.bitcast(v8bf16, af[mt][h])", "llvm.bitcast(v8bf16, af[mt][1 - h])"),),
        "bf16: a's 32-K half of the other half of the K block multiplies b's"),
    Mutation("deep-gemm-bf16-rows-in-elements", ("blockscale_grouped_gemm",), (
        (BLOCKSCALE, "        k = k * 2 ", "        k = k + 0 "),),
        "bf16: rows of a and b addressed as K bytes instead of 2K (and half the K blocks)"),
    # ---- tensorwise FP8 grouped GEMM (FlyDSL)
    Mutation("grouped-fp8-drop-b-scale", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "return arith.mulf(b.splat_value(b.v4f32, sa), sb)", "return b.splat_value(b.v4f32, sa)"),),
        "the scale product is a's scale alone, not sa * sb (tensorwise, row-wise and block scales)"),
    Mutation("grouped-fp8-bf16-truncate", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "v = llvm.bitcast(raw, arith.truncf(v4e, v))",
         "v = llvm.bitcast(raw, arith.truncf(v4e, llvm.bitcast(b.v4f32, arith.andi(llvm.bitcast(b.v4i32, v), "
         "arith.constant(b.v4i32, ir.DenseElementsAttr.get_splat(b.v4i32, ir.IntegerAttr.get(b.i32, -65536)))))))"),),
        "output conversion drops the low 16 fp32 bits first: bf16 truncates instead of RNE"),
    Mutation("grouped-fp8-accumulate-drops-old", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "v = arith.addf(v, old if", "v = arith.addf(v, v if"),),
        "out += result adds the result to itself, not to what out held (fp32 main_grad)"),
    Mutation("grouped-fp8-accumulate-old-rounded", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "v = arith.addf(v, old if out_t == \"f32\" else arith.extf(b.v4f32, llvm.bitcast(v4e, old)))",
         "v = arith.addf(v, old) if out_t == \"f32\" else arith.extf(b.v4f32, arith.addf(arith.truncf(v4e, v), "
         "llvm.bitcast(v4e, old)))"),),
        "bf16 accumulation rounds the product to bf16 before the add (two roundings, not one)"),
    Mutation("grouped-fp8-f32-out-half-stride", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, 'OUT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}', 'OUT_BYTES = {"bf16": 2, "f16": 2, "f32": 2}'),),
        "fp32 output addressed with 2-byte elements"),
    Mutation("grouped-fp8-mixed-formats-swapped", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "FMT_CODE[fmt_b], FMT_CODE[fmt_a], 0, scales[0]",
         "FMT_CODE[fmt_a], FMT_CODE[fmt_b], 0, scales[0]"),),
        "the MFMA decodes a with b's format code and b with a's (mixed e4m3 x e5m2 only)"),
    Mutation("grouped-fp8-prefetch-stages-newest-step", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "stage(kt + 1, (flat[:n_a], flat[n_a:n_a + len(B.slots)]))",
         "stage(kt + 1, (flat[-n_a - len(B.slots):][:n_a], flat[-len(B.slots):]))"),),
        "128 x 128 (two steps in flight): step kt+1's LDS buffer receives step kt+2's loads"),
    Mutation("grouped-fp8-dma-reads-unswizzled", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "row + ((g + 4 * h ^ self.swizzle(s)) * 16 if self.dma",
         "row + ((g + 4 * h) * 16 if self.dma"),),
        "256 x 256 (DMA): the K-major operand reads ignore the chunk swizzle the DMA wrote"),
    Mutation("grouped-fp8-dma-skip-one-line-short", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "Int(ld) * (p * self.skip * self.es)", "Int(ld) * (p * (self.skip - 1) * self.es)"),),
        "256 x 256 (DMA): each later DMA of a step starts one line short of its slot"),
    Mutation("grouped-fp8-dma-one-line-past-the-contraction", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, 'b.cmp("sgt", lines_left, b.c(p * self.skip))',
         'b.cmp("sge", lines_left, b.c(p * self.skip))'),),
        "256 x 256 (DMA): a line just past the rows / contraction is read, not zeroed (TN: the next group's row)"),
    Mutation("grouped-fp8-dma-no-barrier-between-tiles", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "this tile's into the same bytes\n            rocdl.s_barrier()\n",
         "this tile's into the same bytes\n            pass\n"),),
        "256 x 256 TN (DMA, one step deep): a wave's next tile DMA overwrites the buffer slower waves still read"),
    Mutation("grouped-fp8-dma-refill-before-every-read", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "                rocdl.s_waitcnt(WAIT_LGKMCNT0)\n                rocdl.s_barrier()\n",
         "                rocdl.s_waitcnt(WAIT_LGKMCNT0)\n"),),
        "DMA tiles two steps deep: a wave's DMA refills the buffer it just read while slower waves still read it"),
    Mutation("grouped-fp8-dma-lines-not-held-to-whole-issues", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "return line, lines, line + (0 if dma else PAD), -(-lines // per_issue) * per_issue",
         "return line, lines, line + (0 if dma else PAD), lines"),),
        "256 x 224 (DMA): B holds its 224 lines only, so the last DMA issue's upper half writes the next buffer"),
    Mutation("grouped-fp8-scan-tile-count-off-by-one", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "count = arith.muli(b.ceil_div(arith.subi(e, s), bm), n_tiles)",
         "count = arith.muli(b.ceil_div(arith.subi(arith.subi(e, s), b.c(1)), bm), n_tiles)"),),
        "group scan counts ceil((len - 1) / BM) row tiles: a last row alone in its tile is never computed"),
    Mutation("grouped-fp8-padded-tail-unwritten", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "total = arith.addi(_group_scan(b, group_offs, G, bm, n_tiles, bid)[0], tail_tiles)",
         "total = _group_scan(b, group_offs, G, bm, n_tiles, bid)[0]"),),
        "NT / NN leave the out rows of a padded tail (past group_offs[G]) unwritten instead of zero"),
    Mutation("grouped-fp8-tn-contraction-off-by-one", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "arith.subi(e, s),\n                  out_base, N, sc, sc_tile)",
         "arith.subi(arith.subi(e, s), b.c(1)),\n                  out_base, N, sc, sc_tile)"),),
        "variable-K wgrad drops each group's last contraction row"),
    Mutation("grouped-fp8-block-scale-next-k-block", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "sa_off = [v + kb * self.sa_sk for v in sa_off]",
         "sa_off = [v + (kb + 1) * self.sa_sk for v in sa_off]"),),
        "block scales: each step reads a's scale of the next 128-wide contraction block (off by one)"),
    Mutation("grouped-fp8-sb-shift-ignored", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "col = [c >> self.sb_shift for c in col]", "col = [c >> 7 for c in col]"),),
        "block scales of b always read per 128 output columns: per-column ((1, 1, 128) recipe) scales ignored"),
    Mutation("grouped-fp8-block-promotion-skipped", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, 'zero if gran == "block" else acc[t]', "acc[t]"),),
        "block scales multiply the MFMA's running sum (C = acc), not each block's exact partial from C = 0"),
    Mutation("grouped-fp8-tn-block-index-per-group", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "arith.divui(s, b.c(kb_len))", "b.c(0)"),),
        "variable-K block scales: the 128-row block index restarts at each group instead of (offs[g] + c) / 128"),
    Mutation("grouped-mx-scales-swapped", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, 'scales = (mx[h][1][j], mx[h][0][i]) if gran == "mx"',
         'scales = (mx[h][0][i], mx[h][1][j]) if gran == "mx"'),),
        "mx: a's e8m0 scales fed to the MFMA as b's and b's as a's"),
    Mutation("grouped-mx-first-block-only", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "kb = kb0 + lane // 16", "kb = kb0 + 0 * lane"),),
        "mx: every lane feeds the scale of the step's first 32-block, not block lane / 16"),
    Mutation("grouped-fp4-halves-swapped", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "cat([x[h], zero4])", "cat([x[1 - h], zero4])"),),
        "e2m1: each MFMA of a step takes the other 128-element half (nibble pairs fed under the wrong 32-blocks' "
        "scales)"),
    Mutation("grouped-fp4-a-nibbles-swapped", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "for x in (b_ops[j], a_ops[i])]",
         "for x in (b_ops[j], a_ops[i])]\n" + " " * 20
         + "srcs[1] = srcs[1] if halves == 1 else cat([arith.ori(arith.shli(arith.andi(a_ops[i][h], LOW), FOUR), "
         "arith.andi(arith.shrui(a_ops[i][h], FOUR), LOW)), zero4])"
         .replace("LOW", "arith.constant(b.v4i32, ir.DenseElementsAttr.get_splat(b.v4i32, b.c_attr(0x0F0F0F0F)))")
         .replace("FOUR", "arith.constant(b.v4i32, ir.DenseElementsAttr.get_splat(b.v4i32, b.c_attr(4)))")),),
        "e2m1: the two nibbles of every byte of a swapped (a's element 2i read from the high nibble; swapping "
        "both operands' would be the same sum)"),
    Mutation("grouped-fp4-scales-of-first-half", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "(kt * halves + h) * (BK // MX_BLOCK)", "kt * halves * (BK // MX_BLOCK)"),),
        "e2m1: a step's second MFMA applies the e8m0 scales of its first 128 elements' 32-blocks"),
    Mutation("grouped-fp4-ntk-scale-block-off-by-one", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "arith.divui(s, b.c(MX_BLOCK))", "arith.addi(arith.divui(s, b.c(MX_BLOCK)), b.c(1))"),),
        "NTK: a group's first scale block is the one after its start (group start off by one 32-block)"),
    Mutation("grouped-fp4-ntk-group-start-off-by-one", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "s_ops = arith.shrui(s, b.c(1)) if fmt in PER_BYTE else s",
         "s_ops = arith.addi(arith.shrui(s, b.c(1)), b.c(1)) if fmt in PER_BYTE else s"),),
        "NTK: operands read from one byte (two elements) past the group's start"),
    Mutation("grouped-fp4-row-stride-in-elements", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "k_ops = arith.shrui(K, b.c(1)) if fmt in PER_BYTE else K", "k_ops = K"),),
        "e2m1: rows and the contraction counted in elements where the packed operands have K / 2 bytes"),
    Mutation("grouped-bf16-chunks-out-of-order", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "            for h in range(2):\n", "            for h in (1, 0):\n"),),
        "bf16: each step's second 32-wide chunk is accumulated before its first (summation order)"),
    Mutation("grouped-bf16-a-chunk-mismatched", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "srcs = [llvm.bitcast(v8half, x[h]) for x in (b_ops[t % nj_n], a_ops[t // nj_n])]",
         "srcs = [llvm.bitcast(v8half, x[i]) for x, i in ((b_ops[t % nj_n], h), (a_ops[t // nj_n], 1 - h))]"),),
        "bf16: a's 32-wide chunk of the other half of the step multiplies b's"),
    Mutation("grouped-bf16-element-offsets-as-bytes", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "voff = arith.select(ok, off * self.es, b.c(INVALID_OFFSET))",
         "voff = arith.select(ok, off, b.c(INVALID_OFFSET))"),),
        "operand loads address bf16 elements with 1-byte strides"),
    Mutation("grouped-bf16-steps-of-128-elements", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, "steps = b.ceil_div(c_len, A.bke)", "steps = b.ceil_div(c_len, BK)"),),
        "the contraction loop counts 128 elements per step: bf16 (64 per step) computes half of K"),
    Mutation("grouped-f16-on-bf16-mfma", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, 'b.bf16 if fmt_a == "bf16" else ir.F16Type.get()', "b.bf16"),
        (TRAIN_GROUPED, 'fx.rocdl.mfma_f32_16x16x32_bf16 if fmt_a == "bf16" else fx.rocdl.mfma_f32_16x16x32_f16',
         "fx.rocdl.mfma_f32_16x16x32_bf16"),),
        "f16: fp16 operands fed to v_mfma_f32_16x16x32_bf16 (their bits decoded as bf16)"),
    Mutation("grouped-f16-out-saturates", ("train_grouped_gemm",), (
        (TRAIN_GROUPED, '            if out_t != "f32":\n',
         '            if out_t == "f16":\n                lim = b.splat(b.v4f32, 65504.0)\n'
         '                v = arith.minimumf(arith.maximumf(v, arith.negf(lim)), lim)\n'
         '            if out_t != "f32":\n'),),
        "fp16 out clamped to +-65504 before the store: a sum past fp16's range stays finite instead of inf"),
    # ---- MX GEMM (FlyDSL)
    Mutation("mx-gemm-drop-b-scale", ("mx_gemm",), (
        (MX_GEMM, "FMT_CODE[b_fmt], FMT_CODE[a_fmt], bb, sb, ba, sa]",
         "FMT_CODE[b_fmt], FMT_CODE[a_fmt], 0, self.b.c(127), ba, sa]"),),
        "the MMA gets scale 1.0 for B: weight scales ignored"),
    Mutation("mx-gemm-swap-formats", ("mx_gemm",), (
        (MX_GEMM, "FMT_CODE[b_fmt], FMT_CODE[a_fmt], bb, sb", "FMT_CODE[a_fmt], FMT_CODE[b_fmt], bb, sb"),),
        "cbsz / blgp swapped: mixed-format operands (A8W4, e4m3 x e5m2) decoded in each other's format"),
    Mutation("mx-gemm-scale-next-k-block", ("mx_gemm",), (
        (MX_GEMM, "shift = lane // 16 * 8", "shift = (lane // 16 + 1) % 4 * 8"),),
        "each lane takes the scale byte of the next 32-block of its step (off by one in the K-block index)"),
    Mutation("mx-gemm-window-first-stage-only", ("mx_gemm",), (
        (MX_GEMM, "d = j * stage.steps + u\n            src", "d = u\n            src"),),
        "every stage of a loop iteration takes the scale dwords of the window's first stage"),
    Mutation("mx-gemm-window-half-stage-scale-kept", ("mx_gemm",), (
        (MX_GEMM, "scales.append(x if u == 0 else b.sel(first_only, b.c(0), x))", "scales.append(x)"),),
        "a half-full last stage's second step keeps the window's bytes past the row's end (the next row's "
        "scales) instead of 0: zero operands times a NaN scale poison the row"),
    Mutation("mx-gemm-window-one-turn", ("mx_gemm",), (
        (MX_GEMM, "if slot == span - 1 else win",
         "if slot % (span // self.window_turns) == span // self.window_turns - 1 else win"),),
        "a two-turn scale window is replaced after its first ring turn: the second turn's stages take "
        "the scales of the stages after them"),
    Mutation("mx-gemm-eight-waves-as-two-rows", ("mx_gemm",), (
        (MX_GEMM, "t.wave_rows = t.bm // (target.waves // 2)", "t.wave_rows = t.bm // 2"),),
        "eight waves tile the output as 2 x 2: waves 4-7 compute rows past the tile, half its rows stay unwritten"),
    Mutation("mx-gemm-window-past-tensor-end", ("mx_gemm",), (
        (MX_GEMM, "left = arith.maxsi(Int(stage.records[k]) - off, b.c(0))", "left = b.c(0x7FFFFFFF)"),),
        "scale windows unbounded: the last rows' windows read past the scale tensor's end"),
    Mutation("mx-gemm-shuffled-tile-halves-swapped", ("mx_gemm",), (
        (MX_GEMM, "scales += [(x, d % 2 * 2 + r1) for r1 in (0, 1)]",
         "scales += [(x, d % 2 * 2 + 1 - r1) for r1 in (0, 1)]"),),
        "shuffled scales: each 16-row tile takes the scale byte of the other tile of its pair (op_sel bit 0)"),
    Mutation("mx-gemm-shuffled-one-step-a-chunk", ("mx_gemm",), (
        (MX_GEMM, "scales += [(x, d % 2 * 2 + r1) for r1 in (0, 1)]", "scales += [(x, r1) for r1 in (0, 1)]"),),
        "shuffled scales: both K steps of a chunk take the first step's byte (op_sel bit 1 never set)"),
    Mutation("mx-gemm-shuffled-group-stride-k", ("mx_gemm",), (
        (MX_GEMM, "group_bytes = (kblocks + 7) // 8 * 256", "group_bytes = kblocks * 32"),),
        "shuffled scales: a 32-row group's bytes taken as K, not K rounded up to 256 (the padded columns)"),
    Mutation("mx-gemm-shuffled-refill-next-chunk", ("mx_gemm",), (
        (MX_GEMM, "        c = last // 2\n", "        c = (last // 2 + 1) % stage.n\n"),),
        "shuffled scales: a stage refills the chunk after the one it finished, before that chunk's steps ran"),
    Mutation("mx-gemm-bf16-truncate", ("mx_gemm",), (
        (MX_GEMM, "half), v))",
         "half), llvm.bitcast(v.type, arith.andi(llvm.bitcast(ir.VectorType.get(ir.VectorType(v.type).shape, b.i32), "
         "v), arith.constant(ir.VectorType.get(ir.VectorType(v.type).shape, b.i32), "
         "ir.DenseElementsAttr.get_splat(ir.VectorType.get(ir.VectorType(v.type).shape, b.i32), "
         "ir.IntegerAttr.get(b.i32, -65536)))))))"),),
        "output conversion drops the low 16 fp32 bits first: bf16 truncates instead of RNE"),
    Mutation("mx-gemm-no-lds-swizzle-on-read", ("mx_gemm",), (
        (MX_GEMM, "b.gep(buf, base + op.swizzle(s, row))", "b.gep(buf, base + s)"),),
        "fragments read LDS chunk g unswizzled: the DMA stored it at g ^ (row % chunks)"),
    Mutation("mx-gemm-fp6-codes-swapped", ("mx_gemm",), (
        (MX_GEMM, '"e2m3": 2, "e3m2": 3,', '"e2m3": 3, "e3m2": 2,'),),
        "cbsz / blgp of the FP6 formats swapped: e2m3 payloads decoded as e3m2 and back"),
    Mutation("mx-gemm-fp6-fragment-stride-32", ("mx_gemm",), (
        (MX_GEMM, "+ g * op.frag_bytes + size * p", "+ g * (op.frag_bytes + 8 * (op.bits == 6)) + size * p"),),
        "an FP6 lane group reads its 24-byte fragment at a 32-byte stride (as if FP8 halves)"),
    Mutation("mx-gemm-fp6-partial-dma-every-wave", ("mx_gemm",), (
        (MX_GEMM, 'live = None if waves >= self.waves else b.cmp("slt", wave, b.c(waves))', "live = None"),),
        "every wave issues an FP6 64-row tile's last partial DMA: waves past the tile write into the next "
        "operand's or stage's LDS"),
    Mutation("mx-gemm-one-lds-stage", ("mx_gemm",), (
        (MX_GEMM, "b.gep(lds, Int(kt) % t.num_buffers * t.stage_bytes)", "b.gep(lds, b.c(0))"),
        (MX_GEMM, "b.gep(lds, b.c(slot * t.stage_bytes))", "b.gep(lds, b.c(0))"),),
        "one LDS stage: step kt+1's DMA overwrites the tile other waves are still reading"),
    Mutation("mx-gemm-split-floor", ("mx_gemm",), (
        (MX_GEMM, "per_split = (stages + (Int(splits) + -1)) // splits", "per_split = stages // splits"),),
        "K steps per split rounded down: an uneven split-K drops its last steps"),
    Mutation("mx-gemm-stage-steps-read-first-step", ("mx_gemm",), (
        (MX_GEMM, "[u * op.step_bytes + g * op.frag_bytes + size * p", "[g * op.frag_bytes + size * p"),),
        "with two K steps per stage, the second step's fp4 fragments are read from the first step's bytes"),
    Mutation("mx-gemm-half-stage-loads-second-step", ("mx_gemm",), (
        (MX_GEMM, "voff = voff if first_only is None else b.sel(first_only, first, voff)", "voff = voff"),),
        "a half-full last stage DMAs its missing second step too: bytes past K (the next row, past the last "
        "row the end of the operand)"),
    Mutation("mx-gemm-three-buffers-wait-too-little", ("mx_gemm",), (
        (MX_GEMM, "loads_done_barrier(0 if depth == 1 else len(stage.a_dma) + len(stage.b_dma))",
         "loads_done_barrier(0 if depth == 1 else 4 * (len(stage.a_dma) + len(stage.b_dma)))"),),
        "with two stages in flight the barrier leaves part of the stage it needs pending (after a stage's "
        "DMA come at most a scale window and the next stage's DMA: 8 + 6 ops a wave at 256 x 128 with eight "
        "waves, so 4 x 6 leaves all 6 of its own): its reads may see the DMA unfinished"),
    Mutation("mx-gemm-row-tail-unmasked", ("mx_gemm",), (
        (MX_GEMM, "ok = arith.andi(b.cmp(\"slt\", row, t.m_left), b.cmp(\"slt\", col, t.n_left))",
         "ok = b.cmp(\"slt\", col, t.n_left)"),),
        "epilogue stores rows past M (into the next rows of out, or past its end)"),
    # ---- emulator semantics (kernel tests must pin them)
    Mutation("emu-v_add_f32-plus-1ulp", ALL, (
        (VALU, '"v_add_f32": ("f32", "f32 f32", np.add),',
         '"v_add_f32": ("f32", "f32 f32", lambda a, b: np.nextafter(a + b, f32(np.inf))),'),),
        "emulated v_add_f32 one ulp high"),
    Mutation("emu-v_pk_fma_f32-plus-1ulp", ALL, (
        (VALU, '"v_pk_fma_f32": ("f32", 3, fma32),',
         '"v_pk_fma_f32": ("f32", 3, lambda a, b, c: np.nextafter(fma32(a, b, c), f32(np.inf))),'),),
        "emulated packed fma one ulp high"),
    Mutation("emu-pk_add_bf16-truncate", ALL, (
        (ATOMICS, "return _pk_add(old, val, bf16_value, bf16_round)",
         "return _pk_add(old, val, bf16_value, lambda x: np.asarray(x, np.float64).astype(np.float32)"
         ".view(np.uint32) >> np.uint32(16))"),),
        "emulated bf16 atomic add truncates"),
    Mutation("emu-batch-atomic-kernels", ALL, (
        (EMU_LAUNCH, "ordered = cdims or not self.lockstep or any(i.base.startswith(GLOBAL_ATOMICS) for i in instrs)",
         "ordered = cdims or not self.lockstep"),),
        "a kernel with global atomics runs its workgroups in batches: atomics land in order of progress"),
)
