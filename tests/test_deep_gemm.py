"""DeepGEMM-compatible FP8 and FP8 x FP4 block-scale grouped GEMMs (kernel family blockscale_grouped_gemm)
and the mxgemm.deep_gemm helpers.

Spec: inputs are built the way DeepGEMM's own tests build them (per-token cast of A, per-block
cast of B or, for FP4 B, per-token FP4 cast with 1 x 32 UE8M0 scales; the fp32 product of the
unquantised inputs as the loose check, calc_diff < 1e-3 for FP8, < 0.01 for FP4), and every row
the kernel writes is bit-identical to mxgemm.reference (the kernel promotes each 128-K block
exactly as the reference models it, for fp32 and e8m0 scales alike; FP4 B as one scaled MMA per
128-K block). Padding rows are zeros with m_indices (== -1) always, and in the psum layout (gaps
and tail) with ensure_zero_padding=True, untouched with False; rows past masked_m stay untouched.
Every kernel run goes through
the public functions (import mxgemm.deep_gemm as deep_gemm; DeepGEMM's argument order) on the
emulator in race mode; the plan each call runs is checked to be the variant the case names.
Bad input raises GuardError before any launch and leaves d untouched.
"""
import re

import pytest
import torch

import mxgemm
import mxgemm.deep_gemm as deep_gemm
from mxgemm import build, formats, guards, reference, registry
from mxgemm.deep_gemm import utils

KERNEL = "blockscale_grouped_gemm"
SENTINEL = -7.0           # d is pre-filled with it: rows the kernel must not write keep it


# ---- helpers ----
def test_alignment_and_integer_helpers():
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 128
    assert deep_gemm.get_m_alignment_for_contiguous_layout() == 128
    assert [deep_gemm.ceil_div(x, 128) for x in (0, 1, 128, 129)] == [0, 1, 1, 2]
    assert [deep_gemm.align(x, 128) for x in (0, 1, 128, 129)] == [0, 128, 128, 256]


def test_ceil_to_ue8m0_is_smallest_power_of_two_at_or_above():
    x = torch.tensor([1.0, 0.75, 3.0, 2.0 ** -20 * 1.5, -5.0])
    assert utils.ceil_to_ue8m0(x).tolist() == [1.0, 1.0, 4.0, 2.0 ** -19, 8.0]


def assert_e4m3_rounding(deq, x, scale):
    """One RNE rounding to e4m3 (3 mantissa bits; subnormal step 2^-9) in units of scale."""
    assert bool(((deq - x).abs() <= torch.maximum(x.abs() * 2 ** -4, scale * 2 ** -10)).all())


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_cast_to_fp8(use_ue8m0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=g) * torch.tensor([1.0, 100.0]).repeat_interleave(128)
    x[3, :128] = 0  # all-zero block: amax floor 1e-4
    q, sf = utils.per_token_cast_to_fp8(x, use_ue8m0)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and sf.shape == (5, 2)
    for m in range(5):
        for kb in range(2):
            blk = x[m, 128 * kb:128 * (kb + 1)]
            s = max(float(blk.abs().max()), 1e-4) / 448
            if use_ue8m0:
                s = 2.0 ** torch.tensor(s).log2().ceil().item()
            assert sf[m, kb].item() == pytest.approx(s, rel=1e-6)
            # the block's largest element maps to <= 448, and to 448 exactly without ue8m0
            top = float(q[m, 128 * kb:128 * (kb + 1)].float().abs().max())
            assert top <= 448 and (use_ue8m0 or m == 3 or top == 448)
    deq = q.float().view(5, 2, 128) * sf[:, :, None]
    assert_e4m3_rounding(deq.view(5, 256), x, sf.repeat_interleave(128, 1))


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_cast_to_fp8(use_ue8m0):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 300, generator=g)  # edge blocks padded
    q, sf = utils.per_block_cast_to_fp8(x, use_ue8m0)
    assert q.shape == x.shape and sf.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            blk = x[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
            s = float(blk.abs().max()) / 448
            if use_ue8m0:
                s = 2.0 ** torch.tensor(s).log2().ceil().item()
            assert sf[i, j].item() == pytest.approx(s, rel=1e-6)
    sf_full = sf.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    assert_e4m3_rounding(q.float() * sf_full, x, sf_full)


def test_calc_diff():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert utils.calc_diff(x, x).item() == 0.0
    y = torch.tensor([1.0, 2.0, 4.0])
    assert utils.calc_diff(x, y).item() == pytest.approx(1 - 2 * 17 / (14 + 21), abs=1e-15)
    assert utils.calc_diff(x, -x).item() == 2.0


# ---- kernel on the emulator ----
def e8m0_codes(sf: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales -> uint8 e8m0 codes (exact)."""
    codes = formats.encode_e8m0(sf)
    assert torch.equal(formats.decode_e8m0(codes), sf)
    return codes


def quantize(x, w, ue8m0):
    """DeepGEMM's test inputs: per-token A [.., K], per-block B [G, N, K] (K % 128 != 0: cast
    with K zero-padded to a whole block, as a partial block's amax is that of its elements)."""
    k = x.shape[-1]
    pad = lambda t: torch.nn.functional.pad(t, (0, deep_gemm.align(k, 128) - k))  # noqa: E731
    a, sfa = utils.per_token_cast_to_fp8(pad(x).view(-1, deep_gemm.align(k, 128)), ue8m0)
    bs = [utils.per_block_cast_to_fp8(wg, ue8m0) for wg in pad(w)]
    b, sfb = torch.stack([q for q, _ in bs]), torch.stack([s for _, s in bs])
    if ue8m0:
        sfa, sfb = e8m0_codes(sfa), e8m0_codes(sfb)
    return a[:, :k].contiguous().view(*x.shape), sfa.view(*x.shape[:-1], -1), b[..., :k].contiguous(), sfb


def mn_major(sf: torch.Tensor) -> torch.Tensor:
    """The same scales in DeepGEMM's MN-major layout: [.., M, K/128] with M the unit-stride dim,
    M padded to 4 elements (16 bytes) as DeepGEMM's TMA-aligned tensors are."""
    m, kb = sf.shape[-2:]
    storage = torch.zeros(*sf.shape[:-2], kb, deep_gemm.align(m, 4), dtype=sf.dtype)
    storage[..., :m] = sf.transpose(-1, -2)
    return storage[..., :m].transpose(-1, -2)


def tile(variant) -> str:
    return f"BM={variant['BM']},BN={variant['BN']}"


def ran(variant, sfa, masked) -> dict:
    """The variant a call runs: row-major fp32 activation scales take the SFA_KMAJOR form."""
    kmajor = not variant["UE8M0"] and sfa.dtype == torch.float32 and sfa.is_contiguous()
    return {**variant, "MASKED": masked, **({"SFA_KMAJOR": 1} if kmajor else {})}


def run_contiguous(variant, a, sfa, b, sfb, d, grouped_layout, zero_padding=False, **kw):
    call = ((a, sfa), (b, sfb), d, grouped_layout)
    kw = {"config": tile(variant), "ensure_zero_padding": zero_padding, **kw}
    assert deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_contiguous, *call, **kw).variant == ran(variant, sfa, 0)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(*call, **kw)


def run_masked(variant, a, sfa, b, sfb, d, masked_m, expected_m, **kw):
    call, kw = ((a, sfa), (b, sfb), d, masked_m, expected_m), {"config": tile(variant), **kw}
    assert deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_masked, *call, **kw).variant == ran(variant, sfa, 1)
    deep_gemm.m_grouped_fp8_gemm_nt_masked(*call, **kw)


