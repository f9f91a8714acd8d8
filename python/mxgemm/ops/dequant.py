"""mxfp8_dequantize: the sample op that proves the whole path (guards -> registry -> build ->
host extension -> Launcher -> emulator or GPU) in both kernel languages."""
from __future__ import annotations

import torch

from .. import build, guards, launcher
from ..dispatch import Plan, planner

_SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)
_KERNEL = {"hip": "mxfp8_dequant", "flydsl": "mxfp8_dequant_flydsl"}


@planner("mxfp8_dequantize")
def plan_mxfp8_dequantize(x, scale, *, out=None, language="hip") -> Plan:
    guards.check_dtype(x, "x", (torch.float8_e4m3fn, torch.uint8))
    guards.check_dtype(scale, "scale", _SCALE_DTYPES)
    if x.dim() != 2:
        guards.fail("shape", f"x must be 2-D [M, K]; got shape {list(x.shape)}")
    M, K = x.shape
    guards.check_multiple(K, "K", 32, "K%32")
    guards.check_shape(scale, "scale", (M, K // 32))
    if out is not None:
        guards.check_dtype(out, "out", torch.float32)
        guards.check_shape(out, "out", (M, K))
        guards.check_contiguous(out, "out")
    for n, t in (("x", x), ("scale", scale)):
        guards.check_contiguous(t, n)
    for n, t in (("x", x), ("scale", scale), ("out", out)):
        if t is not None:
            guards.check_voffset(t, n)
    guards.check_same_device(x=x, scale=scale, out=out)
    if language not in _KERNEL:
        guards.fail("language", f"language must be one of {sorted(_KERNEL)}; got {language!r}")
    backend = guards.check_arch(x)
    quads = M * K // 4
    return Plan("mxfp8_dequantize", _KERNEL[language], {}, backend, ((quads + 255) // 256, 1, 1),
                (256, 1, 1), reason=f"sample kernel in {language}, one thread per 4 elements")


def mxfp8_dequantize(x: torch.Tensor, scale: torch.Tensor, *, out: torch.Tensor | None = None,
                     language: str = "hip") -> torch.Tensor:
    """Decode MXFP8: out[m, k] = e4m3(x[m, k]) * 2^(scale[m, k // 32] - 127), fp32.

    x: [M, K] float8_e4m3fn (or its uint8 bits), K % 32 == 0.
    scale: [M, K // 32] e8m0 (uint8 or float8_e8m0fnu); 0xFF decodes to NaN.
    out: optional [M, K] float32. language: "hip" or "flydsl" (same op, same result).
    """
    plan = plan_mxfp8_dequantize(x, scale, out=out, language=language)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if x.numel():
        art = build.artifact(plan.kernel, plan.variant, "gfx950")
        launcher.launch(art, plan.grid, plan.block,
                        [x.view(torch.uint8), scale.view(torch.uint8), out, x.shape[0], x.shape[1]])
    return out
