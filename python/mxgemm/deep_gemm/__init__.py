"""mxgemm.deep_gemm: DeepGEMM's public names on AMD gfx950 (``import mxgemm.deep_gemm as deep_gemm``).

So far: the layout helpers DeepGEMM users call when they build grouped inputs. The grouped
FP8 GEMMs themselves are the ``deep_gemm_fp8`` kernel family (see ``mxgemm.registry``).
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
