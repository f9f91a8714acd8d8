"""mxgemm's FP8, MXFP4 and BF16 grouped GEMMs as Primus-Turbo style kernel backends.

A Primus-Turbo-like dispatcher keeps, per op, a table of backend classes with two static
methods over one keyword set and asks each ``can_handle(**kw)`` before ``execute(**kw)``:

    a, b, a_scales, b_scales, group_lens, group_offs, trans_a, trans_b, out_dtype,
    granularity, num_cu  (+ trans_c for the variable-K op, out, inplace_add_to_out; other keys
    are ignored)

``GroupedGemmFP8Backend`` serves both of its grouped GEMM dispatchers:
  * b 3-D (M-grouped, trans_a=False): out[sum_m, N] = a_g @ b[g]^T (trans_b, forward NT) or
    a_g @ b[g] (dgrad NN)            -> mxgemm.grouped_gemm_fp8_kernel
  * b 2-D (variable K, trans_b=False): out[g] = lhs_g^T @ rhs_g with (lhs, rhs) = (a, b), or
    (b, a) when trans_c, a [sum_k, M] and b [sum_k, N] (trans_a=True), or contraction-contiguous
    [M, sum_k] and [N, sum_k] (trans_a=False, Primus-Turbo's MX wgrad; copied per call)
                                     -> mxgemm.grouped_gemm_fp8_variable_k
``out``: written and returned. ``inplace_add_to_out=True`` (Megatron's fused weight-gradient
accumulation, out = main_grad): out += the wgrad in the kernel's epilogue, in out's dtype (fp32
or bf16); the forward / dgrad have no accumulation and refuse it.

``granularity`` (an enum member or its name, any case) and the scales' layouts as Primus-Turbo's
quantisers make them (fp32 dequantisation scales, value = fp8 * scale), read in place as views:

  granularity  M-grouped (a [M, K], b [G, N, K] / NN [G, K, N])      variable K (lhs [sum_k, M], rhs [sum_k, N])
  TENSORWISE   one value each                                         one value each
  ROWWISE      a_scales [M, 1]; b_scales [G, N, 1] / NN [G, 1, N]     [1, M] and [1, N] (one per out row / column)
  BLOCKWISE    a_scales [ceil(K/128), M] (its row scales stored       [ceil(sum_k/128), M] and [ceil(sum_k/128), N];
               transposed); b_scales per 128x128 block of b's own     groups start on multiples of 128 (its
               layout: [G, N/128, K/128] / NN [G, K/128, N/128]       segment-padded column quantiser)
  MX_BLOCKWISE a_scales [M, K/32], b_scales [G, N, K/32]            [M, sum_k/32] and [N, sum_k/32] (e8m0 bytes)
               (e8m0 bytes; forward and dgrad NT only). a's groups   with lhs [M, sum_k] and rhs [N, sum_k]
               are read at group_offs (Primus-Turbo pads them),      (contraction-contiguous, as its MX
               out's are written at group_offs_out (default:         quantiser stores them), copied to the
               group_offs): a and a_scales are gathered to out's     op's [sum_k, M] / [sum_k, N] per call;
               rows per call (one copy)                              groups start on multiples of 32

``GroupedGemmFP4Backend`` serves Primus-Turbo's MXFP4 dispatchers (granularity MX_BLOCKWISE;
packed e2m1 operands, uint8 or float4_e2m1fn_x2, e8m0 scales per 32 contraction elements):
  * b 3-D, trans_a=False, trans_b=True: a [M, K/2], b [G, N, K/2], a_scales [M, K/32], b_scales
    [G, N, K/32]; a's groups read at group_offs, out's rows written at group_offs_out (default:
    group_offs; Primus-Turbo's row-wise FP4 layout is tight, so they are equal)
                                     -> mxgemm.grouped_gemm_fp4_kernel
  * b 2-D, trans_a=trans_b=False: out[g] = lhs_g rhs_g^T over the group's contraction, (lhs, rhs)
    = (a, b), or (b, a) when trans_c, both contraction-contiguous [*, sum_k/2] as its column
    quantiser stores them (read in place), scales [*, sum_k/32], groups on multiples of 32
                                     -> mxgemm.grouped_gemm_fp4_variable_k
  with ``out`` and ``inplace_add_to_out`` as above (accumulation in out's dtype: bf16, fp16, fp32).

``GroupedGemmBackend`` serves the BF16 dispatchers the same way (keywords a, b, group_lens,
group_offs, trans_a, trans_b, num_cu, schedule (+ trans_c, out, inplace_add_to_out)):
grouped_gemm_bf16_kernel (b 3-D) and grouped_gemm_bf16_variable_k (b 2-D), bf16 out, or out's
dtype (fp32 or bf16) when accumulating.

Mixed e4m3 / e5m2 operands are taken where hybrid training's backward
has them (see the ops). Everything else about the call (dtypes, shapes, alignment, device,
arch) and about its data (group sizes against the rows) is decided by the ops' own checks,
which ``can_handle`` runs without launching: it is True exactly when ``execute`` runs without a
GuardError, and False (no exception) otherwise.
"""
from __future__ import annotations

