"""Guards and the fallback shared by the MXFP8 ops (smallm_mxfp8_gemm, moe_mxfp8_grouped_gemm).

Formats (OCP MX-FP8): payload float8_e4m3fn (K contiguous), scales e8m0 as uint8 or
float8_e8m0fnu, one per 32 consecutive K (0xFF = NaN). Calls outside every kernel's envelope
(shape, a device no kernel runs on, a tensor over the 2 GB raw-buffer limit) run the fallback
(dequantise to fp32 + torch matmul on the tensors' device) unless ``fallback="error"``.

Fallback numerics: operands are dequantised to fp32 (exact unless a scaled element leaves the
fp32 range: below 2^-149 it flushes to 0) and multiplied with torch's fp32 matmul, so results
agree with the kernels to within the fp32-reordering bound, not bit for bit.
"""
from __future__ import annotations

import torch

from .. import guards
from ..quant import MX_BLOCK
from ._op import E8M0, Plan, kernel_plan

PAYLOAD = (torch.float8_e4m3fn,)
FALLBACK_MODES = ("auto", "error")


def check_mx_operand(x, x_scale, name, ndim, K=None):
    """x [..., K] (ndim dims) e4m3 with x_scale [..., K/32] e8m0, both contiguous; returns K."""
    guards.check_dtype(x, name, PAYLOAD)
    guards.check_dtype(x_scale, f"{name}_scale", E8M0)
    guards.check_shape(x, name, (None,) * (ndim - 1) + (K,))
    K = x.shape[-1]
    guards.check_multiple(K, "K", MX_BLOCK, "K%32")
    guards.check_shape(x_scale, f"{name}_scale", (*x.shape[:-1], K // MX_BLOCK))
    guards.check_contiguous(x, name)
    guards.check_contiguous(x_scale, f"{name}_scale")
    return K


def check_out(out, shape, dtypes):
    if out is not None:
        guards.check_dtype(out, "out", dtypes)
        guards.check_shape(out, "out", shape)
        guards.check_contiguous(out, "out")


def check_fallback_mode(fallback):
    if fallback not in FALLBACK_MODES:
        guards.fail("fallback", f"fallback must be one of {FALLBACK_MODES}; got {fallback!r}")


def envelope(fallback: str, op: str, rule: str, detail: str, out_shape, out_dtype) -> Plan:
    """Out of every kernel's envelope: the fallback plan, or GuardError when asked to."""
    if fallback == "error":
        guards.fail(rule, detail + ' (fallback="error")')
    return Plan(op, None, backend="fallback", reason=f"{rule}: {detail}",
                out_shape=out_shape, out_dtype=out_dtype)


def kernel_or_fallback(fallback, op, named, kernel, variant, device, reason, out_shape, out_dtype, **dims) -> Plan:
    """The kernel's plan, or the fallback when a tensor breaks the 2 GB rule or no backend
    runs the kernel on ``device`` (the two envelope rules shared by both ops)."""
    try:
        for n, t in named:
            if t is not None:
                guards.check_voffset(t, n)
            elif n == "out":
                guards.check_output_bytes(out_shape, out_dtype)
        return kernel_plan(op, kernel, variant, device, reason, out_shape, out_dtype, **dims)
    except guards.GuardError as e:
        return envelope(fallback, op, e.rule, e.detail, out_shape, out_dtype)


def dequant(x, x_scale):
    """[..., K] e4m3 + [..., K/32] e8m0 -> fp32 on x's device (0xFF -> NaN)."""
    e = x_scale.view(torch.uint8).to(torch.int32)
    s = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - 127)
    s = torch.where(e == 255, torch.full_like(s, float("nan")), s)
    K = x.shape[-1]
    return (x.float().reshape(*x.shape[:-1], K // MX_BLOCK, MX_BLOCK) * s[..., None]).reshape(x.shape)
