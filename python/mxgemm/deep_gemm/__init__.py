"""mxgemm.deep_gemm: DeepGEMM's public names on AMD gfx950 (``import mxgemm.deep_gemm as deep_gemm``).

So far: the layout helpers DeepGEMM users call when they build grouped inputs, and
``mxgemm.deep_gemm.utils`` (DeepGEMM's casts and ``calc_diff``). The grouped FP8 GEMMs
(``m_grouped_fp8_gemm_nt_contiguous`` / ``_masked``) run as the ``deep_gemm_fp8`` kernel family
(``mxgemm.registry``; layouts and numerics in ``flydsl_kernels/deep_gemm_fp8.py``); their public
functions with host-side guards are not exposed here yet.
"""
from .utils import align, ceil_div

# Rows of each group in the contiguous layout are padded to a multiple of this (padding rows
# carry group -1). Every tile of the kernel then belongs to exactly one group.
MK_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT = 128


def get_mk_alignment_for_contiguous_layout() -> int:
    """Row alignment of each group in ``m_grouped_fp8_gemm_nt_contiguous``'s input."""
    return MK_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT


# DeepGEMM's earlier name for the same function (both are part of its public API).
get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout

__all__ = ["align", "ceil_div", "get_mk_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout"]