def contiguous_case(group_rows, n, k, seed):
    """x [M, K] with each group's rows padded to the M alignment (padding rows -1)."""
    g = torch.Generator().manual_seed(seed)
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    m_indices = torch.cat([torch.cat([torch.full((r,), gi, dtype=torch.int32),
                                      torch.full((deep_gemm.align(r, align) - r,), -1, dtype=torch.int32)])
                           for gi, r in enumerate(group_rows)])
    x = torch.randn(len(m_indices), k, generator=g)
    w = torch.randn(len(group_rows), n, k, generator=g)
    return x, w, m_indices


SMALL = registry.variant_grid(BM=(32,), BN=(32,), UE8M0=(0, 1), OUT=("bf16", "f16"))
OUT_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}


def _check(d, ref, written, fp32_product, name, pad=SENTINEL, max_diff=1e-3):
    """Written rows: bit-identical to the reference and within DeepGEMM's calc_diff (< 1e-3 FP8,
    < 0.01 FP4) of the fp32 product; every other row holds ``pad`` (the sentinel: untouched, or
    zeros: ensure_zero_padding), bitwise (+0.0)."""
    assert torch.equal(d[written].view(torch.int16), ref[written].view(torch.int16)), \
        f"{name}: {int((d[written] != ref[written]).sum())} elements differ from the reference"
    want = torch.full_like(d[~written], pad)
    assert torch.equal(d[~written].view(torch.int16), want.view(torch.int16)), \
        f"{name}: padding rows are not all {pad}"
    diff = float(utils.calc_diff(d[written], fp32_product[written]))
    assert diff < max_diff, f"{name}: calc_diff {diff}"


def run_and_check(variant, x, w, layout, masked, name, sfa_layout="row", zero_padding=False):
    """Quantize x [.., K] and w [G, N, K] (sfa_layout "mn": activation scales MN-major), run the
    masked (layout = masked_m) or contiguous (layout = m_indices) call on a d pre-filled with the
    sentinel and check it (_check: masked rows past masked_m untouched, m_indices padding rows
    zeros whatever ensure_zero_padding says: DeepGEMM computes them). -> (sfa, sfb)."""
    out = OUT_DTYPE[variant["OUT"]]
    a, sfa, b, sfb = quantize(x, w, variant["UE8M0"])
    sfa = mn_major(sfa) if sfa_layout == "mn" else sfa
    d = torch.full((*x.shape[:-1], w.shape[1]), SENTINEL, dtype=out)
    if masked:
        run_masked(variant, a, sfa, b, sfb, d, layout, 32)
        ref, product = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, layout, out), \
            torch.einsum("gmk,gnk->gmn", x, w)
        written = torch.arange(x.shape[1])[None, :] < layout[:, None]
    else:
        run_contiguous(variant, a, sfa, b, sfb, d, layout, zero_padding)
        ref, product = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, layout, out), \
            torch.einsum("mk,mnk->mn", x, w[layout.clamp(min=0).long()])
        written = layout >= 0
    _check(d, ref, written, product, name, SENTINEL if masked else 0.0)
    return sfa, sfb


# (variant, group row counts, N, activation-scale layout, ensure_zero_padding): every small variant
# on 4 groups with an empty one and unaligned sizes (padding zeroed or untouched); 1 and 8 groups
# and MN-major scales on some; the 128 x 128 and 128 x 64 tiles twice each, 64 x 128 three times.
# With 8 groups of at most 30 rows, most 32-row tiles are padding only: their zeros come from tiles
# with no K loop.
CONTIGUOUS = [(v, [100, 0, 37, 128], 64, "row", i % 2 == 1) for i, v in enumerate(SMALL)] + [
    (SMALL[0], [45], 32, "mn", False), (SMALL[3], [3, 0, 17, 1, 0, 30, 9, 2], 32, "mn", True),
    (dict(BM=128, BN=128, UE8M0=0, OUT="bf16"), [100, 128], 128, "row", True),
    (dict(BM=128, BN=64, UE8M0=1, OUT="bf16"), [100, 128], 64, "row", False),
    (dict(BM=64, BN=128, UE8M0=0, OUT="bf16"), [100, 128], 128, "row", True),
    # 6 row tiles x 3 column tiles: 18 workgroups, not a multiple of the 8 XCDs they are dealt to
    (dict(BM=64, BN=128, UE8M0=1, OUT="bf16"), [100, 0, 130], 384, "row", False),
    # fp32 scales MN-major: the variants that load sfa a step at a time (row-major ones load windows)
    (dict(BM=128, BN=128, UE8M0=0, OUT="bf16"), [100, 128], 128, "mn", False),
    (dict(BM=128, BN=64, UE8M0=0, OUT="bf16"), [100, 128], 64, "mn", True),
    (dict(BM=64, BN=128, UE8M0=0, OUT="bf16"), [100, 0, 130], 384, "mn", False)]


@pytest.mark.parametrize("variant,group_rows,n,sfa_layout,zero_padding", CONTIGUOUS,
                         ids=[f"{registry.variant_id(v)}-G{len(g)}-{s}-zero{int(z)}" for v, g, _, s, z in CONTIGUOUS])
def test_contiguous_matches_reference(variant, group_rows, n, sfa_layout, zero_padding):
    x, w, m_indices = contiguous_case(group_rows, n=n, k=256, seed=len(group_rows) + variant["UE8M0"])
    run_and_check(variant, x, w, m_indices, False, f"contiguous {variant}", sfa_layout, zero_padding)


# K blocks 1 to 5: the K loop runs its steps in groups of two or, where loads run two steps ahead
# (32 x 32, 128 x 64), three, then the last ones. Row-major fp32 scales (SFA_KMAJOR) run a window of
# K blocks an iteration, 12 where loads run two steps ahead, else 16: 25 to 37 blocks take two or
# three windows, the last one partial
PARTIAL_K = [(SMALL[0], 0, 336), (SMALL[3], 1, 208), (dict(BM=128, BN=64, UE8M0=1, OUT="bf16"), 0, 336),
             (dict(BM=64, BN=128, UE8M0=0, OUT="bf16"), 1, 336), (dict(BM=64, BN=128, UE8M0=1, OUT="bf16"), 1, 112),
             (SMALL[0], 0, 496), (SMALL[2], 1, 560), (dict(BM=128, BN=128, UE8M0=0, OUT="bf16"), 0, 592),
             (SMALL[0], 1, 25 * 128 - 48), (dict(BM=128, BN=64, UE8M0=0, OUT="bf16"), 1, 29 * 128 - 48),
             (dict(BM=64, BN=128, UE8M0=0, OUT="bf16"), 0, 33 * 128 - 112),
             (dict(BM=128, BN=128, UE8M0=0, OUT="bf16"), 1, 37 * 128 - 16)]


