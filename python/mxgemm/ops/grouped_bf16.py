"""grouped_gemm: the differentiable BF16 / FP16 MoE grouped GEMM (Primus-Turbo's ``turbo.ops.grouped_gemm``),
forward, dgrad and wgrad on the BF16 (FP16) variants of the grouped GEMM kernel family
(grouped_gemm_bf16_kernel, grouped_gemm_bf16_variable_k in ops/train_grouped_gemm.py)."""
from __future__ import annotations

import torch

from .. import guards
from .train_grouped_gemm import fused_main_grad, group_offsets, grouped_gemm_bf16_kernel, grouped_gemm_bf16_variable_k

SCHEDULES = ("static", "dynamic")
FORMATS = {torch.bfloat16: "bf16", torch.float16: "f16"}   # operand dtype -> the kernel's FMT


class _Bf16GroupedGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b, num_cu, validate, main_grad):
        ctx.save_for_backward(a, b, group_lens, group_offs)
        ctx.trans_b, ctx.num_cu, ctx.main_grad = trans_b, num_cu, main_grad
        return grouped_gemm_bf16_kernel(a, b, group_lens, group_offs, trans_b=trans_b, num_cu=num_cu,
                                        validate=validate)

    @staticmethod
    def backward(ctx, grad_out):
        a, b, lens, offs = ctx.saved_tensors
        go = grad_out.contiguous()
        # the groups were checked (or vouched for) by the forward
        grad_a = grouped_gemm_bf16_kernel(go, b, lens, offs, trans_b=not ctx.trans_b, num_cu=ctx.num_cu,
                                          validate=False)
        lhs, rhs = (go, a) if ctx.trans_b else (a, go)
        if ctx.main_grad is None:
            grad_b = grouped_gemm_bf16_variable_k(lhs, rhs, lens, offs, validate=False)
        else:   # main_grad += the wgrad in the kernel's epilogue; b's gradient is a zero stand-in (no allocation)
            grouped_gemm_bf16_variable_k(lhs, rhs, lens, offs, out_dtype=ctx.main_grad.dtype, out=ctx.main_grad,
                                         accumulate=True, validate=False)
            grad_b = torch.zeros((), dtype=b.dtype, device=b.device).expand(b.shape)
        return grad_a, grad_b, *(None,) * 6


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor, group_offs: torch.Tensor | None = None,
                 trans_b: bool = False, num_cu: int | None = None, schedule: str = "static",
                 fuse_bgrad_accum_pattern: str | None = None, *, validate: bool = True) -> torch.Tensor:
    """Differentiable BF16 / FP16 MoE grouped GEMM, Primus-Turbo's signature, argument order and defaults:
    out[r] = a[r] . B_g for the rows r of group g (group_offs[g] <= r < group_offs[g + 1]), with
    B_g = b[g] (b [G, K, N], the default) or b[g]^T (trans_b: b [G, N, K]).

    a: [sum_m, K] torch.bfloat16 or torch.float16 (rows past sum(group_lens): a padded tail, out
    rows 0 and grad_a rows 0); b: a's dtype, contiguous; group_lens int64 [G]; group_offs int64
    [G + 1] (computed when None). Returns out [sum_m, N] in a's dtype, as Primus-Turbo: fp32
    accumulation on the BF16 (FP16) MFMA, one rounding (grouped_gemm_bf16_kernel; fp16: inf past
    65504, as a hardware fp16 store). The backward runs the dgrad (the other b layout) and the
    variable-K wgrad, both in a's dtype. K % 16 == 0, N % 16 == 0.
    num_cu caps the persistent grid. schedule: "static" or "dynamic" (Primus-Turbo's tile
    scheduling choice; the kernel here has one fixed, on-device tile order, so both run it).
    fuse_bgrad_accum_pattern="megatron": the wgrad is added into b.main_grad (b's shape; fp32, or
    bf16 for bf16 operands) in the kernel's epilogue, b's autograd gradient is a zero stand-in and
    b.grad_added_to_main_grad is set (as in grouped_gemm_fp8)."""
    if schedule not in SCHEDULES:
        guards.fail("schedule", f"schedule = {schedule!r}; expected one of {', '.join(map(repr, SCHEDULES))}")
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype not in FORMATS:
            guards.fail("dtype", f"{name} is {getattr(t, 'dtype', type(t).__name__)}; grouped_gemm runs torch.bfloat16 "
                                 "or torch.float16 operands (the BF16 / FP16 MFMA kernels)")
    if a.dtype != b.dtype:
        guards.fail("dtype", f"a is {a.dtype} and b {b.dtype}: grouped_gemm takes both operands in one dtype")
    if group_offs is None:
        group_offs = group_offsets(group_lens)
    main_grad = fused_main_grad(b, fuse_bgrad_accum_pattern, FORMATS[b.dtype], FORMATS[b.dtype])
    out = _Bf16GroupedGemm.apply(a, b, group_lens, group_offs, trans_b, num_cu, validate, main_grad)
    if main_grad is not None:
        b.grad_added_to_main_grad = True
    return out
