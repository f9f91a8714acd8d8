"""DeepGEMM's (2.6) casts and test utilities (``deep_gemm.utils``) with DeepGEMM's definitions,
so its test generators run unchanged against ``mxgemm.deep_gemm``.

FP8 casts produce OCP ``torch.float8_e4m3fn`` (max 448), the e4m3 format gfx950's MFMA reads;
scales are fp32 ``max(amax, 1e-4) / 448`` per 1 x gran_k row block (per-token), gran_k x 1 column
block (per-channel) or gran_k x gran_k block (per-block), rounded up to a power of two with
``use_ue8m0``. The FP4 cast gives e2m1 codes, two per byte (element 2i in the low nibble), with
scales ``max(amax, 1e-4) / 6`` per 1 x gran_k block; DeepGEMM rounds a magnitude to the e2m1 value
whose rounding interval holds it, a tie going to the smaller magnitude (not RNE), and so does this.
"""
from __future__ import annotations

import torch

from .. import formats as F
from .. import quant
from .layout import (  # noqa: F401
    align,
    ceil_div,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    pack_ue8m0_to_int,
    unpack_ue8m0_from_int,
)

FP8_MAX = F.FP8_E4M3_MAX
FP4_MAX = 6.0
AMAX_FLOOR = quant.FP8_AMAX_EPS   # all-zero blocks still get a finite, nonzero scale
_FP4_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])   # between e2m1 magnitudes
ceil_to_ue8m0 = quant.ceil_to_ue8m0


def _check_2d(x, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name}: x must be 2-D, got shape {tuple(x.shape)}")


def _maybe_packed(sf: torch.Tensor, use_packed_ue8m0: bool) -> torch.Tensor:
    if not use_packed_ue8m0:
        return sf
    return pack_ue8m0_to_int(torch.nn.functional.pad(sf, (0, -sf.shape[-1] % 4), value=1.0))


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K/gran_k)], or with use_packed_ue8m0 their
    UE8M0 codes packed four to an int32 along K); x ~= fp8 * scale."""
    _check_2d(x, "per_token_cast_to_fp8")
    q, sf = quant.per_token_cast_to_fp8(x, use_ue8m0, gran_k)
    return q, _maybe_packed(sf, use_packed_ue8m0)


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [K, N] (K % gran_k == 0) -> (e4m3 [K, N], fp32 scales [K/gran_k, N]): one scale per
    gran_k rows of each column (the K-grouped GEMMs' operands)."""
    _check_2d(x, "per_channel_cast_to_fp8")
    if x.shape[0] % gran_k:
        raise ValueError(f"per_channel_cast_to_fp8: rows {x.shape[0]} must be a multiple of gran_k = {gran_k}")
    q, sf = quant.per_token_cast_to_fp8(x.t(), use_ue8m0, gran_k)
    return q.t().contiguous(), sf.t().contiguous()


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N/gran_k), ceil(K/gran_k)]) per gran_k x gran_k
    block; edge blocks are padded with zeros for their amax."""
    _check_2d(x, "per_block_cast_to_fp8")
    return quant.per_block_cast_to_fp8(x, use_ue8m0, gran_k)


def per_custom_dims_cast_to_fp8(x: torch.Tensor, dims: tuple, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per index of ``dims`` (amax over every other dimension): (e4m3 like x, scales
    with the other dimensions squeezed)."""
    others = tuple(d for d in range(x.dim()) if d not in set(dims))
    sf = x.abs().float().amax(dim=others, keepdim=True).clamp(min=AMAX_FLOOR) / FP8_MAX
    if use_ue8m0:
        sf = ceil_to_ue8m0(sf)
    return (x * (1.0 / sf)).to(torch.float8_e4m3fn), sf.squeeze()


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8) of x, already scaled: magnitude index = midpoints strictly below |x|."""
    mag = torch.bucketize(x.abs().float(), _FP4_MIDPOINTS.to(x.device), right=False).to(torch.uint8)
    sign = ((x < 0) & (mag != 0)).to(torch.uint8) << 3
    return mag | sign


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K even) -> (e2m1 packed int8 [M, K/2], fp32 scales [M, ceil(K/gran_k)] or, with
    use_packed_ue8m0, UE8M0 codes packed four to an int32, padded with 1.0)."""
    _check_2d(x, "per_token_cast_to_fp4")
    m, k = x.shape
    if k % 2:
        raise ValueError(f"per_token_cast_to_fp4: K = {k} must be even (two e2m1 codes per byte)")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("per_token_cast_to_fp4: use_packed_ue8m0 needs use_ue8m0")
    xp = torch.nn.functional.pad(x.float(), (0, -k % gran_k)).view(m, -1, gran_k)
    sf = xp.abs().amax(dim=2).clamp(min=AMAX_FLOOR) / FP4_MAX
    if use_ue8m0:
        sf = ceil_to_ue8m0(sf)
    codes = _e2m1_codes(xp * (1.0 / sf[:, :, None])).view(m, -1)[:, :k]
    return F.pack_fp4(codes).view(torch.int8), _maybe_packed(sf, use_packed_ue8m0)


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 [M, K/2] (M even) -> the transposed matrix packed the same way, [K, M/2]."""
    if a.dtype != torch.int8 or a.dim() != 2 or a.shape[0] % 2:
        raise ValueError(f"transpose_packed_fp4: expected int8 [M, K/2] with M even, got {a.dtype} {tuple(a.shape)}")
    return F.pack_fp4(F.unpack_fp4(a.view(torch.uint8)).t().contiguous()).view(torch.int8)


def cast_back_from_fp4(packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128,
                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Packed e2m1 [M, K/2] and its scales -> fp32 [M, K]."""
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
    values = F.decode(F.unpack_fp4(packed.view(torch.uint8)), "e2m1")
    return values * sf.repeat_interleave(gran_k, dim=-1)[:, :values.shape[-1]]


def calc_diff(x: torch.Tensor, y: torch.Tensor):
    """1 - 2<x,y> / (|x|^2 + |y|^2), in float64 (0.0 when both are all zero)."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return 1 - 2 * (x * y).sum() / denominator


def count_bytes(*tensors) -> int:
    """Bytes held by the tensors (nested tuples / lists walked, None skipped)."""
    return sum(count_bytes(*t) if isinstance(t, (tuple, list)) else t.numel() * t.element_size()
               for t in tensors if t is not None)