@pytest.mark.parametrize("variant,masked,k", PARTIAL_K,
                         ids=[f"{registry.variant_id(v)}-{'masked' if m else 'contiguous'}-K{k}"
                              for v, m, k in PARTIAL_K])
def test_partial_last_k_block_matches_reference(variant, masked, k):
    """K % 128 != 0 (K % 16 == 0): the last K block holds K % 128 elements, scales ceil(K/128)."""
    n = variant["BN"] * 2
    g = torch.Generator().manual_seed(k)
    if masked:
        x, w = torch.randn(3, 40, k, generator=g), torch.randn(3, n, k, generator=g)
        layout = torch.tensor([40, 0, 23], dtype=torch.int32)
    else:
        x, w, layout = contiguous_case([100, 0, 37], n=n, k=k, seed=k)
    sfa, sfb = run_and_check(variant, x, w, layout, masked, f"K={k} {variant}")
    assert sfa.shape[-1] == sfb.shape[-1] == -(-k // 128)


MASKED = [(v, "row") for v in SMALL] + [(SMALL[1], "mn"), (dict(BM=128, BN=64, UE8M0=0, OUT="bf16"), "mn")]


@pytest.mark.parametrize("variant,sfa_layout", MASKED, ids=[f"{registry.variant_id(v)}-{s}" for v, s in MASKED])
def test_masked_matches_reference(variant, sfa_layout):
    G, m_max, n, k = 4, 46, 64, 256
    g = torch.Generator().manual_seed(2 + variant["UE8M0"])
    x, w = torch.randn(G, m_max, k, generator=g), torch.randn(G, n, k, generator=g)
    masked_m = torch.tensor([46, 0, 17, 33], dtype=torch.int32)  # full, empty, partial tiles
    run_and_check(variant, x, w, masked_m, True, f"masked {variant}", sfa_layout)


@pytest.mark.parametrize("masked", [1, 0], ids=["masked", "contiguous"])
def test_tile_order_at_divisors_whose_float_reciprocal_rounds_down(masked):
    """The XCD tile order divides in float. N = 41 x 32 makes its band of 32 x 32 tiles 41 tiles
    (masked: a group's one row tile) or 164 (contiguous: 4 row tiles), divisors whose f32
    reciprocal rounds down, and the first tile of each later band an exact multiple of it."""
    n, k = 41 * 32, 128
    assert all(float(torch.tensor(1.0) / torch.tensor(float(q))) * q < 1 for q in (41, 164))
    g = torch.Generator().manual_seed(41)
    if masked:
        x, w = torch.randn(3, 20, k, generator=g), torch.randn(3, n, k, generator=g)
        layout = torch.tensor([20, 7, 13], dtype=torch.int32)
    else:
        x, w, layout = contiguous_case([100, 37, 128], n=n, k=k, seed=41)
    run_and_check(SMALL[0], x, w, layout, masked, f"N={n} {'masked' if masked else 'contiguous'}")


# ---- DeepGEMM 2.6: the psum layout and FP8 x FP4 ----
def psum_case(group_rows, m, n, k, seed):
    """DeepGEMM's generate_m_grouped_contiguous with use_psum_layout: group g's rows start at the
    previous end aligned to 128 and end at grouped_layout[g]; a [m, K] (rows past the last aligned
    end: a tail of padding), the unquantised padding rows zero."""
    g = torch.Generator().manual_seed(seed)
    ends, owner, start = [], torch.full((m,), -1, dtype=torch.int64), 0
    for gi, r in enumerate(group_rows):
        owner[start:start + r] = gi
        ends.append(start + r)
        start = deep_gemm.align(start + r, 128)
    x = torch.randn(m, k, generator=g) * (owner >= 0)[:, None]
    return x, torch.randn(len(group_rows), n, k, generator=g), torch.tensor(ends, dtype=torch.int32), owner


def test_psum_group_rows_follow_deepgemm_generator():
    assert reference.psum_group_rows(torch.tensor([50, 128, 165], dtype=torch.int32)) == \
        [(0, 0, 50), (1, 128, 128), (2, 128, 165)]


PSUM = [(dict(BM=32, BN=32, PSUM=1, UE8M0=0, OUT="bf16"), False), (dict(BM=32, BN=32, PSUM=1, UE8M0=1, OUT="bf16"), True),
        (dict(BM=128, BN=128, PSUM=1, UE8M0=0, OUT="bf16"), True)]


def _check_psum(variant, zero_padding, group_rows, m, k, seed):
    """The psum kernel against the reference: a and sfa of rows of no group hold NaN codes (DeepGEMM
    leaves them uninitialised): never read."""
    n, ue8m0 = variant["BN"] * 2, variant["UE8M0"]
    x, w, ends, owner = psum_case(group_rows, m, n, k, seed=seed)
    a, sfa, b, sfb = quantize(x, w, ue8m0)
    gap = owner < 0
    a.view(torch.uint8)[gap] = 0x7F
    sfa[gap] = 0xFF if ue8m0 else float("nan")
    d = torch.full((m, n), SENTINEL, dtype=torch.bfloat16)
    run_contiguous(variant, a, sfa, b, sfb, d, ends, zero_padding, use_psum_layout=True)
    ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, ends, torch.bfloat16, psum=True)
    product = torch.einsum("mk,mnk->mn", x, w[owner.clamp(min=0)])
    _check(d, ref, owner >= 0, product, f"psum {variant}", 0.0 if zero_padding else SENTINEL)


@pytest.mark.parametrize("variant,zero_padding", PSUM, ids=[f"{registry.variant_id(v)}-zero{int(z)}" for v, z in PSUM])
def test_psum_matches_reference(variant, zero_padding):
    """Groups of 50, 0, 37 and 128 rows ending at 50, 128, 165, 384 (an empty group, unaligned ends,
    a gap of padding-only 32-row tiles), then a tail of 128 padding rows; K = 352 (a partial block)."""
    _check_psum(variant, zero_padding, [50, 0, 37, 128], 512, 352, seed=21)


# 130 groups (EP-sized): the group search takes three 64-group chunks. Rows only in the chunks' edge
# groups (3, 63 | 64, 127 | 128, 129), the rest empty: tiles of the last group of a chunk, of the first
# of the next one, of group 127 (chunk 1 counts 63), 128 (chunk 1 full, chunk 2 counts 0), and the
# padding tail past group 129 (the search runs out of chunks: no group).
PSUM_MANY = {3: 50, 63: 20, 64: 37, 127: 1, 128: 5, 129: 40}


@pytest.mark.parametrize("variant,zero_padding", PSUM[:2], ids=[f"{registry.variant_id(v)}-zero{int(z)}"
                                                                 for v, z in PSUM[:2]])
def test_psum_more_than_64_groups(variant, zero_padding):
    _check_psum(variant, zero_padding, [PSUM_MANY.get(g, 0) for g in range(130)], 768, 160, seed=22)