import torch

from . import guards
from .ops import (
    grouped_gemm_bf16_kernel,
    grouped_gemm_bf16_variable_k,
    grouped_gemm_fp4_kernel,
    grouped_gemm_fp4_variable_k,
    grouped_gemm_fp8_kernel,
    grouped_gemm_fp8_variable_k,
)

_GRANULARITY = {"TENSORWISE": "tensor", "ROWWISE": "row", "BLOCKWISE": "block", "MX_BLOCKWISE": "mx"}   # -> the ops'


def _squeeze(s, dim, name):
    """A row-wise scale without its quantised (size-1) axis."""
    if s.dim() <= dim or s.shape[dim] != 1:
        guards.fail("shape", f"{name} is {list(s.shape)}: ROWWISE scales have size 1 along the quantised axis "
                             f"(dim {dim})")
    return s.squeeze(dim)


def _block_view(s, dims, name):
    if s.dim() != len(dims):
        guards.fail("shape", f"{name} is {list(s.shape)}: BLOCKWISE scales here are {len(dims)}-D")
    return s.permute(dims)


def _m_grouped_scales(gran, a_scales, b_scales, trans_b):
    """The M-grouped op's a_scale [M] / [M, kb] and b_scale [G, N] / [G, nb, kb] views."""
    if gran == "row":
        return _squeeze(a_scales, 1, "a_scales"), _squeeze(b_scales, 2 if trans_b else 1, "b_scales")
    if gran == "block":
        return _block_view(a_scales, (1, 0), "a_scales"), _block_view(b_scales, (0, 1, 2) if trans_b else (0, 2, 1),
                                                                      "b_scales")
    return a_scales, b_scales


def _call(a, b, a_scales, b_scales, group_lens, group_offs, trans_a, trans_b, out_dtype, granularity, num_cu,
          trans_c=False, out=None, inplace_add_to_out=False, **kwargs):
    """(op, positional args, keyword args) of the mxgemm FP8 op serving this call; GuardError
    [backend] for a granularity or layout no mxgemm op has."""
    gran = _GRANULARITY.get(str(getattr(granularity, "name", granularity)).upper())
    if gran is None:
        guards.fail("backend", f"granularity {granularity}: mxgemm's FP8 grouped GEMMs take "
                               f"{', '.join(_GRANULARITY)} scales")
    if _m_grouped(b, trans_a, trans_b, inplace_add_to_out):
        sa, sb = _m_grouped_scales(gran, a_scales, b_scales, trans_b)
        op, offs = grouped_gemm_fp8_kernel, group_offs
        if gran == "mx":
            if not trans_b:
                guards.fail("backend", "MX_BLOCKWISE with trans_b=False: mxgemm's MX grouped GEMM is NT, as "
                                       "Primus-Turbo's (its dgrad passes b quantised along N, trans_b=True)")
            op, offs = _read_at(op, group_offs, kwargs.get("group_offs_out"))
        return op, (a, sa, b, sb, group_lens, offs), \
            dict(trans_b=trans_b, out_dtype=out_dtype, num_cu=num_cu, out=out, granularity=gran)
    if gran == "row":
        a_scales, b_scales = _squeeze(a_scales, 0, "a_scales"), _squeeze(b_scales, 0, "b_scales")
    a, b = _contraction_major(a, b, trans_a)
    lhs, rhs = ((b, b_scales), (a, a_scales)) if trans_c else ((a, a_scales), (b, b_scales))
    return grouped_gemm_fp8_variable_k, (*lhs, *rhs, group_lens, group_offs), \
        dict(granularity=gran, **_wgrad_out(out_dtype, out, inplace_add_to_out))


