"""mxgemm's tensorwise FP8 grouped GEMMs as a Primus-Turbo style kernel backend.

A Primus-Turbo-like dispatcher keeps, per op, a table of backend classes with two static
methods over one keyword set and asks each ``can_handle(**kw)`` before ``execute(**kw)``:

    a, b, a_scales, b_scales, group_lens, group_offs, trans_a, trans_b, out_dtype,
    granularity, num_cu  (+ trans_c for the variable-K op; other keys are ignored)

``GroupedGemmFP8Backend`` serves both of its grouped GEMM dispatchers:
  * b 3-D (M-grouped, trans_a=False): out[sum_m, N] = a_g @ b[g]^T (trans_b, forward NT) or
    a_g @ b[g] (dgrad NN)            -> mxgemm.grouped_gemm_fp8_kernel
  * b 2-D (variable K, trans_a=True, trans_b=False): out[g] = lhs_g^T @ rhs_g with (lhs, rhs) =
    (a, b), or (b, a) when trans_c  -> mxgemm.grouped_gemm_fp8_variable_k
``granularity`` must be tensorwise (an enum member named TENSORWISE, or that string in any
case): one fp32 dequantisation scale per tensor (value = fp8 * scale). Mixed e4m3 / e5m2
operands are taken where hybrid training's backward has them (see the ops). Everything else about the call (dtypes,
shapes, alignment,
device, arch) and about its data (group sizes against the rows) is decided by the ops' own
checks, which ``can_handle`` runs without launching: it is True exactly when ``execute`` runs
without a GuardError, and False (no exception) otherwise.
"""
from __future__ import annotations

from . import guards
from .ops import grouped_gemm_fp8_kernel, grouped_gemm_fp8_variable_k


def _call(a, b, a_scales, b_scales, group_lens, group_offs, trans_a, trans_b, out_dtype, granularity, num_cu,
          trans_c=False, **kwargs):
    """(op, positional args, keyword args) of the mxgemm op serving this call; GuardError
    [backend] for a granularity or layout no mxgemm op has."""
    b_dim = b.dim() if hasattr(b, "dim") else None
    if str(getattr(granularity, "name", granularity)).upper() != "TENSORWISE":
        guards.fail("backend", f"granularity {granularity}: mxgemm's FP8 grouped GEMMs take tensorwise scales only")
    if b_dim == 3 and not trans_a:
        return grouped_gemm_fp8_kernel, (a, a_scales, b, b_scales, group_lens, group_offs), \
            dict(trans_b=trans_b, out_dtype=out_dtype, num_cu=num_cu)
    if b_dim == 2 and trans_a and not trans_b:
        lhs, rhs = ((b, b_scales), (a, a_scales)) if trans_c else ((a, a_scales), (b, b_scales))
        return grouped_gemm_fp8_variable_k, (*lhs, *rhs, group_lens, group_offs), dict(out_dtype=out_dtype)
    guards.fail("backend", f"b.dim() = {b_dim}, trans_a = {trans_a}, trans_b = {trans_b}: mxgemm serves b 3-D with "
                           "trans_a=False (forward / dgrad) and b 2-D with trans_a=True, trans_b=False (wgrad)")


class GroupedGemmFP8Backend:
    """Primus-Turbo style backend: ``can_handle(**kw)`` / ``execute(**kw)`` (module docstring)."""

    @staticmethod
    def can_handle(**kw) -> bool:
        try:
            op, args, op_kw = _call(**kw)
            op.check(*args, **op_kw)
        except guards.GuardError:
            return False
        return True

    @staticmethod
    def execute(**kw):
        op, args, op_kw = _call(**kw)
        return op(*args, **op_kw)