def fp4_inputs(x, w, packed=False):
    """DeepGEMM's FP8 x FP4 inputs (its generators with QuantConfig (128, 32, False, True), SM100:
    use_ue8m0): a per-token e4m3 with 1 x 128 scales, b per-token FP4 with 1 x 32 scales, fp32 powers
    of two (the user-facing form) or packed four to an int32 (use_packed_ue8m0)."""
    k = x.shape[-1]
    a, sfa = utils.per_token_cast_to_fp8(x.reshape(-1, k), use_ue8m0=True, use_packed_ue8m0=packed)
    bs = [utils.per_token_cast_to_fp4(wg, use_ue8m0=True, gran_k=32, use_packed_ue8m0=packed) for wg in w]
    b, sfb = torch.stack([q for q, _ in bs]), torch.stack([s for _, s in bs])
    return a.view(x.shape), sfa.view(*x.shape[:-1], -1), b, sfb


def e8m0_of(sf, blocks):
    """fp32 power-of-two scales or packed int32 -> uint8 codes of the first ``blocks`` K blocks (the
    reference's form)."""
    return (sf.contiguous().view(torch.uint8) if sf.dtype == torch.int32 else e8m0_codes(sf))[..., :blocks]


FP4_VARIANT = dict(BM=32, BN=32, UE8M0=1, B_FMT="e2m1", OUT="bf16")
FP4_CASES = [  # (layout, tile, K, ensure_zero_padding, packed scales)
    ("contiguous", 32, 256, True, False), ("contiguous", 32, 352, False, True), ("masked", 32, 256, False, False),
    ("psum", 32, 352, True, False), ("psum", 32, 256, False, True), ("contiguous", 128, 256, True, False)]


@pytest.mark.parametrize("layout,tile_size,k,zero_padding,packed", FP4_CASES,
                         ids=[f"{lay}-{t}-K{k}-zero{int(z)}-{'packed' if p else 'fp32'}" for lay, t, k, z, p in FP4_CASES])
def test_fp8_fp4_matches_reference(layout, tile_size, k, zero_padding, packed):
    """m_grouped_fp8_fp4_gemm_nt_*: bit-exact vs the reference's one-scaled-MMA-per-128-K model,
    DeepGEMM's accuracy bound (calc_diff < 0.01 against the unquantised product), padding zeroed
    or untouched; K = 352: a partial last block whose missing 32-K chunks and scales read nothing."""
    variant = dict(FP4_VARIANT, BM=tile_size, BN=tile_size, **({"PSUM": 1} if layout == "psum" else {}))
    n, G = 2 * tile_size, 3
    g = torch.Generator().manual_seed(k + tile_size)
    kw = dict(recipe_a=(1, 128), recipe_b=(1, 32))
    if layout == "masked":
        x, w = torch.randn(G, 40, k, generator=g), torch.randn(G, n, k, generator=g)
        masked_m = torch.tensor([40, 0, 23], dtype=torch.int32)
        owner = torch.where(torch.arange(40)[None, :] < masked_m[:, None], torch.arange(G)[:, None], -1)
        a, sfa, b, sfb = fp4_inputs(x, w, packed)
        d = torch.full((G, 40, n), SENTINEL, dtype=torch.bfloat16)
        run_masked(variant, a, sfa, b, sfb, d, masked_m, 32, **kw)
        ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, e8m0_of(sfa, -(-k // 128)), b, e8m0_of(sfb, k // 32),
                                                         masked_m)
        product = torch.einsum("gmk,gnk->gmn", x, w)
    else:
        if layout == "psum":
            x, w, grouped, owner = psum_case([50, 0, 37], 384, n, k, seed=k)
        else:
            x, w, grouped = contiguous_case([50, 0, 37], n=n, k=k, seed=k)
            owner = grouped.long()
        a, sfa, b, sfb = fp4_inputs(x, w, packed)
        d = torch.full((x.shape[0], n), SENTINEL, dtype=torch.bfloat16)
        run_contiguous(variant, a, sfa, b, sfb, d, grouped, zero_padding, use_psum_layout=layout == "psum", **kw)
        ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, e8m0_of(sfa, -(-k // 128)), b, e8m0_of(sfb, k // 32),
                                                             grouped, psum=layout == "psum")
        product = torch.einsum("mk,mnk->mn", x, w[owner.clamp(min=0)])
    assert b.dtype == torch.int8 and b.shape == (G, n, k // 2)
    pad = 0.0 if zero_padding or layout == "contiguous" else SENTINEL    # only the psum layout leaves rows untouched
    _check(d, ref, owner >= 0, product, f"fp8 x fp4 {layout}", pad, max_diff=0.01)


def test_fp8_fp4_scale_forms_agree():
    """The same UE8M0 scales as fp32 powers of two, as bytes and packed to int32 give the same d;
    per-32-K scales that really differ along K (a block scaled by 2^6 and its neighbours not) took
    effect (the result differs from the one with uniform scales)."""
    variant = dict(FP4_VARIANT, MASKED=1)
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(2, 32, 256, generator=g), torch.randn(2, 64, 256, generator=g)
    w[:, :, 32:64] *= 64
    masked_m = torch.tensor([32, 17], dtype=torch.int32)
    a, sfa, b, sfb = fp4_inputs(x, w)
    outs = []
    for sa, sb in ((sfa, sfb), (e8m0_of(sfa, 2), e8m0_of(sfb, 8)), fp4_inputs(x, w, packed=True)[1::2]):
        outs.append(torch.full((2, 32, 64), SENTINEL, dtype=torch.bfloat16))
        run_masked(variant, a, sa, b, sb, outs[-1], masked_m, 32)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert torch.equal(outs[0].view(torch.int16), outs[2].view(torch.int16))
    uniform = torch.full_like(outs[0], SENTINEL)
    run_masked(variant, a, sfa, b, sfb.amax(-1, keepdim=True).expand_as(sfb).contiguous(), uniform, masked_m, 32)
    assert not torch.equal(uniform, outs[0])


# ---- UE8M0 scales packed four to an int32 (DeepGEMM's SM100 layout) ----
def test_packed_ue8m0_layout():
    """Byte i of int32 word j of row m is the e8m0 code of K block 4j + i (missing blocks 0);
    MN-major: rows unit-stride, columns padded to 4 elements, groups one after another."""
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(100, 150, (2, 5, 6), generator=g)
    sf = torch.pow(2.0, codes - 127.0)
    packed = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert packed.dtype == torch.int32 and packed.shape == (2, 5, 2) and packed.stride() == (16, 1, 8)
    for gi in range(2):
        for m in range(5):
            for j in range(2):
                want = sum(int(codes[gi, m, 4 * j + i]) << (8 * i) for i in range(4) if 4 * j + i < 6)
                assert int(packed[gi, m, j]) & 0xFFFFFFFF == want
    assert deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf[0]).stride() == (1, 8)


def unpack_ue8m0(packed: torch.Tensor, k_blocks: int) -> torch.Tensor:
    """int32 [.., R, ceil(K/512)] -> uint8 codes [.., R, K/128] (little-endian bytes of each word)."""
    return torch.empty(packed.shape, dtype=packed.dtype).copy_(packed).view(torch.uint8)[..., :k_blocks]


@pytest.mark.parametrize("masked", [0, 1])
def test_packed_ue8m0_scales_bit_exact_vs_bytes(masked):
    """The same e8m0 scales as bytes or packed give bit-identical d (sfb broadcast to every row
    of its 128-row block, as DeepGEMM does for the packed recipe); sfb that really differs per
    row of b (recipe (1, 1, 128)) matches the reference. K = 5 blocks: a half-filled last word."""
    variant = dict(BM=32, BN=32, UE8M0=1, OUT="bf16")
    G, n, k = 3, 64, 640
    g = torch.Generator().manual_seed(9)
    if masked:
        x, masked_m = torch.randn(G, 40, k, generator=g), torch.tensor([40, 0, 23], dtype=torch.int32)
        run = lambda sfa, sfb, d: run_masked(variant, a, sfa, b, sfb, d, masked_m, 32)  # noqa: E731
        ref = lambda sfa, sfb: reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, masked_m)  # noqa: E731
        written = torch.arange(40)[None, :] < masked_m[:, None]
    else:
        x, w, m_indices = contiguous_case([50, 0, 20], n=n, k=k, seed=9)
        run = lambda sfa, sfb, d: run_contiguous(variant, a, sfa, b, sfb, d, m_indices)  # noqa: E731
        ref = lambda sfa, sfb: reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, m_indices)  # noqa: E731
        written = m_indices >= 0
    a, sfa, b, sfb = quantize(x, torch.randn(G, n, k, generator=g), True)
    pack = lambda codes: _pack(formats.decode_e8m0(codes))  # noqa: E731
    sfa_p, sfb_rows = pack(sfa), sfb.repeat_interleave(128, dim=1)[:, :n]
    assert torch.equal(unpack_ue8m0(sfa_p, 5), sfa)

    d_bytes, d_packed = (torch.full((*x.shape[:-1], n), SENTINEL, dtype=torch.bfloat16) for _ in range(2))
    run(sfa, sfb, d_bytes)
    run(sfa_p, pack(sfb_rows), d_packed)
    assert torch.equal(d_packed.view(torch.int16), d_bytes.view(torch.int16))

    sfb_rows = (sfb_rows.int() + torch.randint(-3, 4, sfb_rows.shape, generator=g)).to(torch.uint8)
    d = torch.full_like(d_bytes, SENTINEL)
    run(sfa_p, pack(sfb_rows), d)
    assert torch.equal(d[written].view(torch.int16), ref(sfa, sfb_rows)[written].view(torch.int16))
    assert bool((d[~written] == (SENTINEL if masked else 0.0)).all())   # m_indices padding rows: zeros
    assert not torch.equal(d, d_bytes)  # the per-row scales took effect