class _ReadAt:
    """An M-grouped MX op (grouped_gemm_fp8_kernel, grouped_gemm_fp4_kernel) with a's groups read
    at other rows (``read_offs``, Primus-Turbo's padded MX layout) than out's: a and a_scale
    gathered to out's rows, then the op. The check needs no gather (same shapes)."""

    def __init__(self, op, read_offs):
        self.op, self.read_offs = op, read_offs

    def check(self, *args, **kw):
        self.op.check(*args, **kw)

    def __call__(self, a, sa, b, sb, group_lens, group_offs_out, **kw):
        src = _source_rows(self.read_offs.to(a.device), group_offs_out.to(a.device), a.shape[0])
        return self.op(_gather(a, src), _gather(sa, src), b, sb, group_lens, group_offs_out, **kw)


def _read_at(op, group_offs, group_offs_out):
    """(op, out's group offsets) of an M-grouped MX call: op itself when out's rows are a's
    (group_offs_out None), else op reading a's groups at group_offs (_ReadAt)."""
    return (op, group_offs) if group_offs_out is None else (_ReadAt(op, group_offs), group_offs_out)


def _gather(t, rows):
    """t's rows ``rows``; one-byte dtypes through a uint8 view (torch indexes no float4_e2m1fn_x2)."""
    return t.view(torch.uint8)[rows].view(t.dtype) if t.element_size() == 1 else t[rows]


def _call_fp4(a, b, a_scales, b_scales, group_lens, group_offs, trans_a, trans_b, out_dtype, granularity, num_cu,
              trans_c=False, out=None, inplace_add_to_out=False, **kwargs):
    """(op, positional args, keyword args) of the mxgemm MXFP4 op serving this call (module docstring)."""
    if _GRANULARITY.get(str(getattr(granularity, "name", granularity)).upper()) != "mx":
        guards.fail("backend", f"granularity {granularity}: mxgemm's MXFP4 grouped GEMMs take MX_BLOCKWISE scales")
    if _m_grouped(b, trans_a, trans_b, inplace_add_to_out):
        if not trans_b:
            guards.fail("backend", "MXFP4 with trans_b=False: mxgemm's MXFP4 grouped GEMM is NT, as Primus-Turbo's")
        op, offs = _read_at(grouped_gemm_fp4_kernel, group_offs, kwargs.get("group_offs_out"))
        return op, (a, a_scales, b, b_scales, group_lens, offs), dict(out_dtype=out_dtype, num_cu=num_cu, out=out)
    if trans_a:
        guards.fail("backend", "MXFP4 variable-K with trans_a=True: its operands are contraction-contiguous "
                               "[*, sum_k/2] (trans_a=False), as Primus-Turbo's column quantiser stores them")
    lhs, rhs = ((b, b_scales), (a, a_scales)) if trans_c else ((a, a_scales), (b, b_scales))
    return grouped_gemm_fp4_variable_k, (*lhs, *rhs, group_lens, group_offs), \
        _wgrad_out(out_dtype, out, inplace_add_to_out)


