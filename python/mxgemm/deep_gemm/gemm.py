"""DeepGEMM's dense and K-grouped FP8 and BF16 GEMMs on mxgemm's grouped GEMM family
(``mxgemm.grouped_gemm_fp8_kernel`` / ``grouped_gemm_fp8_variable_k`` with block scales;
``grouped_gemm_bf16_kernel`` / ``grouped_gemm_bf16_variable_k`` for BF16, the same layouts).

A dense GEMM is a grouped GEMM with one group: d[M, N] = a[M, K] . b[N, K]^T, each operand
K-major or MN-major (told from its strides, as DeepGEMM does), 1x128 scales for a and 128x128
(recipe (1, 128, 128)) or 1x128 (recipe (1, 1, 128)) scales for b, promoted exactly per 128-K
block in fp32. Operand majorness picks the kernel layout, so no operand is copied:

  a        b        kernel layout
  K-major  K-major  NT (grouped_gemm_fp8_kernel, G = 1)
  K-major  MN-major NN
  MN-major K-major  TT
  MN-major MN-major TN (grouped_gemm_fp8_variable_k, one group of K rows, out [1, M, N])

``c`` (fp32, like d): d = a b^T + c in the kernel's epilogue (one rounding); ``c`` may be ``d``
itself, otherwise it is copied into d first (as DeepGEMM does). UE8M0 scales packed four to an
int32 are unpacked to their fp32 powers of two (exact); gran_k must be 128 (DeepGEMM's gran_k
32 is its SM100 FP4 path). ``set_num_sms`` caps the persistent grid. ``compiled_dims`` and
``disable_ue8m0_cast`` change nothing here (fp32 scales are never cast).

The K-grouped wgrad ``k_grouped_fp8_gemm_tn_contiguous``: a [sum_k, M], b [sum_k, N] (MN-major),
per-channel scales [sum_k / 128, M | N], d [G, M, N] fp32 += the per-group products.
``k_grouped_fp8_gemm_nt_contiguous`` (K-major groups, DeepGEMM's SM90 form: group g's a is an
M x k_g K-major block at offset M * sum(k before g)) transposes each group's operands into the
MN-major form first: a copy of a and b per call.
"""
from __future__ import annotations

import torch

from .. import formats as F
from .. import guards, quant
from ..ops.train_grouped_gemm import (
    grouped_gemm_bf16_kernel,
    grouped_gemm_bf16_variable_k,
    grouped_gemm_fp8_kernel,
    grouped_gemm_fp8_variable_k,
)
from .layout import get_mk_alignment_for_contiguous_layout, psum_group_starts, ue8m0_codes, unpack_ue8m0_from_int
from .runtime import get_num_sms

GRAN_K = 128
MX_GRAN_K = 32          # DeepGEMM's SM100 K-grouped recipe (1, 1, 32): UE8M0 scales on the scaled MFMA