# ---- a user script written against DeepGEMM (only the import changed) ----
def sm100_packed(x_fp8, y_fp8, n):
    """What DeepGEMM does to UE8M0 scales on SM100 (and a user may pass instead of fp32): pack
    sfa; sfb too, after giving each row of b its 128-row block's scale (recipe (1, 1, 128))."""
    pack = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor
    return (x_fp8[0], pack(x_fp8[1])), (y_fp8[0], pack(y_fp8[1].repeat_interleave(128, dim=-2)[..., :n, :]))


@pytest.mark.parametrize("use_ue8m0,packed", [(False, False), (True, False), (True, True)])
def test_deepgemm_style_user_script_contiguous_and_masked(use_ue8m0, packed):
    from mxgemm.deep_gemm.utils import calc_diff, per_block_cast_to_fp8, per_token_cast_to_fp8
    torch.manual_seed(11)
    num_groups, n, k, m_per_group = 3, 64, 384, [90, 128, 7]
    # contiguous: groups padded to the M alignment, padding rows -1
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    m = sum(deep_gemm.align(r, align) for r in m_per_group)
    x = torch.randn((m, k), dtype=torch.bfloat16)
    y = torch.randn((num_groups, n, k), dtype=torch.bfloat16)
    m_indices = torch.full((m,), -1, dtype=torch.int32)
    start = 0
    for g, r in enumerate(m_per_group):
        m_indices[start:start + r] = g
        start += deep_gemm.align(r, align)
    x_fp8 = per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    y_fp8 = (torch.empty_like(y, dtype=torch.float8_e4m3fn),
             torch.empty((num_groups, deep_gemm.ceil_div(n, 128), k // 128), dtype=torch.float))
    for i in range(num_groups):
        y_fp8[0][i], y_fp8[1][i] = per_block_cast_to_fp8(y[i], use_ue8m0=use_ue8m0)
    out = torch.full((m, n), SENTINEL, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(*(sm100_packed(x_fp8, y_fp8, n) if packed else (x_fp8, y_fp8)), out,
                                               m_indices, disable_ue8m0_cast=not use_ue8m0)
    ref_out = torch.einsum("mk,mnk->mn", x.float(), y[m_indices.clamp(min=0).long()].float())
    real = m_indices >= 0
    diff = calc_diff(out[real], ref_out[real]).item()
    print(f"\ncontiguous use_ue8m0={use_ue8m0} packed={packed}: calc_diff {diff:.2e}")
    assert diff < 1e-3
    ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(x_fp8[0], x_fp8[1], *y_fp8, m_indices, torch.bfloat16)
    assert torch.equal(out[real].view(torch.int16), ref[real].view(torch.int16))
    assert bool((out[~real] == 0).all())   # DeepGEMM 2.6's default ensure_zero_padding=True

    # masked: the same weights, M_max rows per group, masked_m with 0 and M_max
    m_max = 40
    masked_m = torch.tensor([m_max, 0, 13], dtype=torch.int32)
    x = torch.randn((num_groups, m_max, k), dtype=torch.bfloat16)
    a, sa = per_token_cast_to_fp8(x.view(-1, k), use_ue8m0=use_ue8m0)
    x_fp8 = (a.view(num_groups, m_max, k), sa.view(num_groups, m_max, -1))
    out = torch.full((num_groups, m_max, n), SENTINEL, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_masked(*(sm100_packed(x_fp8, y_fp8, n) if packed else (x_fp8, y_fp8)), out,
                                           masked_m, expected_m=16)
    ref_out = torch.einsum("gmk,gnk->gmn", x.float(), y.float())
    real = torch.arange(m_max)[None, :] < masked_m[:, None]
    diff = calc_diff(out[real], ref_out[real]).item()
    print(f"masked use_ue8m0={use_ue8m0} packed={packed}: calc_diff {diff:.2e}")
    assert diff < 1e-3
    ref = reference.m_grouped_fp8_gemm_nt_masked_ref(*x_fp8, *y_fp8, masked_m, torch.bfloat16)
    assert torch.equal(out[real].view(torch.int16), ref[real].view(torch.int16))
    assert bool((out[~real] == SENTINEL).all())


# ---- guards: GuardError naming the rule, before any launch, d untouched ----
def _valid(masked=False, G=2, n=64, k=256):
    g = torch.Generator().manual_seed(5)
    rows = (G, 40) if masked else (G * 128,)
    a = torch.randn(*rows, k, generator=g).to(torch.float8_e4m3fn)
    sfa = torch.rand(*rows, k // 128, generator=g) + 0.5
    b = torch.randn(G, n, k, generator=g).to(torch.float8_e4m3fn)
    sfb = torch.rand(G, -(-n // 128), k // 128, generator=g) + 0.5
    d = torch.full((*rows, n), SENTINEL, dtype=torch.bfloat16)
    layout = torch.tensor([40, 3][:G], dtype=torch.int32) if masked else \
        torch.arange(G, dtype=torch.int32).repeat_interleave(128)
    return dict(a=a, sfa=sfa, b=b, sfb=sfb, d=d, layout=layout)


def _call(t, masked, **kw):
    if masked:
        deep_gemm.m_grouped_fp8_gemm_nt_masked((t["a"], t["sfa"]), (t["b"], t["sfb"]), t["d"], t["layout"], 16, **kw)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((t["a"], t["sfa"]), (t["b"], t["sfb"]), t["d"], t["layout"], **kw)


def _bad_group_alignment(t):
    t["layout"][100:140] = 1  # group 1 starts mid-block
    return t


GUARDS = [  # (name, masked, edit of the valid inputs, rule, message fragment)
    ("K%16", 0, lambda t: _valid(k=200),
     "K%16", "K = 200 must be a multiple of 16"),
    ("N-alignment", 0, lambda t: {**t, "b": t["b"][:, :48].contiguous(), "d": t["d"][:, :48].contiguous()},
     "N%32", "N = 48 must be a multiple of 32"),
    ("m_indices-length", 0, lambda t: {**t, "layout": t["layout"][:-1]}, "shape", "m_indices has shape [255]"),
    ("m_indices-dtype", 0, lambda t: {**t, "layout": t["layout"].long()}, "dtype", "m_indices has dtype torch.int64"),
    ("m_indices-group", 0, lambda t: {**t, "layout": torch.where(t["layout"] == 1, 2, t["layout"]).int()},
     "m_indices", "m_indices[128] = 2"),
    ("group-alignment", 0, _bad_group_alignment, "group-alignment", "rows 0..127 of m_indices hold [0, 1]"),
    ("M%128", 0, lambda t: {k: (v[:200] if k in ("a", "sfa", "d", "layout") else v) for k, v in t.items()},
     "M%128", "M (rows of a) = 200"),
    ("masked_m-length", 1, lambda t: {**t, "layout": torch.tensor([1, 2, 3], dtype=torch.int32)}, "shape",
     "masked_m has shape [3]"),
    ("masked_m-dtype", 1, lambda t: {**t, "layout": t["layout"].long()}, "dtype", "masked_m has dtype torch.int64"),
    ("masked_m-value", 1, lambda t: {**t, "layout": torch.tensor([41, 0], dtype=torch.int32)}, "masked_m",
     "masked_m[0] = 41 is outside 0..40"),
    ("sfa-shape", 0, lambda t: {**t, "sfa": t["sfa"][:, :1].contiguous()}, "shape", "sfa has shape [256, 1]"),
    ("sfb-shape", 0, lambda t: {**t, "sfb": t["sfb"][:1]}, "shape", "sfb has shape [1, 1, 2]"),
    ("sfa-layout", 0, lambda t: {**t, "sfa": torch.zeros(2, 260)[:, :256].t()},
     "layout", "expected row-major (contiguous) or MN-major with strides (1, 256)"),
    ("a-dtype", 0, lambda t: {**t, "a": t["a"].to(torch.bfloat16)}, "dtype", "a has dtype torch.bfloat16"),
    ("d-dtype", 0, lambda t: {**t, "d": t["d"].float()}, "dtype", "d has dtype torch.float32"),
    ("scale-dtypes-mixed", 0, lambda t: {**t, "sfb": t["sfb"].to(torch.uint8)}, "dtype", "sfb has dtype torch.uint8"),
    ("b-contiguity", 0, lambda t: {**t, "b": torch.nn.functional.pad(t["b"].view(torch.uint8), (0, 16))
                                   .view(t["b"].dtype)[..., :t["b"].shape[-1]]}, "contiguity",
     "b must be contiguous"),
    ("device", 0, lambda t: {**t, "layout": t["layout"].to("meta")}, "device", "m_indices=meta"),
    ("packed-sfb-per-block", 0, lambda t: {**t, "sfa": _pack(t["sfa"]), "sfb": _pack(t["sfb"])}, "shape",
     "sfb has shape [2, 1, 1]; expected [2, 64, 1]"),
    ("packed-sfa-k-blocks", 1, lambda t: {**t, "sfa": _pack(t["sfa"]).expand(2, 40, 2),
                                          "sfb": _pack(t["sfb"].repeat_interleave(64, 1))}, "shape",
     "sfa has shape [2, 40, 2]; expected [2, 40, 1]"),
    ("packed-sfb-layout", 0, lambda t: {**t, "sfa": _pack(t["sfa"]), "sfb": torch.zeros(2, 1, 72, dtype=torch.int32)
                                        [..., :64].transpose(1, 2)}, "layout", "sfb has strides (72, 1, 72)"),
]


def _pack(sf):
    return deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)


@pytest.mark.parametrize("name,masked,edit,rule,text", GUARDS, ids=[g[0] for g in GUARDS])
def test_guard_raises_before_launch_and_leaves_d_untouched(name, masked, edit, rule, text):
    t = edit(_valid(bool(masked)))
    d_before = t["d"].clone()
    with pytest.raises(guards.GuardError, match=re.escape(f"[{rule}]")) as e:
        _call(t, bool(masked))
    assert text in str(e.value), str(e.value)
    assert torch.equal(t["d"], d_before)


def test_recipe_pair_and_expected_m_guards():
    t = _valid()
    with pytest.raises(guards.GuardError, match=r"\[recipe\] recipe = \(1, 1, 128\)"):
        _call(t, False, recipe=(1, 1, 128))
    with pytest.raises(guards.GuardError, match=r"\[recipe\] recipe = \(1, 128, 128\): with sfb of dtype torch.int32"):
        _call({**t, "sfb": _pack(t["sfb"].repeat_interleave(64, 1))}, False, recipe=(1, 128, 128))
    with pytest.raises(guards.GuardError, match=r"\[args\] a must be a \(tensor, scales\) pair"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(t["a"], (t["b"], t["sfb"]), t["d"], t["layout"])
    t = _valid(masked=True)
    with pytest.raises(guards.GuardError, match=r"\[expected_m\]"):
        deep_gemm.m_grouped_fp8_gemm_nt_masked((t["a"], t["sfa"]), (t["b"], t["sfb"]), t["d"], t["layout"], -1)
    assert bool((t["d"] == SENTINEL).all())


def _valid_26(fp4=True, k=256):
    """A valid DeepGEMM 2.6 call: contiguous psum layout (groups of 40 and 3 rows in M = 256), FP4 b
    with fp32 UE8M0 scales (recipe_a (1, 128), recipe_b (1, 32)) or FP8 b with fp32 scales."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(256, k, generator=g), torch.randn(2, 64, k, generator=g)
    a, sfa, b, sfb = fp4_inputs(x, w) if fp4 else quantize(x, w, False)
    return dict(a=(a, sfa), b=(b, sfb), d=torch.full((256, 64), SENTINEL, dtype=torch.bfloat16),
                grouped_layout=torch.tensor([40, 131], dtype=torch.int32), use_psum_layout=True)


def _with(fp4=True, **kw):
    return {**_valid_26(fp4), **kw}


def _fp4(t, **kw):
    return {**t, "b": (t["b"][0], kw.get("sfb", t["b"][1])), **{k: v for k, v in kw.items() if k != "sfb"}}


GUARDS_26 = [  # (name, call arguments, rule, message fragment)
    ("psum-decreasing", _with(grouped_layout=torch.tensor([100, 50], dtype=torch.int32)), "grouped_layout",
     "grouped_layout[1] = 50: with use_psum_layout each entry is its group's end row, at least the group's start 128"),
    ("psum-past-M", _with(grouped_layout=torch.tensor([40, 300], dtype=torch.int32)), "grouped_layout",
     "grouped_layout[1] = 300"),
    ("psum-negative", _with(grouped_layout=torch.tensor([-1, 40], dtype=torch.int32)), "grouped_layout",
     "grouped_layout[0] = -1"),
    ("psum-shape", _with(grouped_layout=torch.zeros(256, dtype=torch.int32)), "shape",
     "grouped_layout has shape [256]; expected [2]"),
    ("psum-expected-m-without-psum", _with(use_psum_layout=False, grouped_layout=torch.zeros(256, dtype=torch.int32),
                                           expected_m_for_psum_layout=64), "expected_m_for_psum_layout",
     "expected_m_for_psum_layout = 64 is a hint of the psum layout only"),
    ("fp4-recipe-b", _with(recipe_a=(1, 128), recipe_b=(1, 128)), "recipe",
     "recipe_a = (1, 128), recipe_b = (1, 128): FP8 a x FP4 b takes recipe_a = (1, 128) and recipe_b = (1, 32)"),
    ("fp4-recipe", _with(recipe=(1, 1, 128)), "recipe", "recipe = (1, 1, 128): FP8 a x FP4 b takes"),
    ("recipe-half-pair", _with(recipe_a=(1, 128)), "recipe", "recipe_a = (1, 128), recipe_b = None: give both"),
    ("fp8-recipe-pair", _with(fp4=False, recipe_a=(1, 128), recipe_b=(1, 32)), "recipe",
     "recipe_a = (1, 128), recipe_b = (1, 32): with FP8 b and sfb of dtype torch.float32 the block scaling is "
     "recipe_a = (1, 128), recipe_b = (128, 128)"),
    ("fp4-b-unpacked", _with(b=(torch.zeros(2, 64, 256, dtype=torch.int8), torch.ones(2, 64, 8))), "shape",
     "b has shape [2, 64, 256] and a has K = 256: FP4 b must be [G, N, K/2] = [G, N, 128]"),
    ("fp4-b-2d", _with(b=(torch.zeros(64, 128, dtype=torch.int8), torch.ones(64, 8))), "shape",
     "b must be [G, N, K/2] (FP4 packed two per byte); got shape [64, 128]"),
    ("fp4-k32", {**_valid_26(), "a": (torch.zeros(256, 48).to(torch.float8_e4m3fn), torch.ones(256, 1)),
                 "b": (torch.zeros(2, 64, 24, dtype=torch.int8), torch.ones(2, 64, 1))}, "K%32",
     "K = 48 must be a multiple of 32"),
    ("fp4-sfb-per-128", _with(b=(_valid_26()["b"][0], torch.ones(2, 64, 2))), "shape",
     "sfb has shape [2, 64, 2]; expected [2, 64, 8]"),
    ("fp4-fp32-no-cast", _with(disable_ue8m0_cast=True), "disable_ue8m0_cast",
     "FP4 b runs on UE8M0 scales: fp32 scales need the UE8M0 cast"),
    ("fp4-f16-d", _with(d=torch.full((256, 64), SENTINEL, dtype=torch.float16)), "variant",
     "no registered variant for {'MASKED': 0, 'UE8M0': 1, 'OUT': 'f16', 'PSUM': 1, 'B_FMT': 'e2m1'}"),
]


@pytest.mark.parametrize("name,kw,rule,text", GUARDS_26, ids=[g[0] for g in GUARDS_26])
def test_deepgemm_26_guards_before_launch(name, kw, rule, text):
    d_before = kw["d"].clone()
    with pytest.raises(guards.GuardError, match=re.escape(f"[{rule}]")) as e:
        deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(**kw)
    assert text in str(e.value), str(e.value)
    assert torch.equal(kw["d"].view(torch.int16), d_before.view(torch.int16))


def test_psum_alignment_guard():
    """The psum kernel aligns group starts to 128; another alignment set by the user is refused."""
    from mxgemm.deep_gemm import layout
    kw = _valid_26()
    deep_gemm.set_mk_alignment_for_contiguous_layout(256)
    try:
        with pytest.raises(guards.GuardError, match=r"\[alignment\] use_psum_layout: groups start at the previous "
                                                    r"end aligned to 256"):
            deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(**kw)
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(layout.TILE_ALIGNMENT)
    assert bool((kw["d"] == SENTINEL).all())


def test_valid_26_call_runs():
    """The guard tests' base call is valid: it runs (variant chosen by default) and writes d."""
    for fp4 in (True, False):
        kw = _valid_26(fp4)
        p = deep_gemm.explain(deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous, **kw, config="BM=32,BN=32")
        assert p.variant == dict(BM=32, BN=32, MASKED=0, PSUM=1, UE8M0=int(fp4), OUT="bf16",
                                 **({"B_FMT": "e2m1"} if fp4 else {"SFA_KMAJOR": 1}))
        deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(**kw, config="BM=32,BN=32")
        assert bool((kw["d"][131:] == 0).all()) and bool((kw["d"][:40] != SENTINEL).any(dim=1).all())


def test_arch_guard(monkeypatch):
    """A backend that cannot run gfx950 code is refused by name before anything runs."""
    from mxgemm import launcher
    from mxgemm.ops._op import OPS
    monkeypatch.setattr(launcher, "EMU_ARCH", "gfx1250")
    OPS["deep_gemm_fp8_grouped_gemm"].clear_plans()
    t = _valid()
    with pytest.raises(guards.GuardError, match=r"\[arch\] the emulator runs gfx1250 code"):
        _call(t, False)
    assert bool((t["d"] == SENTINEL).all())


def test_explain_covers_both_ops():
    t = _valid()
    call = ((t["a"], t["sfa"]), (t["b"], t["sfb"]), t["d"], t["layout"])
    p = deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_contiguous, *call, config="BM=32,BN=32")
    assert p.kernel == KERNEL and p.variant == dict(BM=32, BN=32, MASKED=0, UE8M0=0, OUT="bf16", SFA_KMAJOR=1)
    assert "contiguous (m_indices) layout, padding rows zeroed, e4m3, fp32 scales (row-major sfa)" in str(p)
    assert "config given by the caller" in str(p)
    assert p.grid == (2, 8, 1)
    t = _valid(masked=True, n=128)
    p = deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_masked, (t["a"], t["sfa"]), (t["b"], t["sfb"]),
                          t["d"], t["layout"], 16, config={"BM": 128, "BN": 128})
    assert p.variant == dict(BM=128, BN=128, MASKED=1, UE8M0=0, OUT="bf16", SFA_KMAJOR=1) and p.grid == (1, 2, 1)
    assert "masked layout" in str(p)


def test_default_tile_heuristic():
    """Deterministic default: of the tiles whose grid fills the MI355X's 256 CUs, the one computing
    the fewest rows past the live ones, then one whose grid is more than one workgroup per CU, then
    the largest; else the one with the most workgroups; 32 x 32 only when no larger tile divides N;
    128 x 64 and 64 x 128 are bf16 only."""
    def plan(rows, n, out=torch.bfloat16, masked=False):
        G, k = 8, 256
        a = torch.empty(G, rows, k) if masked else torch.empty(rows, k)
        args = (a.to(torch.float8_e4m3fn), torch.empty(*a.shape[:-1], 2), torch.empty(G, n, k).to(torch.float8_e4m3fn),
                torch.empty(G, -(-n // 128), 2), torch.zeros(G if masked else rows, dtype=torch.int32),
                torch.empty(*a.shape[:-1], n, dtype=out))
        p = mxgemm.explain("deep_gemm_fp8_grouped_gemm", *args, masked=masked)
        return f"{p.variant['BM']}x{p.variant['BN']}", p.grid
    # DeepSeek-V3, 8 groups padded to 128 rows: N = 7168 fills the GPU with 128 x 128 tiles at 64
    # rows per group; N = 2048 needs 128 x 64 tiles until 256 rows per group, where 128 x 128 tiles
    # would give each CU one workgroup, and 512 rows per group
    assert plan(8 * 128, 7168) == ("128x128", (56, 8, 1))
    assert plan(8 * 128, 2048) == ("128x64", (32, 8, 1))
    assert plan(8 * 256, 2048) == ("128x64", (32, 16, 1))
    assert plan(8 * 512, 2048) == ("128x128", (16, 32, 1))
    assert plan(256, 2048, masked=True) == ("128x64", (32, 16, 1))
    assert plan(64, 2048, masked=True) == ("128x64", (32, 8, 1))
    # masked buffers of 64 rows: 128-row tiles would compute 64 dead rows each
    assert plan(64, 7168, masked=True) == ("64x128", (56, 8, 1))
    assert plan(64, 7168, out=torch.float16, masked=True) == ("128x128", (56, 8, 1))
    assert plan(512, 7168, masked=True) == ("128x128", (56, 32, 1))
    assert plan(100, 7168, masked=True) == ("128x128", (56, 8, 1))   # two 64-row tiles: as many rows
    assert plan(8 * 128, 2048, out=torch.float16) == ("128x128", (16, 8, 1))   # no f16 128 x 64
    assert plan(8 * 128, 96) == ("32x32", (3, 32, 1))
    with pytest.raises(guards.GuardError, match=r"\[config\] tile 128x64 is not a registered tile dividing N = 96"):
        t = _valid(n=96)
        mxgemm.explain("deep_gemm_fp8_grouped_gemm", *(t[k] for k in ("a", "sfa", "b", "sfb", "layout", "d")),
                       config="BM=128,BN=64")


# ---- code objects ----
def loops(asm: str) -> list[list[str]]:
    """Each loop's instructions: from a label to a later conditional branch back to it."""
    lines = [l.strip() for l in asm.splitlines()]
    labels = {l[:-1]: i for i, l in enumerate(lines) if re.fullmatch(r"\.LBB\d+_\d+:", l)}
    found = []
    for i, l in enumerate(lines):
        m = re.match(r"s_cbranch_\w+\s+(\.LBB\d+_\d+)", l)
        if m and labels.get(m.group(1), i) < i:
            found.append(lines[labels[m.group(1)]:i])
    return found


def loop_bodies(asm: str) -> list[str]:
    """Instructions of every loop."""
    return [l for body in loops(asm) for l in body]


@pytest.mark.parametrize("variant", [v for v in registry.get(KERNEL).variants if v.get("A_FMT") != "bf16"],
                         ids=registry.variant_id)   # bf16 variants: tests/test_deep_gemm_bf16.py
def test_code_object_spill_free_with_mfma_and_promotion_in_the_loop(variant):
    art = build.artifact(KERNEL, variant)
    info = art.isa()
    print(f"\n{KERNEL} [{registry.variant_id(variant)}]: {info.summary(256)}")
    assert info.spills == 0 and info.scratch_bytes == 0
    # buffers of a K block's A tile (BM x 128 bytes) and, e4m3 b, its B tile (BN x 128 bytes): three
    # where loads run two K steps ahead, else two
    ahead = 2 if (variant["BM"], variant["BN"]) in ((128, 64), (32, 32)) else 1
    b_in_lds = variant.get("B_FMT", "e4m3") == "e4m3"
    assert info.lds_bytes == (ahead + 1) * (variant["BM"] + variant["BN"] * b_in_lds) * 128
    assert info.occupancy(256) >= 2
    tiles = (variant["BM"] // 32) * (variant["BN"] // 32)     # 16x16 MFMA tiles per wave
    rows_per_pass = 256 // (variant["BN"] // 8)               # CShuffle: one 16-byte row chunk per thread
    assert info.count("buffer_store_dwordx4") == -(-variant["BM"] // rows_per_pass)
    assert info.count("buffer_store_dwordx2") == 0 and info.count("ds_write_b64") == tiles
    bodies = loop_bodies(art.asm)
    loop = " ".join(bodies)
    mfma = loop.count("v_mfma_scale_f32_16x16x128_f8f6f4")
    assert mfma >= tiles and mfma % tiles == 0               # one MFMA per tile per K block (unrolled)
    # per K block a thread's 16-byte DMAs: the tiles' 16-byte chunks (8 per row) over 256 threads
    dmas = (variant["BM"] + variant["BN"] * b_in_lds) * 8 // 256
    dma = sum(l.startswith("buffer_load_dwordx4") and l.endswith(" lds") for l in bodies)
    assert dma * tiles == mfma * dmas, (dma, mfma)
    # the steps' barriers leave the later step's loads in flight (vmcnt(0) would drain them), and the
    # prefetched registers are not copied at the back edge (a copy waits for its load)
    k_loop = " ".join(l for body in loops(art.asm) if any("v_mfma" in x for x in body) for l in body)
    waits = [int(n) for n in re.findall(r"s_waitcnt vmcnt\((\d+)\)", k_loop)]
    assert waits and (min(waits) > 0) == (ahead == 2), waits
    if ahead == 1 and variant.get("SFA_KMAJOR"):
        # the old sfa window is still read while the next one loads: the compiler copies it, the
        # copy's wait just before a step's barrier, which waits for every load (vmcnt(0)) anyway
        seq = re.findall(r"s_waitcnt vmcnt\((\d+)\)|(v_mfma)", k_loop)
        assert all(b == ("0", "") for a, b in zip(seq, seq[1:]) if a[0] not in ("", "0")), seq
    else:
        loaded = {r for a, b in re.findall(r"buffer_load_dwordx4 v\[(\d+):(\d+)\]", loop)
                  for r in range(int(a), int(b) + 1)}
        copied = {int(a) for a in re.findall(r"v_mov_b(?:32|64)_e32 v\S+, v\[?(\d+)", loop)}
        assert not loaded & copied, sorted(loaded & copied)
    if not variant["UE8M0"]:  # software promotion: p * (sfa*sfb) added to the accumulator in fp32
        assert loop.count("v_pk_mul_f32") * 2 + loop.count("v_mul_f32") >= 4 * mfma
        assert "v_fma_f32" not in loop and "v_pk_fma_f32" not in loop  # two roundings, never fused