def _source_rows(read_offs, out_offs, rows):
    """Row r of out's group g comes from a's row read_offs[g] + r - out_offs[g]; rows past the
    last group (the op ignores them) from themselves. No host sync."""
    r = torch.arange(rows, device=out_offs.device)
    g = torch.searchsorted(out_offs[1:], r, right=True).clamp(max=max(out_offs.numel() - 2, 0))
    inside = r < out_offs[-1]
    return torch.where(inside, r - out_offs[g] + read_offs[g], r).clamp(max=rows - 1)


def _call_bf16(a, b, group_lens, group_offs, trans_a, trans_b, num_cu, trans_c=False, out=None,
               inplace_add_to_out=False, **kwargs):
    """(op, positional args, keyword args) of the mxgemm BF16 op serving this call (fp16 operands too:
    out in their dtype, as Primus-Turbo's backends)."""
    if _m_grouped(b, trans_a, trans_b, inplace_add_to_out):
        return grouped_gemm_bf16_kernel, (a, b, group_lens, group_offs), dict(trans_b=trans_b, num_cu=num_cu, out=out)
    a, b = _contraction_major(a, b, trans_a)
    lhs, rhs = (b, a) if trans_c else (a, b)
    return grouped_gemm_bf16_variable_k, (lhs, rhs, group_lens, group_offs), \
        _wgrad_out(None, out, inplace_add_to_out)


def _contraction_major(a, b, trans_a):
    """The variable-K operands as the ops take them, [sum_k, M] and [sum_k, N]: as given
    (trans_a=True), or copied from the contraction-contiguous [M, sum_k] / [N, sum_k] that
    Primus-Turbo's MX quantiser stores (trans_a=False)."""
    return (a, b) if trans_a else (a.t().contiguous(), b.t().contiguous())


def _m_grouped(b, trans_a, trans_b, inplace_add_to_out) -> bool:
    """True for the M-grouped op (b 3-D), False for the variable-K wgrad (b 2-D); GuardError for
    a layout neither has."""
    b_dim = b.dim() if hasattr(b, "dim") else None
    if b_dim == 3 and not trans_a:
        if inplace_add_to_out:
            guards.fail("backend", "inplace_add_to_out: mxgemm accumulates into out in the variable-K wgrad only "
                                   "(b 2-D, trans_a=True), not in the forward / dgrad")
        return True
    if b_dim == 2 and not trans_b:
        return False
    guards.fail("backend", f"b.dim() = {b_dim}, trans_a = {trans_a}, trans_b = {trans_b}: mxgemm serves b 3-D with "
                           "trans_a=False (forward / dgrad) and b 2-D with trans_b=False (wgrad)")


def _wgrad_out(out_dtype, out, inplace_add_to_out) -> dict:
    """The wgrad's out keywords: accumulation is in out's dtype, as Primus-Turbo's backends do."""
    if inplace_add_to_out:
        if out is None:
            guards.fail("backend", "inplace_add_to_out=True needs out (the main_grad to accumulate into)")
        out_dtype = out.dtype
    return dict(out_dtype=out_dtype, out=out, accumulate=bool(inplace_add_to_out))


class _Backend:
    """Primus-Turbo style backend: ``can_handle(**kw)`` / ``execute(**kw)`` (module docstring)."""

    @classmethod
    def can_handle(cls, **kw) -> bool:
        try:
            op, args, op_kw = cls.route(**kw)
            op.check(*args, **op_kw)
        except guards.GuardError:
            return False
        return True

    @classmethod
    def execute(cls, **kw):
        op, args, op_kw = cls.route(**kw)
        return op(*args, **op_kw)


class GroupedGemmFP8Backend(_Backend):
    route = staticmethod(_call)


class GroupedGemmFP4Backend(_Backend):
    route = staticmethod(_call_fp4)


class GroupedGemmBackend(_Backend):
    route = staticmethod(_call_bf16)
