"""DeepGEMM's test utilities (``deep_gemm.utils``) with DeepGEMM's definitions.

Casts produce OCP ``torch.float8_e4m3fn`` (max 448), the e4m3 format gfx950's MFMA reads.
Scales are fp32: ``amax.clamp(1e-4) / 448`` per 1x128 row block (per-token) or 128x128 block
(per-block), rounded up to a power of two with ``use_ue8m0``.
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0      # largest finite float8_e4m3fn
BLOCK = 128          # scale granularity along K (and along N for per-block scales)
AMAX_FLOOR = 1e-4    # all-zero blocks still get a finite, nonzero scale


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= |x| (elementwise): the value a UE8M0 scale can hold."""
    return torch.pow(2.0, torch.ceil(torch.log2(x.abs())))


def _scale(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(AMAX_FLOOR) / FP8_MAX
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K % 128 == 0) -> (e4m3 [M, K], fp32 scales [M, K/128]); x ~= fp8 * scale."""
    if x.dim() != 2 or x.size(1) % BLOCK:
        raise ValueError(f"per_token_cast_to_fp8: x must be 2-D with K % {BLOCK} == 0, got shape {tuple(x.shape)}")
    m, k = x.shape
    blocks = x.view(m, k // BLOCK, BLOCK)
    sf = _scale(blocks.abs().float().amax(dim=2), use_ue8m0)
    return (blocks * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, k), sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N/128), ceil(K/128)]) per 128x128 block;
    edge blocks are padded with zeros for their amax."""
    if x.dim() != 2:
        raise ValueError(f"per_block_cast_to_fp8: x must be 2-D, got shape {tuple(x.shape)}")
    n, k = x.shape
    padded = torch.zeros(align(n, BLOCK), align(k, BLOCK), dtype=x.dtype, device=x.device)
    padded[:n, :k] = x
    blocks = padded.view(padded.size(0) // BLOCK, BLOCK, padded.size(1) // BLOCK, BLOCK)
    sf = _scale(blocks.abs().float().amax(dim=(1, 3), keepdim=True), use_ue8m0)
    q = (blocks * (1.0 / sf)).to(torch.float8_e4m3fn).view_as(padded)
    return q[:n, :k].contiguous(), sf.view(blocks.size(0), blocks.size(2))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """1 - cosine-like similarity 2<x,y> / (|x|^2 + |y|^2), in float64 (0 when x == y)."""
    x, y = x.double(), y.double()
    return 1 - 2 * (x * y).sum() / (x * x + y * y).sum()
