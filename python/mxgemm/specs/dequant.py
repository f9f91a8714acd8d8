"""mxfp8_dequantize (ops/dequant.py): the sample op, one kernel in each language."""
from __future__ import annotations

import torch

from .base import BITWISE, Call, Case, Inputs, OpSpec, Smoke, Work, grid, waves

OP = "mxfp8_dequantize"
KERNELS = {"hip": "mxfp8_dequant", "flydsl": "mxfp8_dequant_flydsl"}
LANGUAGE = {k: lang for lang, k in KERNELS.items()}


def call(kernel, v, shape, inp: Inputs) -> Call:
    return Call(OP, inp.mx(shape["M"], shape["K"]), dict(language=LANGUAGE[kernel]))


def work(kernel, v, M, K) -> Work:
    g = grid(kernel, v, elements=M * K)
    return Work(0.0, M * K + M * K // 32 + 4 * M * K, "fp8", g, g[0], g[0] * waves(kernel, v), 1)


def race(kernel, v) -> list:
    """1152 elements: one full workgroup (4 per thread), one partial."""
    return [call(kernel, v, dict(M=9, K=128), Inputs())]


def decode(inp: Inputs) -> dict:
    return {OP: Call(OP, inp.mx(1, 4096))}


def smoke(device) -> list:
    """Every byte of x (NaN included, twice) and scales 2^-27 .. 2^22."""
    from ..formats import decode as decode_fmt
    from ..formats import decode_e8m0
    x = torch.arange(512).remainder(256).to(torch.uint8).view(8, 64)
    s = torch.arange(100, 116, dtype=torch.uint8).view(8, 2)
    ref = decode_fmt(x, "e4m3") * decode_e8m0(s).repeat_interleave(32, dim=1)
    return [Smoke(f"{OP}[{lang}] 8x64", Call(OP, (x.to(device), s.to(device)), dict(language=lang)), ref)
            for lang in KERNELS]


def preset_large():
    return [Case(k, {}, dict(M=8192, K=7168), "dequant 8192x7168", "not found", "-") for k in KERNELS.values()]


SPEC = OpSpec(
    name="dequant", ops=(OP,), kernels=tuple(KERNELS.values()), tests=("tests/test_mxfp8_dequantize.py",),
    reference=(), hardware_script="",
    contract=BITWISE, call=call, work=work, race=race, decode=decode, smoke=smoke, presets={"dequant": preset_large})