def pair(x, name: str):
    """DeepGEMM's (tensor, scales) argument, checked."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        guards.fail("args", f"{name} must be a (tensor, scales) pair as in DeepGEMM; got {type(x).__name__}")
    return x


def layout_tensor(t, name: str):
    """A grouped-layout argument (m_indices, masked_m, grouped_layout): a tensor, checked."""
    if not isinstance(t, torch.Tensor):
        guards.fail("type", f"{name} must be an int32 torch.Tensor; got {type(t).__name__}")
    return t


def _k_major(t: torch.Tensor, name: str) -> bool:
    """DeepGEMM's majorness rule: K-major when the last (K) dim has unit stride, else MN-major
    (unit stride along the dim before)."""
    if t.dim() != 2 or not (t.stride(-1) == 1 or t.stride(-2) == 1):
        guards.fail("layout", f"{name} must be a 2-D matrix with unit stride along K or MN; got shape "
                              f"{list(t.shape)}, strides {t.stride()}")
    return t.stride(-1) == 1


def _fp32_scales(sf: torch.Tensor, name: str) -> torch.Tensor:
    """fp32 scales, or packed UE8M0 int32 scales unpacked to their fp32 powers of two."""
    if sf.dtype == torch.int32:
        return unpack_ue8m0_from_int(sf)
    guards.check_dtype(sf, name, (torch.float32, torch.int32))
    return sf


def _check_recipe(recipe, recipe_a, recipe_b, sfb_rows: int, n: int) -> None:
    """The block-scale recipe must be mxgemm's (1x128 a; 128x128 or 1x128 b) and fit sfb."""
    if recipe is None and recipe_a is None and recipe_b is None:
        return
    if recipe is not None:
        if recipe_a is not None or recipe_b is not None:
            guards.fail("recipe", "pass either recipe or recipe_a + recipe_b, as DeepGEMM")
        gran_m, gran_n, gran_k = recipe
        gran_k_b = gran_k
    else:
        if recipe_a is None or recipe_b is None:
            guards.fail("recipe", f"recipe_a {recipe_a} and recipe_b {recipe_b}: give both, as DeepGEMM")
        (gran_m, gran_k), (gran_n, gran_k_b) = recipe_a, recipe_b
    if gran_m != 1 or gran_n not in (1, GRAN_K) or gran_k != GRAN_K or gran_k_b != GRAN_K:
        guards.fail("recipe", f"recipe {recipe or (recipe_a, recipe_b)}: mxgemm's block scales are 1x{GRAN_K} for "
                              f"a and {GRAN_K}x{GRAN_K} or 1x{GRAN_K} for b")
    if sfb_rows != -(-n // gran_n):
        guards.fail("recipe", f"recipe gran_n = {gran_n} needs sfb with {-(-n // gran_n)} rows for N = {n}; "
                              f"sfb has {sfb_rows}")


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor | None = None, recipe=None, recipe_a=None, recipe_b=None,
                compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """d[M, N] = a[M, K] . b[N, K]^T (+ c) with block scales, written in place.
    a = (e4m3 [M, K], sfa fp32 [M, ceil(K/128)]), b = (e4m3 [N, K], sfb fp32 [ceil(N/128),
    ceil(K/128)] or [N, ceil(K/128)]); each of a and b K-major or MN-major (a view with unit
    stride along M / N); scales in any strides; d bf16 or fp32 [M, N] row-major; c fp32 like d."""
    (x, sfa), (w, sfb) = pair(a, "a"), pair(b, "b")
    sfa, sfb = _fp32_scales(sfa, "sfa"), _fp32_scales(sfb, "sfb")
    _check_recipe(recipe, recipe_a, recipe_b, sfb.shape[0], w.shape[0])
    _dense(x, w, d, c, (sfa, sfb))


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk") -> None:
    """d[M, N] = a[M, K] . b[N, K]^T (+ c), written in place: a, b bf16, each K-major or MN-major;
    d bf16 or fp32 [M, N] row-major; c like d (may be d). fp32 accumulation on the BF16 MFMA
    (grouped_gemm_bf16_kernel / _variable_k with one group), one rounding."""
    _dense(a, b, d, c, None)


def unscaled_fp8_gemm_nt(a, b, d, c=None) -> None:
    """d[M, N] = a[M, K] . b[N, K]^T (+ c) of e4m3 a and b without scales (tensor scales of 1),
    each K-major or MN-major; d bf16 or fp32, c like d. A bf16 d with c: the fp32 product, then
    + c in fp32 and one rounding, as an accumulating epilogue would (the kernel accumulates in
    fp32 only)."""
    one = torch.ones((), device=a.device)
    if c is None or d.dtype == torch.float32:
        _dense(a, b, d, c, (one, one), gran="tensor")
        return
    guards.check_dtype(c, "c", d.dtype)
    guards.check_shape(c, "c", tuple(d.shape))
    acc = torch.empty(d.shape, dtype=torch.float32, device=d.device)
    _dense(a, b, acc, None, (one, one), gran="tensor")
    d.copy_(acc + c.float())


def _dense(x, w, d, c, scales, gran="block") -> None:
    """d = x w^T (+ c) on the grouped family with G = 1, the layout picked by majorness (module
    docstring); scales: (sfa, sfb) fp32 scales of granularity ``gran`` (FP8), or None (BF16)."""
    a_k, b_k = _k_major(x, "a"), _k_major(w, "b")
    m, k = x.shape
    n = w.shape[0]
    guards.check_shape(w, "b", (n, k))
    guards.check_shape(d, "d", (m, n))
    guards.check_dtype(d, "d", (torch.bfloat16, torch.float32))
    accumulate = c is not None
    if accumulate:
        guards.check_dtype(c, "c", d.dtype)
        guards.check_shape(c, "c", (m, n))
    if m == 0 or n == 0:
        return
    if k == 0:                                    # the empty sum: d = c, or 0
        d.copy_(c) if accumulate else d.zero_()
        return
    fp8 = scales is not None
    sfa, sfb = scales or (None, None)
    lens = torch.tensor([k if not (a_k or b_k) else m], dtype=torch.int64, device=x.device)
    if not a_k and not b_k:                       # both MN-major: one contraction group
        op = grouped_gemm_fp8_variable_k if fp8 else grouped_gemm_bf16_variable_k
        args = (x.t(), sfa.t(), w.t(), sfb.t(), lens) if fp8 else (x.t(), w.t(), lens)
        kw = dict(out=d.unsqueeze(0))
    else:
        op = grouped_gemm_fp8_kernel if fp8 else grouped_gemm_bf16_kernel
        xa, wb = x if a_k else x.t(), (w if b_k else w.t()).unsqueeze(0)
        args = (xa, sfa, wb, sfb.unsqueeze(0), lens) if fp8 else (xa, wb, lens)
        kw = dict(out=d, trans_b=b_k, trans_a=not a_k, num_cu=get_num_sms())
    kw.update(out_dtype=d.dtype, accumulate=accumulate, **(dict(granularity=gran) if fp8 else {}))
    _run_after_copy(op, args, kw, d, c)


def _run_after_copy(op, args, kw, d, c) -> None:
    """Check the call, then copy c into d (when c is another tensor), then run: a refused call
    leaves d untouched."""
    op.check(*args, **kw)
    if c is not None and c.data_ptr() != d.data_ptr():
        d.copy_(c)
    op(*args, **kw)


def fp8_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                disable_ue8m0_cast=False) -> None:
    """fp8_gemm_nt with b given as (e4m3 [K, N], sfb [ceil(K/128), ceil(N/128) or N]): DeepGEMM's
    alias, b transposed (a view)."""
    (w, sfb) = pair(b, "b")
    fp8_gemm_nt(a, (w.t(), sfb.t()), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn",
                disable_ue8m0_cast=False) -> None:
    """fp8_gemm_nt with a given as (e4m3 [K, M], sfa [ceil(K/128), M]) and b as in fp8_gemm_nn."""
    (x, sfa), (w, sfb) = pair(a, "a"), pair(b, "b")
    fp8_gemm_nt((x.t(), sfa.t()), (w.t(), sfb.t()), d, c, recipe, recipe_a, recipe_b, compiled_dims,
                disable_ue8m0_cast)


