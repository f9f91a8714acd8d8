"""mxfp8_dequantize: the sample op that proves the whole path (guards -> registry -> build ->
launcher -> emulator or GPU) in both kernel languages."""
from __future__ import annotations

import torch

from .. import guards
from ..quant import MX_BLOCK
from ._op import E8M0, Plan, empty_plan, kernel_plan, op

_KERNEL = {"hip": "mxfp8_dequant", "flydsl": "mxfp8_dequant_flydsl"}


def _plan(c) -> Plan:
    guards.check_dtype(c.x, "x", (torch.float8_e4m3fn, torch.uint8))
    guards.check_dtype(c.scale, "scale", E8M0)
    if c.x.dim() != 2:
        guards.fail("shape", f"x must be 2-D [M, K]; got shape {list(c.x.shape)}")
    M, K = c.x.shape
    guards.check_multiple(K, "K", MX_BLOCK, "K%32")
    guards.check_shape(c.scale, "scale", (M, K // MX_BLOCK))
    if c.out is not None:
        guards.check_dtype(c.out, "out", torch.float32)
        guards.check_shape(c.out, "out", (M, K))
        guards.check_contiguous(c.out, "out")
    for n, t in (("x", c.x), ("scale", c.scale)):
        guards.check_contiguous(t, n)
    for n, t in (("x", c.x), ("scale", c.scale), ("out", c.out)):
        if t is not None:
            guards.check_voffset(t, n)
    if c.out is None:
        guards.check_output_bytes((M, K), torch.float32)
    device = guards.check_same_device(x=c.x, scale=c.scale, out=c.out)
    if c.language not in _KERNEL:
        guards.fail("language", f"language must be one of {sorted(_KERNEL)}; got {c.language!r}")
    shape = dict(out_shape=(M, K), out_dtype=torch.float32)
    if M * K == 0:
        return empty_plan("mxfp8_dequantize", "empty: nothing to launch", **shape)
    return kernel_plan("mxfp8_dequantize", _KERNEL[c.language], {}, device,
                       f"sample kernel in {c.language}, one thread per 4 elements", **shape, elements=M * K, M=M, K=K)


@op(plan=_plan, alloc=torch.empty, out_shape=lambda x: (tuple(x.x.shape), torch.float32))
def mxfp8_dequantize(x: torch.Tensor, scale: torch.Tensor, *, out: torch.Tensor | None = None,
                     language: str = "hip") -> torch.Tensor:
    """Decode MXFP8: out[m, k] = e4m3(x[m, k]) * 2^(scale[m, k // 32] - 127), fp32.

    x: [M, K] float8_e4m3fn (or its uint8 bits), K % 32 == 0.
    scale: [M, K // 32] e8m0 (uint8 or float8_e8m0fnu); 0xFF decodes to NaN.
    out: optional [M, K] float32. language: "hip" or "flydsl" (same op, same result).
    """
