"""DeepGEMM's hard-coded Einstein sums and its cuBLASLt GEMMs, on mxgemm's grouped GEMMs.

``einsum`` (bf16): "bmk,bnk->mn" is one GEMM contracting over (b, k): both operands are copied
with b next to k ([m, s * k]) and run as ``bf16_gemm_nt`` (fp32 accumulation, one rounding to a
bf16 d, or accumulated into an fp32 d that must be c, as DeepGEMM requires). "bhr,hdr->bhd" and
"bhd,hdr->bhr" are one masked M-grouped BF16 GEMM with a group per head (a copied head-major, a
weight whose contraction is not contiguous copied K-major, the result copied into d's [b, h, .]
layout). ``use_cublaslt`` selects NVIDIA's library inside DeepGEMM; there is none here, so it
runs the same kernel. ``fp8_einsum`` (1 x 128 activation, 128 x 128 weight scales): "bhr,hdr->bhd"
and "bhd,hdr->bhr" as the masked M-grouped FP8 GEMM, the same copies; "bhd,bhr->hdr" (the
per-head weight gradient, contracting b; DeepGEMM's SM100 form) as the K-grouped FP8 GEMM with a
K group per head (a and b copied head-major). ``cublaslt_gemm_nt`` / ``nn`` / ``tn`` / ``tt`` (DeepGEMM's
cuBLASLt baseline, fp32 accumulation) are the BF16 dense GEMMs, or for e4m3 operands the same
dense GEMM with tensor scales of 1."""
from __future__ import annotations

import torch

from .. import guards
from .gemm import bf16_gemm_nt, k_grouped_fp8_gemm_tn_contiguous, pair, unscaled_fp8_gemm_nt
from .grouped import m_grouped_bf16_gemm_nt_masked, m_grouped_fp8_gemm_nt_masked

EXPRS = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr")
FP8_EXPRS = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")


def _check_3d(t, name, dtype):
    if not isinstance(t, torch.Tensor) or t.dim() != 3:
        guards.fail("shape", f"{name} must be a 3-D tensor; got {getattr(t, 'shape', type(t).__name__)}")
    guards.check_dtype(t, name, dtype)


def _per_head(expr, x, w, d):
    """(a [h, b, K] head-major, weight [h, N, K] K-major, out [h, b, N]) of a per-head expression,
    shapes checked against d [b, h, N]."""
    bsz, h, k = x.shape
    if expr == "bhd,hdr->bhr":                  # weight [h, d, r]: contraction d, copied K-major
        w = w.transpose(1, 2)
    if w.shape[0] != h or w.shape[2] != k or tuple(d.shape) != (bsz, h, w.shape[1]):
        guards.fail("shape", f"einsum {expr!r}: a {list(x.shape)}, b {list(w.shape)} and d {list(d.shape)} "
                             "do not agree")
    return x.transpose(0, 1).contiguous(), w.contiguous(), d.new_empty(h, bsz, w.shape[1])


def einsum(expr: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
           use_cublaslt: bool = False) -> None:
    """d = einsum(expr, a, b) (+ c) in bf16 with fp32 accumulation, written in place.
    "bmk,bnk->mn": a [s, m, k], b [s, n, k], d bf16 [m, n] (no c) or fp32 [m, n] with c = d.
    "bhr,hdr->bhd": a [b, h, r], b [h, d, r], d bf16 [b, h, d]; "bhd,hdr->bhr": a [b, h, d],
    b [h, d, r], d bf16 [b, h, r]; no c for these two."""
    if expr not in EXPRS:
        guards.fail("expr", f"einsum expression {expr!r} is not one of DeepGEMM's {list(EXPRS)}")
    _check_3d(a, "a", torch.bfloat16)
    _check_3d(b, "b", torch.bfloat16)
    if expr == "bmk,bnk->mn":
        if use_cublaslt:
            guards.fail("use_cublaslt", "use_cublaslt with 'bmk,bnk->mn' (DeepGEMM has no library path for it)")
        if d.dtype == torch.float32 and c is not d:
            guards.fail("c", "an fp32 d of 'bmk,bnk->mn' is accumulated: c must be d itself (as in DeepGEMM)")
        if d.dtype != torch.float32 and c is not None:
            guards.fail("c", "a bf16 d of 'bmk,bnk->mn' takes no c (as in DeepGEMM)")
        s, m, k = a.shape
        if b.shape[0] != s or b.shape[2] != k:
            guards.fail("shape", f"einsum {expr!r}: a {list(a.shape)} and b {list(b.shape)} do not agree")
        flat = lambda t: t.transpose(0, 1).reshape(t.shape[1], s * k)  # noqa: E731  (a copy: b beside k)
        bf16_gemm_nt(flat(a), flat(b), d, c)
        return
    if c is not None:
        guards.fail("c", f"einsum {expr!r} takes no c (as in DeepGEMM)")
    guards.check_dtype(d, "d", torch.bfloat16)
    x, w, out = _per_head(expr, a, b, d)
    masked = torch.full((x.shape[0],), x.shape[1], dtype=torch.int32, device=x.device)
    m_grouped_bf16_gemm_nt_masked(x, w, out, masked, x.shape[1])
    d.copy_(out.transpose(0, 1))