def fp8_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn",
                disable_ue8m0_cast=False) -> None:
    """fp8_gemm_nt with a given as (e4m3 [K, M], sfa [ceil(K/128), M]); b as in fp8_gemm_nt."""
    (x, sfa) = pair(a, "a")
    fp8_gemm_nt((x.t(), sfa.t()), b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def bf16_gemm_nn(a, b, d, c=None, compiled_dims="nk") -> None:
    """bf16_gemm_nt with b given as [K, N] (transposed, a view)."""
    bf16_gemm_nt(a, b.t(), d, c, compiled_dims)


def bf16_gemm_tn(a, b, d, c=None, compiled_dims="mn") -> None:
    """bf16_gemm_nt with a given as [K, M] and b as [K, N] (transposed views)."""
    bf16_gemm_nt(a.t(), b.t(), d, c, compiled_dims)


def bf16_gemm_tt(a, b, d, c=None, compiled_dims="mn") -> None:
    """bf16_gemm_nt with a given as [K, M] (a transposed view); b as in bf16_gemm_nt."""
    bf16_gemm_nt(a.t(), b, d, c, compiled_dims)


def _k_groups(ks_cpu, grouped_layout, use_psum_layout: bool, rows: int):
    """(group_lens, group_offs int64, starts, lens, gaps) of the K-grouped layout: groups one after
    another, each starting on a multiple of the contiguous-layout alignment (psum: group ends
    given)."""
    guards.check_dtype(layout_tensor(grouped_layout, "grouped_layout"), "grouped_layout", torch.int32)
    align_k = get_mk_alignment_for_contiguous_layout()
    if use_psum_layout:
        ends = grouped_layout.cpu().tolist()
        starts = psum_group_starts(ends, align_k)
        lens = [e - s for s, e in zip(starts, ends)]
    else:
        if not ks_cpu:
            guards.fail("ks_cpu", "ks_cpu (the groups' K, a list) is required without the psum layout")
        lens = list(ks_cpu)
        bad = [k for k in lens if k % align_k]
        if bad:
            guards.fail("alignment", f"ks_cpu {lens}: every group's K must be a multiple of the alignment {align_k}")
        starts = [sum(lens[:g]) for g in range(len(lens))]
    if any(k < 0 for k in lens) or (lens and starts[-1] + lens[-1] > rows):
        guards.fail("grouped_layout", f"groups of K {lens} starting at {starts} do not fit the {rows} rows of a")
    device = grouped_layout.device
    offs = torch.tensor(starts + [starts[-1] + lens[-1] if lens else 0], dtype=torch.int64, device=device)
    gaps = [(s + k, n) for s, k, n in zip(starts, lens, starts[1:]) if n > s + k]
    return offs[1:] - offs[:-1], offs, starts, lens, gaps


def _check_gaps_zero(gaps, x, w) -> None:
    """The psum layout's gap rows (a group's end up to the next aligned start) are summed into the
    group before them, which is exact only for zeros (DeepGEMM's generators keep them zeroed):
    refuse anything else rather than add it silently. One read of all gap rows per operand."""
    if not gaps:
        return
    rows = torch.cat([torch.arange(lo, hi) for lo, hi in gaps])
    gap_of_row = torch.cat([torch.full((hi - lo,), g) for g, (lo, hi) in enumerate(gaps)])
    bad = []            # (first gap with a nonzero row, a before b, name): the earliest gap is named
    for order, (name, t) in enumerate((("a", x), ("b", w))):
        hit = gap_of_row[t[rows.to(t.device)].float().ne(0).any(dim=1).cpu()]
        if hit.numel():
            bad.append((int(hit.min()), order, name))
    if bad:
        g, _, name = min(bad)
        guards.fail("psum-padding", f"{name} rows {gaps[g][0]}..{gaps[g][1] - 1} lie between two psum groups (after "
                                    "a group's end, before the next aligned start) and are not zero")


def _scale_block_segments(x, w, starts, lens, gran_k):
    """The kernel's scale blocks are global (row / gran_k), so groups whose starts are not multiples
    of gran_k (an alignment such as 160 with 128-row scales) are copied into segments that start on
    multiples of gran_k, zero rows between them (quant.segments: a copy of a and b per call):
    (x, w, starts, group_offs) of that layout, the last group ending at its last row."""
    st, ln = torch.tensor(starts, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)
    (xp, padded), (wp, _) = (quant.segments(t, st, ln, gran_k) for t in (x, w))
    new_starts = padded[:-1].tolist()
    ends = new_starts[-1] + lens[-1] if lens else 0
    return xp, wp, new_starts, torch.tensor(new_starts + [ends], dtype=torch.int64, device=x.device)


def _global_scale_rows(sf, name, starts, lens, gran_k, rows):
    """DeepGEMM's K-grouped scales hold ceil(k_g / gran_k) rows per group, one group after another;
    the kernel reads group g's block j at row start_g / gran_k + j of ceil(rows / gran_k) rows. The
    same tensor when the two agree, else a copy with each group's rows moved to its start (a small
    tensor: one row per gran_k rows of a)."""
    blocks = [-(-k // gran_k) for k in lens]
    compact = [sum(blocks[:g]) for g in range(len(blocks))]
    if sf.dim() != 2 or sf.shape[0] < sum(blocks):
        guards.fail("shape", f"{name} is {list(sf.shape)}: the groups of K {lens} need {sum(blocks)} scale rows "
                             f"(ceil(k / {gran_k}) per group)")
    at, total = [st // gran_k for st in starts], -(-rows // gran_k)
    if at == compact and sf.shape[0] == total:
        return sf
    out = sf.new_zeros(total, sf.shape[1])
    for c0, g0, n in zip(compact, at, blocks):
        out[g0:g0 + n] = sf[c0:c0 + n]
    return out


def k_grouped_fp8_gemm_tn_contiguous(a, b, d: torch.Tensor, ks_cpu, grouped_layout: torch.Tensor,
                                     c: torch.Tensor | None = None, recipe=(1, 1, 128), compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + a_g^T b_g for the K groups g: a = (e4m3 [sum_k, M], sfa [*, M]), b = (e4m3
    [sum_k, N], sfb [*, N]), d fp32 [G, M, N], c fp32 [G, M, N] (may be d). recipe (1, 1, 128): fp32
    scales per 128 rows, promoted per block; (1, 1, 32): UE8M0 scales per 32 rows (DeepGEMM's SM100
    recipe; fp32 powers of two or packed int32), applied by the scaled MFMA. Scale rows are per
    group as DeepGEMM's K-grouped casts make them: ceil(k_g / gran_k) rows each, one group after
    another. ks_cpu: the groups' K (multiples of the alignment); with use_psum_layout,
    grouped_layout holds the groups' end rows instead (a group starts at the previous end aligned
    up)."""
    (x, sfa), (w, sfb) = pair(a, "a"), pair(b, "b")
    if tuple(recipe) not in ((1, 1, GRAN_K), (1, 1, MX_GRAN_K)):
        guards.fail("recipe", f"recipe {tuple(recipe)}: the K-grouped GEMM takes (1, 1, {GRAN_K}) or "
                              f"(1, 1, {MX_GRAN_K})")
    scales = _fp32_scales(sfa, "sfa"), _fp32_scales(sfb, "sfb")
    _k_grouped(x, w, d, ks_cpu, grouped_layout, c, use_psum_layout, scales, tuple(recipe)[2])


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks_cpu,
                                      grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                      compiled_dims: str = "mn", use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + a_g^T b_g for the K groups g (the MoE weight gradient): a bf16 [sum_k, M],
    b bf16 [sum_k, N], d and c fp32 [G, M, N] (c may be d); groups as in
    k_grouped_fp8_gemm_tn_contiguous. fp32 accumulation on the BF16 MFMA
    (grouped_gemm_bf16_variable_k)."""
    _k_grouped(a, b, d, ks_cpu, grouped_layout, c, use_psum_layout, None, None)


def _k_grouped(x, w, d, ks_cpu, grouped_layout, c, use_psum_layout, scales, gran_k) -> None:
    if c is None:
        guards.fail("c", "c is required (d = c + a^T b), as in DeepGEMM")
    guards.check_dtype(d, "d", torch.float32)
    guards.check_dtype(c, "c", torch.float32)
    guards.check_shape(c, "c", tuple(d.shape))
    group_lens, group_offs, starts, lens, gaps = _k_groups(ks_cpu, grouped_layout, use_psum_layout, x.shape[0])
    if gran_k and any(st % gran_k for st in starts):
        x, w, starts, group_offs = _scale_block_segments(x, w, starts, lens, gran_k)
        group_lens = group_offs[1:] - group_offs[:-1]
    else:
        _check_gaps_zero(gaps, x, w)
    if scales is None:
        op, args = grouped_gemm_bf16_variable_k, (x, w, group_lens, group_offs)
        kw = {}
    else:
        sfa, sfb = (_global_scale_rows(sf, name, starts, lens, gran_k, x.shape[0])
                    for sf, name in zip(scales, ("sfa", "sfb")))
        if gran_k == MX_GRAN_K:      # e8m0 bytes, one row per out row: [M, sum_k / 32] views
            sfa, sfb = ue8m0_codes(sfa).t(), ue8m0_codes(sfb).t()
        op, args = grouped_gemm_fp8_variable_k, (x, sfa, w, sfb, group_lens, group_offs)
        kw = dict(granularity="block" if gran_k == GRAN_K else "mx")
    _run_after_copy(op, args, dict(out=d, out_dtype=torch.float32, accumulate=True, **kw), d, c)


def k_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, ks_cpu, grouped_layout: torch.Tensor,
                                     c: torch.Tensor | None = None, recipe=(1, 1, 128), compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """The K-grouped wgrad with K-major groups: a = (e4m3 flat [sum_k * M]: group g an [M, k_g]
    K-major block, sfa [M, sum_k/128]), b alike with N; d, c fp32 [G, M, N]. Each group is
    transposed into the MN-major form of k_grouped_fp8_gemm_tn_contiguous (a copy per call)."""
    (x, sfa), (w, sfb) = pair(a, "a"), pair(b, "b")
    if use_psum_layout:
        guards.fail("use_psum_layout", "the K-major K-grouped GEMM has no psum layout (as in DeepGEMM)")
    g_count, m, n = d.shape
    ks = list(ks_cpu or [])
    sum_k = sum(ks)
    guards.check_shape(x.reshape(-1), "a", (sum_k * m,))
    guards.check_shape(w.reshape(-1), "b", (sum_k * n,))

    def mn_major(flat, rows):
        parts = torch.split(flat.reshape(-1), [k * rows for k in ks])
        return torch.cat([p.view(rows, -1).t() for p in parts]) if ks else flat.reshape(0, rows)

    k_grouped_fp8_gemm_tn_contiguous((mn_major(x, m), sfa.t()), (mn_major(w, n), sfb.t()), d, ks, grouped_layout,
                                     c, recipe, compiled_dims, False)


def k_major_weights(b):
    """DeepGEMM's M-grouped weights (e4m3 [G, N, K] or packed e2m1 [G, N, K/2], and sfb) with b
    K-major, as the M-grouped kernel reads them. An MN-major b is copied K-major (a copy per call),
    its scales made row-major (small): FP8 b as a [G, K, N] tensor's transposed view (DeepGEMM's
    SM100 recipe); FP4 b as DeepGEMM makes it MN-major, e2m1 packed two per byte along N
    ([G, K, N/2] bytes) seen transposed, shape [G, N/2, K], re-packed along K."""
    w, sfb = pair(b, "b")
    if w.dim() != 3 or w.stride(-1) == 1 or w.stride(-2) != 1:   # K-major, or neither (the op's guard says so)
        return w, sfb
    if w.dtype in (torch.int8, torch.uint8):
        codes = F.unpack_fp4(w.mT.contiguous().view(torch.uint8))                  # [G, K, N]
        return F.pack_fp4(codes.mT.contiguous()).view(w.dtype), sfb.contiguous()
    return w.contiguous(), sfb.contiguous()
