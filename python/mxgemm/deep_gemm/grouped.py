"""DeepGEMM's M-grouped GEMMs (FP8, FP8 x FP4 and BF16; contiguous, psum and masked layouts) and
the dense FP8 x FP4 GEMM on the blockscale_grouped_gemm op: the package docstring gives layouts,
recipes and padding rules."""
import torch

from .. import guards
from ..ops._op import OPS
from ..ops.blockscale_grouped_gemm import M_ALIGN, PACKED, deep_gemm_fp8_grouped_gemm
from .gemm import (
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_tn,
    fp8_gemm_tt,
    k_major_weights,
    layout_tensor,
    pair,
)
from .layout import (
    get_mk_alignment_for_contiguous_layout,
    ue8m0_codes,
)


def _pairs(a, b, layout, layout_name):
    pair(a, "a")
    pair(b, "b")
    layout_tensor(layout, layout_name)


def _scales(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast) -> tuple:
    """DeepGEMM's recipe arguments checked against a's and b's dtypes -> (sfa, sfb) for the op.
    FP8 b: recipe (1, 128, 128) (fp32 / byte sfb per 128 rows of b) or (1, 1, 128) (packed sfb
    per row), or the pair recipe_a (1, 128) with recipe_b (128, 128) or (1, 128). FP4 b: recipe_a
    (1, 128) and recipe_b (1, 32) (the default); fp32 scales are cast to UE8M0 bytes."""
    if (recipe_a is None) != (recipe_b is None):
        guards.fail("recipe", f"recipe_a = {recipe_a}, recipe_b = {recipe_b}: give both or neither")
    if recipe is not None and recipe_a is not None:
        guards.fail("recipe", f"recipe = {tuple(recipe)} with recipe_a / recipe_b: give one or the other")
    pair = None if recipe_a is None else (tuple(recipe_a), tuple(recipe_b))
    sfa, sfb = a[1], b[1]
    if b[0].dtype in (torch.int8, torch.uint8):   # FP4 b, e2m1 packed two per byte
        if recipe is not None or pair not in (None, ((1, 128), (1, 32))):
            got = f"recipe = {tuple(recipe)}" if recipe is not None else f"recipe_a = {pair[0]}, recipe_b = {pair[1]}"
            guards.fail("recipe", f"{got}: FP8 a x FP4 b takes recipe_a = (1, 128) and recipe_b = (1, 32) "
                                  "(1 x 128 activation scales, 1 x 32 weight scales)")
        if torch.float32 in (sfa.dtype, sfb.dtype):
            if disable_ue8m0_cast:
                guards.fail("disable_ue8m0_cast", "FP4 b runs on UE8M0 scales: fp32 scales need the UE8M0 cast "
                                                  "(disable_ue8m0_cast=False), as in DeepGEMM")
            sfa, sfb = (ue8m0_codes(s) if s.dtype == torch.float32 else s for s in (sfa, sfb))
        return sfa, sfb
    want = (1, 1, 128) if sfb.dtype == PACKED else (1, 128, 128)  # DeepGEMM's default for this sfb
    if recipe is not None and tuple(recipe) != want:
        guards.fail("recipe", f"recipe = {tuple(recipe)}: with sfb of dtype {sfb.dtype} the block scaling is {want}")
    as_recipe = {((1, 128), (128, 128)): (1, 128, 128), ((1, 128), (1, 128)): (1, 1, 128)}
    if pair is not None and as_recipe.get(pair) != want:
        guards.fail("recipe", f"recipe_a = {pair[0]}, recipe_b = {pair[1]}: with FP8 b and sfb of dtype {sfb.dtype} "
                              f"the block scaling is recipe_a = (1, 128), recipe_b = "
                              f"{'(1, 128)' if want == (1, 1, 128) else '(128, 128)'}")
    return sfa, sfb


def _contiguous_layout(use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout, config) -> dict:
    """DeepGEMM's contiguous-layout options checked -> the op's keywords."""
    if expected_m_for_psum_layout is not None and not use_psum_layout:
        guards.fail("expected_m_for_psum_layout", f"expected_m_for_psum_layout = {expected_m_for_psum_layout!r} "
                                                  "is a hint of the psum layout only (use_psum_layout=False)")
    if use_psum_layout and get_mk_alignment_for_contiguous_layout() != M_ALIGN:
        guards.fail("alignment", f"use_psum_layout: groups start at the previous end aligned to "
                                 f"{get_mk_alignment_for_contiguous_layout()} "
                                 f"(set_mk_alignment_for_contiguous_layout); the kernel's psum layout aligns to "
                                 f"{M_ALIGN}")
    zero_padding = bool(ensure_zero_padding) or not use_psum_layout   # m_indices: always zeros (module docstring)
    return {"masked": False, "psum": bool(use_psum_layout), "zero_padding": zero_padding, "config": config}