def fp8_einsum(expr: str, a, b, d: torch.Tensor, c: torch.Tensor | None = None, recipe=(1, 128, 128)) -> None:
    """d = einsum(expr, a, b) with block scales, written in place. "bhr,hdr->bhd": a = (e4m3
    [b, h, r], sfa fp32 [b, h, ceil(r/128)]), b = (e4m3 [h, d, r], sfb fp32 [h, ceil(d/128),
    ceil(r/128)]), d bf16 [b, h, d]. "bhd,hdr->bhr": a = (e4m3 [b, h, d], sfa [b, h, ceil(d/128)]),
    b = (e4m3 [h, d, r], sfb [h, ceil(d/128), ceil(r/128)]), d bf16 [b, h, r]. No c for these two.
    "bhd,bhr->hdr": a = (e4m3 [b, h, d], sfa fp32 [ceil(b/128), h, d]), b = (e4m3 [b, h, r], sfb
    [ceil(b/128), h, r]) (per-channel scales per 128 rows of b), d fp32 [h, d, r], c fp32 like d
    (may be d), recipe (1, 1, 128)."""
    if expr not in FP8_EXPRS:
        guards.fail("expr", f"fp8_einsum expression {expr!r} is not one of {list(FP8_EXPRS)}")
    if expr == "bhd,bhr->hdr":
        _per_head_wgrad(a, b, d, c, recipe)
        return
    if c is not None:
        guards.fail("c", "fp8_einsum here takes no c (the masked FP8 kernel has no accumulating epilogue)")
    (x, sfa), (w, sfb) = pair(a, "a"), pair(b, "b")
    _check_3d(x, "a", torch.float8_e4m3fn)
    _check_3d(w, "b", torch.float8_e4m3fn)
    guards.check_dtype(d, "d", torch.bfloat16)
    xh, wk, out = _per_head(expr, x, w, d)
    sfw = sfb.transpose(1, 2) if expr == "bhd,hdr->bhr" else sfb
    masked = torch.full((xh.shape[0],), xh.shape[1], dtype=torch.int32, device=x.device)
    m_grouped_fp8_gemm_nt_masked((xh, sfa.transpose(0, 1).contiguous()), (wk, sfw.contiguous()), out, masked,
                                 xh.shape[1], recipe)
    d.copy_(out.transpose(0, 1))


def _per_head_wgrad(a, b, d, c, recipe) -> None:
    """fp8_einsum 'bhd,bhr->hdr': the K-grouped GEMM, K group h = head h's b rows."""
    (x, sfa), (y, sfb) = pair(a, "a"), pair(b, "b")
    _check_3d(x, "a", torch.float8_e4m3fn)
    _check_3d(y, "b", torch.float8_e4m3fn)
    bsz, h, _ = x.shape
    if y.shape[:2] != (bsz, h) or tuple(d.shape) != (h, x.shape[2], y.shape[2]):
        guards.fail("shape", f"fp8_einsum 'bhd,bhr->hdr': a {list(x.shape)}, b {list(y.shape)} and d "
                             f"{list(d.shape)} do not agree")
    heads = lambda t: t.transpose(0, 1).reshape(-1, t.shape[2])  # noqa: E731  (a copy, head-major)
    ks = [bsz] * h
    k_grouped_fp8_gemm_tn_contiguous((heads(x), heads(sfa)), (heads(y), heads(sfb)), d, ks,
                                     torch.tensor(ks, dtype=torch.int32, device=x.device), c=c, recipe=recipe)


def cublaslt_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """DeepGEMM's cuBLASLt baseline d[M, N] = a[M, K] . b[N, K]^T (+ c), fp32 accumulation: bf16
    a and b (bf16_gemm_nt), or e4m3 a and b without scales; d bf16 or fp32, c like d."""
    if isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn:
        unscaled_fp8_gemm_nt(a, b, d, c)
    else:
        bf16_gemm_nt(a, b, d, c)


def cublaslt_gemm_nn(a, b, d, c=None) -> None:
    """cublaslt_gemm_nt with b [K, N]."""
    cublaslt_gemm_nt(a, b.t(), d, c)


def cublaslt_gemm_tn(a, b, d, c=None) -> None:
    """cublaslt_gemm_nt with a [K, M] and b [K, N]."""
    cublaslt_gemm_nt(a.t(), b.t(), d, c)


def cublaslt_gemm_tt(a, b, d, c=None) -> None:
    """cublaslt_gemm_nt with a [K, M]."""
    cublaslt_gemm_nt(a.t(), b, d, c)
