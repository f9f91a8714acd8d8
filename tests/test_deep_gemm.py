"""DeepGEMM-compatible FP8 block-scale grouped GEMMs (kernel family deep_gemm_fp8) and the
mxgemm.deep_gemm helpers.

Spec: inputs are built the way DeepGEMM's own tests build them (per-token cast of A, per-block
cast of B, fp32 product of the dequantised inputs as the loose check, calc_diff < 1e-3), and
every row the kernel writes is bit-identical to mxgemm.reference (the kernel promotes each
128-K block exactly as the reference models it, for fp32 and e8m0 scales alike). Rows of no
group (m_indices == -1) and rows past masked_m stay untouched. Every kernel run goes through
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

KERNEL = "deep_gemm_fp8"
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


def run_contiguous(variant, a, sfa, b, sfb, d, m_indices):
    call, kw = ((a, sfa), (b, sfb), d, m_indices), {"config": tile(variant)}
    assert deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_contiguous, *call, **kw).variant == \
        {**variant, "MASKED": 0}
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(*call, **kw)


def run_masked(variant, a, sfa, b, sfb, d, masked_m, expected_m):
    call, kw = ((a, sfa), (b, sfb), d, masked_m, expected_m), {"config": tile(variant)}
    assert deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_masked, *call, **kw).variant == \
        {**variant, "MASKED": 1}
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


def _check(d, ref, written, fp32_product, name):
    """Written rows: bit-identical to the reference and within DeepGEMM's calc_diff < 1e-3 of
    the fp32 product; every other row still holds the sentinel."""
    assert torch.equal(d[written].view(torch.int16), ref[written].view(torch.int16)), \
        f"{name}: {int((d[written] != ref[written]).sum())} elements differ from the reference"
    assert bool((d[~written] == SENTINEL).all()), f"{name}: rows outside the groups were written"
    diff = utils.calc_diff(d[written], fp32_product[written]).item()
    assert diff < 1e-3, f"{name}: calc_diff {diff}"


# (variant, group row counts, N, activation-scale layout): every small variant on 4 groups with an
# empty one and unaligned sizes; 1 and 8 groups and MN-major scales on some; the 128 x 128 and
# 128 x 64 tiles once each.
CONTIGUOUS = [(v, [100, 0, 37, 128], 64, "row") for v in SMALL] + [
    (SMALL[0], [45], 32, "mn"), (SMALL[3], [3, 0, 17, 1, 0, 30, 9, 2], 32, "mn"),
    (dict(BM=128, BN=128, UE8M0=0, OUT="bf16"), [100, 128], 128, "row"),
    (dict(BM=128, BN=64, UE8M0=1, OUT="bf16"), [100, 128], 64, "row")]


@pytest.mark.parametrize("variant,group_rows,n,sfa_layout", CONTIGUOUS,
                         ids=[f"{registry.variant_id(v)}-G{len(g)}-{s}" for v, g, _, s in CONTIGUOUS])
def test_contiguous_matches_reference(variant, group_rows, n, sfa_layout):
    ue8m0, out = variant["UE8M0"], OUT_DTYPE[variant["OUT"]]
    x, w, m_indices = contiguous_case(group_rows, n=n, k=256, seed=len(group_rows) + ue8m0)
    a, sfa, b, sfb = quantize(x, w, ue8m0)
    sfa = mn_major(sfa) if sfa_layout == "mn" else sfa
    d = torch.full((len(m_indices), n), SENTINEL, dtype=out)
    run_contiguous(variant, a, sfa, b, sfb, d, m_indices)
    ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, m_indices, out)
    fp32_product = torch.einsum("mk,mnk->mn", x, w[m_indices.clamp(min=0).long()])
    _check(d, ref, m_indices >= 0, fp32_product, f"contiguous {variant}")


PARTIAL_K = [(SMALL[0], 0, 336), (SMALL[3], 1, 208), (dict(BM=128, BN=64, UE8M0=1, OUT="bf16"), 0, 336)]


@pytest.mark.parametrize("variant,masked,k", PARTIAL_K,
                         ids=[f"{registry.variant_id(v)}-{'masked' if m else 'contiguous'}-K{k}"
                              for v, m, k in PARTIAL_K])
def test_partial_last_k_block_matches_reference(variant, masked, k):
    """K % 128 != 0 (K % 16 == 0): the last K block holds K % 128 elements, scales ceil(K/128)."""
    ue8m0, out, n = variant["UE8M0"], OUT_DTYPE[variant["OUT"]], variant["BN"] * 2
    g = torch.Generator().manual_seed(k)
    if masked:
        x, w = torch.randn(3, 40, k, generator=g), torch.randn(3, n, k, generator=g)
        masked_m = torch.tensor([40, 0, 23], dtype=torch.int32)
        written = torch.arange(40)[None, :] < masked_m[:, None]
    else:
        x, w, m_indices = contiguous_case([100, 0, 37], n=n, k=k, seed=k)
        written = m_indices >= 0
    a, sfa, b, sfb = quantize(x, w, ue8m0)
    assert sfa.shape[-1] == sfb.shape[-1] == -(-k // 128)
    d = torch.full((*x.shape[:-1], n), SENTINEL, dtype=out)
    if masked:
        run_masked(variant, a, sfa, b, sfb, d, masked_m, 32)
        ref, product = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, masked_m, out), \
            torch.einsum("gmk,gnk->gmn", x, w)
    else:
        run_contiguous(variant, a, sfa, b, sfb, d, m_indices)
        ref, product = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, m_indices, out), \
            torch.einsum("mk,mnk->mn", x, w[m_indices.clamp(min=0).long()])
    _check(d, ref, written, product, f"K={k} {variant}")


MASKED = [(v, "row") for v in SMALL] + [(SMALL[1], "mn")]


@pytest.mark.parametrize("variant,sfa_layout", MASKED, ids=[f"{registry.variant_id(v)}-{s}" for v, s in MASKED])
def test_masked_matches_reference(variant, sfa_layout):
    ue8m0, out = variant["UE8M0"], OUT_DTYPE[variant["OUT"]]
    G, m_max, n, k = 4, 46, 64, 256
    g = torch.Generator().manual_seed(2 + ue8m0)
    x, w = torch.randn(G, m_max, k, generator=g), torch.randn(G, n, k, generator=g)
    masked_m = torch.tensor([46, 0, 17, 33], dtype=torch.int32)  # full, empty, partial tiles
    a, sfa, b, sfb = quantize(x, w, ue8m0)
    sfa = mn_major(sfa) if sfa_layout == "mn" else sfa
    d = torch.full((G, m_max, n), SENTINEL, dtype=out)
    run_masked(variant, a, sfa, b, sfb, d, masked_m, 32)
    ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, masked_m, out)
    written = torch.arange(m_max)[None, :] < masked_m[:, None]
    _check(d, ref, written, torch.einsum("gmk,gnk->gmn", x, w), f"masked {variant}")


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
    assert bool((d[~written] == SENTINEL).all())
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
    assert bool((out[~real] == SENTINEL).all())

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
    ("b-contiguity", 0, lambda t: {**t, "b": t["b"].transpose(1, 2).contiguous().transpose(1, 2)}, "contiguity",
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
    with pytest.raises(guards.GuardError, match=r"\[args\] a must be a \(fp8 tensor, scales\) pair"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(t["a"], (t["b"], t["sfb"]), t["d"], t["layout"])
    t = _valid(masked=True)
    with pytest.raises(guards.GuardError, match=r"\[expected_m\]"):
        deep_gemm.m_grouped_fp8_gemm_nt_masked((t["a"], t["sfa"]), (t["b"], t["sfb"]), t["d"], t["layout"], -1)
    assert bool((t["d"] == SENTINEL).all())


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
    assert p.kernel == KERNEL and p.variant == dict(BM=32, BN=32, MASKED=0, UE8M0=0, OUT="bf16")
    assert "contiguous layout, fp32 scales" in str(p) and "config given by the caller" in str(p)
    assert p.grid == (2, 8, 1)
    t = _valid(masked=True, n=128)
    p = deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_masked, (t["a"], t["sfa"]), (t["b"], t["sfb"]),
                          t["d"], t["layout"], 16, config={"BM": 128, "BN": 128})
    assert p.variant == dict(BM=128, BN=128, MASKED=1, UE8M0=0, OUT="bf16") and p.grid == (1, 2, 1)
    assert "masked layout" in str(p)


def test_default_tile_heuristic():
    """Deterministic default: the largest tile whose grid fills the MI355X's 256 CUs, else the
    one with the most workgroups; 32 x 32 only when no larger tile divides N; 128 x 64 is bf16 only."""
    def plan(rows, n, out=torch.bfloat16, masked=False):
        G, k = 8, 256
        a = torch.empty(G, rows, k) if masked else torch.empty(rows, k)
        args = (a.to(torch.float8_e4m3fn), torch.empty(*a.shape[:-1], 2), torch.empty(G, n, k).to(torch.float8_e4m3fn),
                torch.empty(G, -(-n // 128), 2), torch.zeros(G if masked else rows, dtype=torch.int32),
                torch.empty(*a.shape[:-1], n, dtype=out))
        p = mxgemm.explain("deep_gemm_fp8_grouped_gemm", *args, masked=masked)
        return f"{p.variant['BM']}x{p.variant['BN']}", p.grid
    # DeepSeek-V3, 8 groups padded to 128 rows: N = 7168 fills the GPU with 128 x 128 tiles at 64
    # rows per group; N = 2048 needs 128 x 64 tiles until 256 rows per group
    assert plan(8 * 128, 7168) == ("128x128", (56, 8, 1))
    assert plan(8 * 128, 2048) == ("128x64", (32, 8, 1))
    assert plan(8 * 256, 2048) == ("128x128", (16, 16, 1))
    assert plan(64, 2048, masked=True) == ("128x64", (32, 8, 1))
    assert plan(8 * 128, 2048, out=torch.float16) == ("128x128", (16, 8, 1))   # no f16 128 x 64
    assert plan(8 * 128, 96) == ("32x32", (3, 32, 1))
    with pytest.raises(guards.GuardError, match=r"\[config\] tile 128x64 is not a registered tile dividing N = 96"):
        t = _valid(n=96)
        mxgemm.explain("deep_gemm_fp8_grouped_gemm", *(t[k] for k in ("a", "sfa", "b", "sfb", "layout", "d")),
                       config="BM=128,BN=64")


# ---- code objects ----
def loop_bodies(asm: str) -> list[str]:
    """Instructions of every loop: from a label to a later conditional branch back to it."""
    lines = [l.strip() for l in asm.splitlines()]
    labels = {l[:-1]: i for i, l in enumerate(lines) if re.fullmatch(r"\.LBB\d+_\d+:", l)}
    body = []
    for i, l in enumerate(lines):
        m = re.match(r"s_cbranch_\w+\s+(\.LBB\d+_\d+)", l)
        if m and labels.get(m.group(1), i) < i:
            body += lines[labels[m.group(1)]:i]
    return body


@pytest.mark.parametrize("variant", registry.get(KERNEL).variants, ids=registry.variant_id)
def test_code_object_spill_free_with_mfma_and_promotion_in_the_loop(variant):
    art = build.artifact(KERNEL, variant)
    info = art.isa()
    print(f"\n{KERNEL} [{registry.variant_id(variant)}]: {info.summary(256)}")
    assert info.spills == 0 and info.scratch_bytes == 0
    assert info.lds_bytes == 2 * variant["BM"] * 128          # two A buffers of BM x 128 bytes
    assert info.occupancy(256) >= 2
    tiles = (variant["BM"] // 32) * (variant["BN"] // 32)     # 16x16 MFMA tiles per wave
    rows_per_pass = 256 // (variant["BN"] // 8)               # CShuffle: one 16-byte row chunk per thread
    assert info.count("buffer_store_dwordx4") == -(-variant["BM"] // rows_per_pass)
    assert info.count("buffer_store_dwordx2") == 0 and info.count("ds_write_b64") == tiles
    loop = " ".join(loop_bodies(art.asm))
    mfma = loop.count("v_mfma_scale_f32_16x16x128_f8f6f4")
    assert mfma >= tiles and mfma % tiles == 0               # one MFMA per tile per K block (unrolled)
    if not variant["UE8M0"]:  # software promotion: p * (sfa*sfb) added to the accumulator in fp32
        assert loop.count("v_pk_mul_f32") * 2 + loop.count("v_mul_f32") >= 4 * mfma
        assert "v_fma_f32" not in loop and "v_pk_fma_f32" not in loop  # two roundings, never fused
