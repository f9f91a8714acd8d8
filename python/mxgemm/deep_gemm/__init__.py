"""mxgemm.deep_gemm: DeepGEMM's public names on AMD gfx950 (``import mxgemm.deep_gemm as deep_gemm``).

The grouped FP8 GEMMs ``m_grouped_fp8_gemm_nt_contiguous`` / ``m_grouped_fp8_gemm_nt_masked``
(DeepGEMM's argument order; they run the op ``mxgemm.deep_gemm_fp8_grouped_gemm``, whose
docstring gives layouts and numerics), DeepGEMM 2.6's scale-layout and alignment helpers
(``layout.py``: the AMD meaning of TMA alignment, the contiguous-layout alignment, the UE8M0
packers, ``transform_sf_into_required_layout``), its runtime settings (``runtime.py``:
``set_num_sms`` caps persistent grids) and ``mxgemm.deep_gemm.utils`` (DeepGEMM's casts,
``calc_diff``, ``count_bytes``).

Scales: fp32 sfa/sfb (DeepGEMM's SM90 recipe) are applied exactly per 128-K block in fp32 and
never cast, so ``disable_ue8m0_cast`` changes nothing; UE8M0 scales go to the scaled MFMA's
hardware scales, either as bytes (uint8 / float8_e8m0fnu, sfb per 128 rows of b) or packed as
DeepGEMM's SM100 kernels take them: four to an int32 along K (byte i of word j is K block
4j + i), MN-major, sfa [.., M, ceil(K/512)] and sfb [G, N, ceil(K/512)] with one scale per row
of b (recipe (1, 1, 128)); ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` makes them.
``compiled_dims`` and ``expected_m`` are JIT / scheduling hints of DeepGEMM's and change nothing
here; ``config`` (mxgemm's, after DeepGEMM's arguments) picks the tile (``choose_tile`` in
ops/deep_gemm.py). Rows of no group (m_indices == -1, rows >= masked_m) are left untouched.

Not covered: DeepGEMM's dense GEMMs (fp8_gemm_nt/nn/tn/tt, the bf16 ones) and NN grouped
forms, its K-grouped weight-gradient GEMMs, the FP4 and attention-logit kernels (no kernel here
for them: mxgemm's tensorwise FP8 grouped GEMMs are ``mxgemm.grouped_gemm_fp8*``), the psum
layout and ``use_psum_layout``, contiguous-layout alignments below 128, K % 16 != 0 and
N % 32 != 0 (the kernel's load-chunk and tile rules: see the op's docstring).
"""
import torch

from .. import guards
from ..ops._op import OPS
from ..ops.deep_gemm import PACKED, deep_gemm_fp8_grouped_gemm
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


def _flat(a, b, d, layout, recipe, masked: bool, config):
    """DeepGEMM's (tensor, scales) pairs -> the op's flat arguments."""
    for name, pair in (("a", a), ("b", b)):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            guards.fail("args", f"{name} must be a (fp8 tensor, scales) pair as in DeepGEMM; got {type(pair).__name__}")
    if not isinstance(layout, torch.Tensor):
        guards.fail("type", f"{'masked_m' if masked else 'm_indices'} must be an int32 torch.Tensor; "
                            f"got {type(layout).__name__}")
    want = (1, 1, 128) if b[1].dtype == PACKED else (1, 128, 128)  # DeepGEMM's default for this sfb
    if recipe is not None and tuple(recipe) != want:
        guards.fail("recipe", f"recipe = {tuple(recipe)}: with sfb of dtype {b[1].dtype} the block scaling is {want}")
    return (a[0], a[1], b[0], b[1], layout, d), {"masked": masked, "config": config}


def _contiguous(a, b, d, m_indices, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False, config=""):
    return _flat(a, b, d, m_indices, recipe, False, config)


def _masked(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False, config=""):
    if not isinstance(expected_m, int) or expected_m < 0:
        guards.fail("expected_m", f"expected_m must be a non-negative int (a hint); got {expected_m!r}")
    return _flat(a, b, d, masked_m, recipe, True, config)


def m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, recipe=None, compiled_dims="nk",
                                     disable_ue8m0_cast=False, config="") -> None:
    """d[m] = a[m] . b[m_indices[m]]^T with block scales. a = (e4m3 [M, K], sfa [M, K/128]),
    b = (e4m3 [G, N, K], sfb [G, N/128, K/128]), d [M, N] bf16/f16 written in place,
    m_indices int32 [M] (-1: padding, d's row untouched; each group padded to
    get_mk_alignment_for_contiguous_layout() rows)."""
    args, kw = _contiguous(a, b, d, m_indices, recipe, compiled_dims, disable_ue8m0_cast, config)
    deep_gemm_fp8_grouped_gemm(*args, **kw)


def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk",
                                 disable_ue8m0_cast=False, config="") -> None:
    """d[g, m] = a[g, m] . b[g]^T for m < masked_m[g] with block scales. a = (e4m3 [G, M_max, K],
    sfa [G, M_max, K/128]), b as contiguous, d [G, M_max, N] written in place (rows >= masked_m[g]
    untouched), masked_m int32 [G]."""
    args, kw = _masked(a, b, d, masked_m, expected_m, recipe, compiled_dims, disable_ue8m0_cast, config)
    deep_gemm_fp8_grouped_gemm(*args, **kw)


_FLAT = {m_grouped_fp8_gemm_nt_contiguous: _contiguous, m_grouped_fp8_gemm_nt_masked: _masked}


def explain(fn, *args, **kw):
    """The plan (kernel, variant, backend, why) ``fn(*args, **kw)`` would run, or its GuardError."""
    flat, flat_kw = _FLAT[fn](*args, **kw)
    return OPS["deep_gemm_fp8_grouped_gemm"].explain(*flat, **flat_kw)


__all__ = ["align", "ceil_div", "explain", "get_k_alignment_for_contiguous_layout",
           "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "get_m_alignment_for_contiguous_layout",
           "get_mk_alignment_for_contiguous_layout", "get_mn_major_tma_aligned_packed_ue8m0_tensor",
           "get_mn_major_tma_aligned_tensor", "get_num_sms", "get_pdl", "get_tc_util",
           "get_theoretical_mk_alignment_for_contiguous_layout", "get_tma_aligned_size",
           "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "set_block_size_multiple_of",
           "set_ignore_compile_dims", "set_mk_alignment_for_contiguous_layout", "set_num_sms", "set_pdl",
           "set_tc_util", "transform_sf_into_required_layout"]