def _check_expected_m(expected_m) -> None:
    if not isinstance(expected_m, int) or expected_m < 0:
        guards.fail("expected_m", f"expected_m must be a non-negative int (a hint); got {expected_m!r}")


def _contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                disable_ue8m0_cast=False, use_psum_layout=False, ensure_zero_padding=True,
                expected_m_for_psum_layout=None, config=""):
    _pairs(a, b, grouped_layout, "grouped_layout" if use_psum_layout else "m_indices")
    b = k_major_weights(b)          # DeepGEMM's SM100 recipe may pass b MN-major (b.mT.contiguous().mT)
    kw = _contiguous_layout(use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout, config)
    sfa, sfb = _scales(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast)
    return (a[0], sfa, b[0], sfb, grouped_layout, d), kw


def _masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
            disable_ue8m0_cast=False, config=""):
    _pairs(a, b, masked_m, "masked_m")
    _check_expected_m(expected_m)
    sfa, sfb = _scales(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast)
    return (a[0], sfa, b[0], sfb, masked_m, d), {"masked": True, "config": config}


def _bf16_operands(a, b, layout, layout_name) -> tuple:
    """DeepGEMM's BF16 a and b (tensors: no scales) and layout, checked -> (a, b K-major): an MN-major
    b (unit stride along N: a [G, K, N] tensor's transposed view) is copied K-major, as
    k_major_weights copies FP8 weights; other strides meet the op's contiguity guard."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            guards.fail("type", f"{name} must be a bf16 torch.Tensor (the BF16 GEMMs take no scales); "
                                f"got {type(t).__name__}")
    layout_tensor(layout, layout_name)
    mn_major = b.dim() == 3 and b.stride(-1) != 1 and b.stride(-2) == 1
    return a, b.contiguous() if mn_major else b


def _bf16_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False, ensure_zero_padding=True,
                     expected_m_for_psum_layout=None, config=""):
    a, b = _bf16_operands(a, b, grouped_layout, "grouped_layout" if use_psum_layout else "m_indices")
    return (a, None, b, None, grouped_layout, d), _contiguous_layout(use_psum_layout, ensure_zero_padding,
                                                                     expected_m_for_psum_layout, config)


def _bf16_masked(a, b, d, masked_m, expected_m, compiled_dims="nk", config=""):
    a, b = _bf16_operands(a, b, masked_m, "masked_m")
    _check_expected_m(expected_m)
    return (a, None, b, None, masked_m, d), {"masked": True, "config": config}


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
                                         ensure_zero_padding=True, expected_m_for_psum_layout=None,
                                         config="") -> None:
    """d[m] = a[m] . b[g(m)]^T with block scales (DeepGEMM 2.6; m_grouped_fp8_gemm_nt_contiguous is
    the same function). a = (e4m3 [M, K], sfa [M, K/128]); b = (e4m3 [G, N, K], sfb
    [G, N/128, K/128]) or FP4 (int8 [G, N, K/2] as per_token_cast_to_fp4 packs it, sfb [G, N, K/32],
    fp32 powers of two or UE8M0 bytes / packed int32); d [M, N] bf16 (f16: m_indices layout with
    FP8 b only) written in place. grouped_layout: m_indices int32 [M] (group of each row, -1:
    padding; each group padded to get_mk_alignment_for_contiguous_layout() rows), or with
    use_psum_layout int32 [G], each group's end row (group g starts at the previous end aligned
    to 128). Padding rows of d are written as zeros; in the psum layout ensure_zero_padding=False
    leaves them untouched instead (True: DeepGEMM 2.6's default)."""
    args, kw = _contiguous(a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast,
                           use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout, config)
    deep_gemm_fp8_grouped_gemm(*args, **kw)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims="nk", disable_ue8m0_cast=False, config="") -> None:
    """d[g, m] = a[g, m] . b[g]^T for m < masked_m[g] with block scales (DeepGEMM 2.6;
    m_grouped_fp8_gemm_nt_masked is the same function). a = (e4m3 [G, M_max, K], sfa
    [G, M_max, K/128]), b as contiguous, d [G, M_max, N] written in place (rows >= masked_m[g]
    untouched), masked_m int32 [G]."""
    args, kw = _masked(a, b, d, masked_m, expected_m, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast,
                       config)
    deep_gemm_fp8_grouped_gemm(*args, **kw)


# DeepGEMM 2.6: the FP8 names are aliases of the FP8 x FP4 functions
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked


def m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False,
                                      ensure_zero_padding=True, expected_m_for_psum_layout=None, config="") -> None:
    """d[m] = a[m] . b[g(m)]^T in bf16 with fp32 accumulation (DeepGEMM 2.6): a bf16 [M, K], b bf16
    [G, N, K] (K-major, or MN-major: copied K-major), d bf16 [M, N] written in place; K % 16 == 0,
    N % 32 == 0. grouped_layout, padding rows and ensure_zero_padding as in
    m_grouped_fp8_fp4_gemm_nt_contiguous (m_indices int32 [M], or with use_psum_layout the group
    ends int32 [G])."""
    args, kw = _bf16_contiguous(a, b, d, grouped_layout, compiled_dims, use_psum_layout, ensure_zero_padding,
                                expected_m_for_psum_layout, config)
    deep_gemm_fp8_grouped_gemm(*args, **kw)


