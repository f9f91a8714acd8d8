"""mxgemm.deep_gemm: DeepGEMM's public names on AMD gfx950 (``import mxgemm.deep_gemm as deep_gemm``).

The grouped FP8 and FP8 x FP4 GEMMs ``m_grouped_fp8_fp4_gemm_nt_contiguous`` /
``m_grouped_fp8_fp4_gemm_nt_masked`` and their 2.6 aliases ``m_grouped_fp8_gemm_nt_contiguous`` /
``m_grouped_fp8_gemm_nt_masked`` (DeepGEMM 2.6's argument order; they run the op
``mxgemm.deep_gemm_fp8_grouped_gemm``, whose docstring gives layouts and numerics), DeepGEMM
2.6's scale-layout and alignment helpers (``layout.py``: the AMD meaning of TMA alignment, the
contiguous-layout alignment, the UE8M0 packers, ``transform_sf_into_required_layout``), its
runtime settings (``runtime.py``: ``set_num_sms`` caps persistent grids) and
``mxgemm.deep_gemm.utils`` (DeepGEMM's casts, ``calc_diff``, ``count_bytes``).

Scales: fp32 sfa/sfb (DeepGEMM's SM90 recipe) are applied exactly per 128-K block in fp32 and
never cast, so ``disable_ue8m0_cast`` changes nothing; UE8M0 scales go to the scaled MFMA's
hardware scales, either as bytes (uint8 / float8_e8m0fnu, sfb per 128 rows of b) or packed as
DeepGEMM's SM100 kernels take them: four to an int32 along K (byte i of word j is K block
4j + i), MN-major, sfa [.., M, ceil(K/512)] and sfb [G, N, ceil(K/512)] with one scale per row
of b (recipe (1, 1, 128)); ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` makes them.
Row-major and MN-major sfa are both read in place, but MN-major is the fast one at long K: a wave's
16 rows share a cache line, where row-major gives each row a line per window of 12-16 K blocks (K 7168,
masked m 256 N 2048 on the timing model: 28.0 us against 35.0; docs/peers/blockscale.md).
``compiled_dims`` and ``expected_m`` are JIT / scheduling hints of DeepGEMM's and change nothing
here; ``config`` (mxgemm's, after DeepGEMM's arguments) picks the tile, else the tuned table
or ``choose_tile`` (ops/blockscale_grouped_gemm.py). FP4 b (int8 / uint8 [G, N, K/2], two e2m1 per
byte, element 2i in the low nibble: per_token_cast_to_fp4) takes recipe_a (1, 128) and recipe_b
(1, 32): one scale per row of b and 32-K block, fp32 (cast to UE8M0: the exponent field) or UE8M0 bytes / packed int32.
Contiguous layouts: m_indices (a group per row, -1 padding) or, with ``use_psum_layout``, DeepGEMM's
psum layout (grouped_layout [G] = each group's end row; group g starts at the previous end aligned
to 128, the only alignment the psum kernel serves; any number of groups). Padding rows of d: with
m_indices (== -1) always zeros, as DeepGEMM's kernels compute them from a's zero padding rows
(its own tests expect zeros there with ensure_zero_padding=False); in the psum layout (rows
between a group's end and the next aligned start, and past the last group) zeros with
``ensure_zero_padding=True`` (2.6's default) and untouched with False; rows >= masked_m of the
masked layout are left untouched.

The M-grouped BF16 GEMMs ``m_grouped_bf16_gemm_nt_contiguous`` / ``_nn_contiguous`` /
``_nt_masked`` (alias ``bf16_m_grouped_gemm_nt_masked``) take bf16 a and b without scales and run
the same op and kernel family (its A_FMT bf16 variants: fp32 accumulation over 32-K bf16 MFMAs,
bf16 d), with the FP8 functions' layouts, padding rules and weight majorness.

The dense GEMMs ``fp8_gemm_nt`` / ``nn`` / ``tn`` / ``tt`` (2.6: ``fp8_fp4_gemm_*``) and the
K-grouped weight-gradient GEMMs ``k_grouped_fp8_gemm_tn_contiguous`` / ``_nt_contiguous`` run
mxgemm's grouped FP8 GEMM family with 128-block scales, and their BF16 forms ``bf16_gemm_nt`` /
``nn`` / ``tn`` / ``tt`` and ``k_grouped_bf16_gemm_tn_contiguous`` its BF16 variants
(``gemm.py``: layouts, ``c``, costs). ``einsum`` / ``fp8_einsum`` (DeepGEMM's three and two
hard-coded expressions) and the cuBLASLt baseline GEMMs ``cublaslt_gemm_*`` are in ``einsum.py``.

Not covered: FP4 operands of the dense NN / TN / TT GEMMs (``fp8_fp4_gemm_nt`` takes FP4 b), FP4
activations (a), 1 x 32 activation scales (recipe_a (1, 32)) and
the attention-logit kernels (no kernel here for them: mxgemm's tensorwise
FP8 grouped GEMMs are ``mxgemm.grouped_gemm_fp8*``), contiguous-layout alignments below 128 (and
other than 128 for the psum layout), K % 16 != 0 (K % 32 != 0 with FP4 b) and N % 32 != 0 (the
kernel's load-chunk and tile rules: see the op's docstring).
"""
from .einsum import cublaslt_gemm_nn, cublaslt_gemm_nt, cublaslt_gemm_tn, cublaslt_gemm_tt, einsum, fp8_einsum
from .gemm import (
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_tn,
    fp8_gemm_tt,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
)
from .grouped import (
    bf16_m_grouped_gemm_nt_masked,
    explain,
    fp8_fp4_gemm_nn,
    fp8_fp4_gemm_nt,
    fp8_fp4_gemm_tn,
    fp8_fp4_gemm_tt,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from .layout import (
    align,
    ceil_div,
    get_k_alignment_for_contiguous_layout,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_m_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_theoretical_mk_alignment_for_contiguous_layout,
    get_tma_aligned_size,
    set_mk_alignment_for_contiguous_layout,
    transform_sf_into_required_layout,
)
from .runtime import (
    get_num_sms,
    get_pdl,
    get_tc_util,
    set_block_size_multiple_of,
    set_ignore_compile_dims,
    set_num_sms,
    set_pdl,
    set_tc_util,
)

__all__ = ["align", "bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn", "bf16_gemm_tt", "bf16_m_grouped_gemm_nt_masked",
           "ceil_div", "cublaslt_gemm_nn", "cublaslt_gemm_nt", "cublaslt_gemm_tn", "cublaslt_gemm_tt", "einsum",
           "explain", "fp8_einsum", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_nt", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
           "fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_tn", "fp8_gemm_tt", "get_k_alignment_for_contiguous_layout",
           "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "get_m_alignment_for_contiguous_layout",
           "get_mk_alignment_for_contiguous_layout", "get_mn_major_tma_aligned_packed_ue8m0_tensor",
           "get_mn_major_tma_aligned_tensor", "get_num_sms", "get_pdl", "get_tc_util",
           "get_theoretical_mk_alignment_for_contiguous_layout", "get_tma_aligned_size",
           "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
           "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked",
           "m_grouped_fp8_fp4_gemm_nn_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous",
           "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_contiguous",
           "m_grouped_fp8_gemm_nt_masked", "set_block_size_multiple_of", "set_ignore_compile_dims",
           "set_mk_alignment_for_contiguous_layout", "set_num_sms", "set_pdl", "set_tc_util",
           "transform_sf_into_required_layout"]