def m_grouped_bf16_gemm_nn_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False,
                                      ensure_zero_padding=True, config="") -> None:
    """m_grouped_bf16_gemm_nt_contiguous with b given as bf16 [G, K, N] (DeepGEMM 2.6): the kernel
    reads b K-major, so the weights are copied transposed on every call (2 G N K bytes)."""
    m_grouped_bf16_gemm_nt_contiguous(a, b.transpose(1, 2) if isinstance(b, torch.Tensor) else b, d, grouped_layout,
                                      compiled_dims, use_psum_layout, ensure_zero_padding, config=config)


def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims="nk", config="") -> None:
    """d[g, m] = a[g, m] . b[g]^T for m < masked_m[g] in bf16 with fp32 accumulation (DeepGEMM 2.6;
    bf16_m_grouped_gemm_nt_masked is the same function): a bf16 [G, M_max, K], b bf16 [G, N, K],
    d bf16 [G, M_max, N] written in place (rows >= masked_m[g] untouched), masked_m int32 [G]."""
    args, kw = _bf16_masked(a, b, d, masked_m, expected_m, compiled_dims, config)
    deep_gemm_fp8_grouped_gemm(*args, **kw)


bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked   # DeepGEMM's legacy alias
_FLAT = {m_grouped_fp8_fp4_gemm_nt_contiguous: _contiguous, m_grouped_fp8_fp4_gemm_nt_masked: _masked,
         m_grouped_bf16_gemm_nt_contiguous: _bf16_contiguous, m_grouped_bf16_gemm_nt_masked: _bf16_masked}


def explain(fn, *args, **kw):
    """The plan (kernel, variant, backend, why) ``fn(*args, **kw)`` would run, or its GuardError."""
    flat, flat_kw = _FLAT[fn](*args, **kw)
    return OPS["deep_gemm_fp8_grouped_gemm"].explain(*flat, **flat_kw)


def m_grouped_fp8_gemm_nn_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
                                     ensure_zero_padding=True) -> None:
    """m_grouped_fp8_gemm_nt_contiguous with b given as (e4m3 [G, K, N], sfb [G, ceil(K/128),
    ceil(N/128)]): DeepGEMM's alias, b transposed. The M-grouped kernel reads b K-major, so the
    weights are copied transposed on every call (G x N x K bytes)."""
    _pairs(a, b, grouped_layout, "grouped_layout" if use_psum_layout else "m_indices")
    w, sfb = b
    m_grouped_fp8_fp4_gemm_nt_contiguous(a, (w.transpose(1, 2), sfb.transpose(1, 2)), d, grouped_layout, recipe,
                                         recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, use_psum_layout,
                                         ensure_zero_padding)


m_grouped_fp8_fp4_gemm_nn_contiguous = m_grouped_fp8_gemm_nn_contiguous


def fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                    disable_ue8m0_cast=False) -> None:
    """DeepGEMM 2.6's dense GEMM d[M, N] = a[M, K] . b[N, K]^T (+ c). FP8 b: fp8_gemm_nt. FP4 b
    (e2m1 packed int8 [N, K/2], sfb [N, K/32]; recipe_a (1, 128), recipe_b (1, 32)): the masked
    M-grouped FP8 x FP4 kernel with one group of M rows (a K-major e4m3 [M, K] with sfa [M, K/128],
    d bf16 [M, N] written in place); c is refused there (that kernel has no accumulating epilogue)."""
    w = b[0] if isinstance(b, (tuple, list)) and len(b) == 2 else None
    if getattr(w, "dtype", None) not in (torch.int8, torch.uint8):
        return fp8_gemm_nt(a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)
    if c is not None:
        guards.fail("c", "c with FP4 b: the FP8 x FP4 kernel writes d = a b^T without accumulation")
    x, sfa = pair(a, "a")
    if not isinstance(d, torch.Tensor) or d.dim() != 2:
        guards.fail("shape", f"d must be a 2-D [M, N] tensor; got {getattr(d, 'shape', type(d).__name__)}")
    m_grouped_fp8_fp4_gemm_nt_masked((x.unsqueeze(0), sfa.unsqueeze(0)), (w.unsqueeze(0), b[1].unsqueeze(0)),
                                     d.unsqueeze(0), torch.tensor([x.shape[0]], dtype=torch.int32, device=x.device),
                                     x.shape[0], recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


# DeepGEMM 2.6 names the dense GEMMs fp8_fp4_gemm_*; FP4 b is served in the NT form only
fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt = fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt
