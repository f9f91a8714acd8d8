"""mxgemm.deep_gemm's dense and K-grouped FP8 GEMMs (DeepGEMM's signatures) on the emulator:
bit-exact against an independent model of the block-scale promotion, and DeepGEMM's own
accuracy bar (calc_diff < 1e-3) against the unquantised product."""
import pytest
import torch

import mxgemm.deep_gemm as deep_gemm
from mxgemm import formats as F
from mxgemm import reference
from mxgemm.deep_gemm import utils
from mxgemm.guards import GuardError


def promoted(xq, sfa, wq, sfb, k_block=128):
    """fp32 d of DeepGEMM's block promotion, modelled independently: per 128-K block, the exact
    sum of the fp8 products rounded once to fp32, times fp32(sa * sb), added into fp32 from +0.
    xq [M, K], wq [N, K] fp8; sfa [M, kb]; sfb [N, kb] (per row of w, already expanded)."""
    x, w = xq.double(), wq.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for kb in range(-(-x.shape[1] // k_block)):
        blk = slice(kb * k_block, (kb + 1) * k_block)
        p = (x[:, blk] @ w[:, blk].T).float()            # exact in float64, one rounding
        s = (sfa[:, kb, None].float() * sfb[None, :, kb].float())
        acc = acc + p * s
    return acc


def quantised(m, n, k, seed, per_channel_b=False):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    xq, sfa = utils.per_token_cast_to_fp8(a, use_ue8m0=False)
    if per_channel_b:
        wq, sfb = utils.per_token_cast_to_fp8(b, use_ue8m0=False)
        sfb_rows = sfb
    else:
        wq, sfb = utils.per_block_cast_to_fp8(b, use_ue8m0=False)
        sfb_rows = sfb.repeat_interleave(128, 0)[:n]
    return a, b, (xq, sfa), (wq, sfb), promoted(xq, sfa, wq, sfb_rows)


def major(t, k_major):
    """The same matrix K-major (contiguous) or MN-major (a view of a transposed copy)."""
    return t if k_major else t.t().contiguous().t()


@pytest.mark.parametrize("a_k,b_k", [(True, True), (True, False), (False, True), (False, False)],
                         ids=["NT", "NN", "TT", "TN"])
def test_dense_layouts_bit_exact_and_deepgemm_accuracy(a_k, b_k):
    m, n, k = 64, 64, 256
    a, b, (xq, sfa), (wq, sfb), want = quantised(m, n, k, seed=1)
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((major(xq, a_k), major(sfa, a_k)), (major(wq, b_k), sfb), d)
    assert torch.equal(d.view(torch.int16), F.bf16_rne(want).view(torch.int16))
    assert float(utils.calc_diff(d, a @ b.T)) < 1e-3


@pytest.mark.parametrize("same", [True, False], ids=["c-is-d", "c-copied"])
def test_dense_fp32_accumulates_c_per_column_scales(same):
    m, n, k = 64, 64, 384
    a, b, xa, wb, want = quantised(m, n, k, seed=2, per_channel_b=True)
    g = torch.Generator().manual_seed(3)
    c = torch.randn(m, n, generator=g) * 32
    d = c.clone() if same else torch.full((m, n), float("nan"))
    deep_gemm.fp8_gemm_nt(xa, wb, d, c=d if same else c, recipe=(1, 1, 128))
    assert torch.equal(d, want + c)


def test_aliases_transpose_their_operands():
    m, n, k = 64, 64, 256
    a, b, (xq, sfa), (wq, sfb), want = quantised(m, n, k, seed=4)
    expect = F.bf16_rne(want)
    for fn, x, w in ((deep_gemm.fp8_gemm_nn, (xq, sfa), (wq.t().contiguous(), sfb.t())),
                     (deep_gemm.fp8_gemm_tn, (xq.t().contiguous(), sfa.t()), (wq.t().contiguous(), sfb.t())),
                     (deep_gemm.fp8_gemm_tt, (xq.t().contiguous(), sfa.t()), (wq, sfb))):
        d = torch.empty(m, n, dtype=torch.bfloat16)
        fn(x, w, d)
        assert torch.equal(d.view(torch.int16), expect.view(torch.int16)), fn.__name__


def test_k_grouped_tn_accumulates_each_group():
    m, n, ks = 64, 64, [128, 0, 256]
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(sum(ks), m, generator=g), torch.randn(sum(ks), n, generator=g)
    xq, sfa = utils.per_channel_cast_to_fp8(a, use_ue8m0=False)
    wq, sfb = utils.per_channel_cast_to_fp8(b, use_ue8m0=False)
    c = torch.randn(len(ks), m, n, generator=g) * 32
    d = c.clone()
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous((xq, sfa), (wq, sfb), d, ks, torch.tensor(ks, dtype=torch.int32), c=d)
    start = 0
    for i, kg in enumerate(ks):
        blocks = slice(start // 128, (start + kg) // 128)
        rows = slice(start, start + kg)
        want = promoted(xq[rows].t(), sfa[blocks].t(), wq[rows].t(), sfb[blocks].t()) + c[i]
        assert torch.equal(d[i], want), i
        ref = c[i] + a[rows].T @ b[rows]
        assert float(utils.calc_diff(d[i], ref)) < 1e-3
        start += kg


def test_k_grouped_nt_and_psum_forms_match_the_tn_form():
    m, n, ks = 64, 64, [256, 128]
    g = torch.Generator().manual_seed(10)
    a, b = torch.randn(sum(ks), m, generator=g), torch.randn(sum(ks), n, generator=g)
    (xq, sfa), (wq, sfb) = (utils.per_channel_cast_to_fp8(t, use_ue8m0=False) for t in (a, b))
    c = torch.randn(len(ks), m, n, generator=g)
    layout = torch.tensor(ks, dtype=torch.int32)
    want = c.clone()
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous((xq, sfa), (wq, sfb), want, ks, layout, c=want)
    flat = lambda q: torch.cat([q[s:s + k].t().reshape(-1) for s, k in ((0, 256), (256, 128))])  # noqa: E731
    d = torch.empty_like(c)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((flat(xq), sfa.t()), (flat(wq), sfb.t()), d, ks, layout, c=c)
    assert torch.equal(d, want)
    d = c.clone()      # psum: group ends 256 and 384, the second group starting at align(256, 128)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous((xq, sfa), (wq, sfb), d, None, torch.tensor([256, 384], dtype=torch.int32),
                                               c=d, use_psum_layout=True)
    assert torch.equal(d, want)


def test_refusals_leave_d_untouched():
    m, n, k = 64, 64, 256
    _, _, xa, wb, _ = quantised(m, n, k, seed=6)
    d = torch.full((m, n), 7.0)
    c = torch.zeros(m, n)
    with pytest.raises(GuardError, match=r"\[recipe\]"):
        deep_gemm.fp8_gemm_nt(xa, wb, d, c=c, recipe=(1, 128, 32))
    with pytest.raises(GuardError, match=r"\[recipe\]"):
        deep_gemm.fp8_gemm_nt(xa, wb, d, c=c, recipe=(1, 1, 128))        # sfb is 128x128
    with pytest.raises(GuardError, match=r"\[shape\]"):
        deep_gemm.fp8_gemm_nt(xa, wb, torch.zeros(m, n + 1), c=torch.zeros(m, n + 1))
    assert bool((d == 7.0).all())


def test_m_grouped_nn_and_mn_major_weights_match_the_nt_form():
    g = torch.Generator().manual_seed(12)
    G, n, k = 2, 32, 256
    x = torch.randn(256, k, generator=g)
    xa = utils.per_token_cast_to_fp8(x, use_ue8m0=False)
    ws = [utils.per_block_cast_to_fp8(torch.randn(n, k, generator=g), use_ue8m0=False) for _ in range(G)]
    wq, sfb = torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws])
    m_indices = torch.tensor([0] * 100 + [-1] * 28 + [1] * 128, dtype=torch.int32)
    want = torch.zeros(256, n, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(xa, (wq, sfb), want, m_indices)
    d = torch.full((256, n), 3.0, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nn_contiguous(xa, (wq.transpose(1, 2).contiguous(), sfb.transpose(1, 2).contiguous()),
                                               d, m_indices)
    assert torch.equal(d, want)
    d = torch.full((256, n), 3.0, dtype=torch.bfloat16)     # DeepGEMM's SM100 recipe: b.mT.contiguous().mT
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(xa, (wq.mT.contiguous().mT, sfb), d, m_indices)
    assert torch.equal(d, want)


def test_dense_bf16_accumulates_c():
    m, n, k = 64, 64, 256
    _, _, xa, wb, want = quantised(m, n, k, seed=13)
    c = (torch.randn(m, n, generator=torch.Generator().manual_seed(14)) * 32).bfloat16()
    d = c.clone()
    deep_gemm.fp8_gemm_nt(xa, wb, d, c=d)
    assert torch.equal(d.view(torch.int16), F.bf16_rne(want + c.float()).view(torch.int16))


def chunked_bf16(x, w, chunk=32):
    """fp32 x[M, K] . w[N, K]^T of bf16 operands, modelled independently of the kernel: per 32-K
    chunk the exact sum (float64; exact for these magnitudes) rounded once to fp32, the chunks added
    in order into fp32 from +0 (v_mfma_f32_16x16x32_bf16 accumulating)."""
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for k0 in range(0, x.shape[1], chunk):
        acc = acc + (x[:, k0:k0 + chunk].double() @ w[:, k0:k0 + chunk].double().T).float()
    return acc


@pytest.mark.parametrize("a_k,b_k", [(True, True), (True, False), (False, True), (False, False)],
                         ids=["NT", "NN", "TT", "TN"])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_bf16_dense_layouts_bit_exact_with_c(a_k, b_k, out):
    m, n, k = 64, 48, 96
    g = torch.Generator().manual_seed(15)
    x, w = torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()
    c = (torch.randn(m, n, generator=g) * 4).to(out)
    d = torch.full((m, n), float("nan"), dtype=out)
    deep_gemm.bf16_gemm_nt(major(x, a_k), major(w, b_k), d, c=c)
    want = chunked_bf16(x, w) + c.float()
    assert torch.equal(d.float(), want if out == torch.float32 else F.bf16_rne(want).float())
    assert float(utils.calc_diff(d, x.float() @ w.float().T + c.float())) < 1e-5
    for fn, xa, wb in ((deep_gemm.bf16_gemm_nn, x, w.t().contiguous()),
                       (deep_gemm.bf16_gemm_tn, x.t().contiguous(), w.t().contiguous()),
                       (deep_gemm.bf16_gemm_tt, x.t().contiguous(), w)):
        d2 = torch.empty(m, n, dtype=out)
        fn(xa, wb, d2, c=c)
        assert torch.equal(d2, d), fn.__name__


def test_bf16_k_grouped_tn_accumulates_each_group():
    m, n, ks = 32, 48, [128, 0, 256]
    g = torch.Generator().manual_seed(16)
    a, b = torch.randn(sum(ks), m, generator=g).bfloat16(), torch.randn(sum(ks), n, generator=g).bfloat16()
    c = torch.randn(len(ks), m, n, generator=g)
    d = torch.empty_like(c)
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, torch.tensor(ks, dtype=torch.int32), c=c)
    start = 0
    for i, kg in enumerate(ks):
        rows = slice(start, start + kg)
        assert torch.equal(d[i], chunked_bf16(a[rows].t(), b[rows].t()) + c[i]), i
        start += kg
    with pytest.raises(GuardError, match=r"\[c\]"):
        deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, torch.tensor(ks, dtype=torch.int32))
    with pytest.raises(GuardError, match=r"\[dtype\]"):
        deep_gemm.bf16_gemm_nt(a.t().float(), b.t().float(), torch.empty(m, n))


def test_bf16_k_grouped_takes_32_aligned_groups():
    """Without scales the K groups need only DeepGEMM's alignment (a multiple of 32): psum groups
    ending at 40 and 100 start at 0 and 64 with alignment 32, rows 40..63 between them must be
    zeros (refused otherwise)."""
    m, n = 32, 32
    g = torch.Generator().manual_seed(17)
    a, b = torch.randn(100, m, generator=g).bfloat16(), torch.randn(100, n, generator=g).bfloat16()
    c = torch.zeros(2, m, n)
    d = c.clone()
    before = deep_gemm.get_mk_alignment_for_contiguous_layout()
    deep_gemm.set_mk_alignment_for_contiguous_layout(32)
    try:
        with pytest.raises(GuardError, match=r"\[psum-padding\] a rows 40\.\.63"):     # the gap must be zeros
            deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, None, torch.tensor([40, 100], dtype=torch.int32),
                                                        c=d, use_psum_layout=True)
        a[40:64], b[40:64] = 0, 0
        deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, None, torch.tensor([40, 100], dtype=torch.int32), c=d,
                                                    use_psum_layout=True)
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(before)
    for i, rows in enumerate((slice(0, 40), slice(64, 100))):
        assert torch.equal(d[i], chunked_bf16(a[rows].t(), b[rows].t())), i


def test_m_grouped_mn_major_fp4_weights_match_the_k_major_form():
    """DeepGEMM's MN-major FP4 weights (each group's [K, N] e2m1 packed along N, passed as .mT:
    shape [G, N/2, K]) are re-packed along K: the same d as the K-major weights, bit for bit."""
    g = torch.Generator().manual_seed(18)
    G, n, k = 2, 32, 256
    xa = utils.per_token_cast_to_fp8(torch.randn(256, k, generator=g), use_ue8m0=True)
    ws = [utils.per_token_cast_to_fp4(torch.randn(n, k, generator=g), use_ue8m0=True, gran_k=32) for _ in range(G)]
    wq, sfb = torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws])
    mn_major = torch.stack([utils.transpose_packed_fp4(w) for w, _ in ws]).mT        # [G, N/2, K], unit stride on N/2
    m_indices = torch.tensor([0] * 128 + [1] * 128, dtype=torch.int32)
    want = torch.zeros(256, n, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(xa, (wq, sfb), want, m_indices)
    d = torch.full((256, n), 3.0, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(xa, (mn_major, sfb), d, m_indices)
    assert torch.equal(d, want) and want.float().abs().max() > 0


def test_dense_fp8_fp4_nt_is_the_one_group_m_grouped_gemm():
    """fp8_fp4_gemm_nt with FP4 b (M = 96: any M): the masked M-grouped FP8 x FP4 kernel with one
    group (bit-identical to that call), within DeepGEMM's accuracy bar of the dequantised product;
    c refused, d untouched."""
    g = torch.Generator().manual_seed(19)
    m, n, k = 96, 64, 256
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    xa = utils.per_token_cast_to_fp8(x, use_ue8m0=True)
    wq, sfb = utils.per_token_cast_to_fp4(w, use_ue8m0=True, gran_k=32)
    d = torch.full((m, n), 5.0, dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_gemm_nt(xa, (wq, sfb), d)
    want = torch.empty(1, m, n, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked((xa[0][None], xa[1][None]), (wq[None], sfb[None]), want,
                                               torch.tensor([m], dtype=torch.int32), m)
    want = want[0]
    assert torch.equal(d, want)
    deq_x = xa[0].float() * xa[1].repeat_interleave(128, 1)[:, :k]
    assert float(utils.calc_diff(d, deq_x @ utils.cast_back_from_fp4(wq, sfb, gran_k=32).T)) < 1e-3
    with pytest.raises(GuardError, match=r"\[c\]"):
        deep_gemm.fp8_fp4_gemm_nt(xa, (wq, sfb), d, c=torch.zeros(m, n, dtype=torch.bfloat16))
    assert torch.equal(d, want)


def test_k_grouped_ue8m0_per_32_rows_with_compact_scale_rows():
    """recipe (1, 1, 32) (DeepGEMM's SM100 K-grouped recipe: UE8M0 scales per 32 rows, on the scaled
    MFMA) in the psum layout with alignment 128: groups ending at 40 and 200 start at 0 and 128;
    their scales come as DeepGEMM's casts make them, ceil(k / 32) rows per group one after another
    (2 + 3 rows), which the kernel reads at rows 0-1 and 4-6. Bit-exact against the reference fed
    the scales at those rows (its first group spanning the zero gap rows 40-127, as the op's does);
    DeepGEMM's bar against the unquantised product."""
    m, n, ends = 32, 64, [40, 200]
    g = torch.Generator().manual_seed(21)
    a, b = torch.zeros(200, m), torch.zeros(200, n)
    groups = [(0, 40), (128, 200)]
    for s, e in groups:
        a[s:e], b[s:e] = torch.randn(e - s, m, generator=g), torch.randn(e - s, n, generator=g)

    def cast(x):   # per group, padded to whole 32-row blocks (DeepGEMM's K-grouped cast)
        qs, sfs = torch.zeros(x.shape, dtype=torch.float8_e4m3fn), []
        for s, e in groups:
            xp = torch.zeros(-(-(e - s) // 32) * 32, x.shape[1])
            xp[:e - s] = x[s:e]
            q, sf = utils.per_channel_cast_to_fp8(xp, use_ue8m0=True, gran_k=32)
            qs[s:e], _ = q[:e - s], sfs.append(sf)
        return qs, torch.cat(sfs)

    (xq, sfa), (wq, sfb) = cast(a), cast(b)
    assert sfa.shape == (5, m)
    c = torch.randn(2, m, n, generator=g)
    d = c.clone()
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous((xq, sfa), (wq, sfb), d, None, torch.tensor(ends, dtype=torch.int32),
                                               c=d, recipe=(1, 1, 32), use_psum_layout=True)
    codes = lambda sf: ((sf.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)  # noqa: E731
    at = lambda sf: torch.cat([sf[0:2], torch.ones(2, sf.shape[1]), sf[2:5], torch.ones(1, sf.shape[1])])  # noqa: E731
    want = reference.grouped_gemm_fp8_variable_k_ref(xq, codes(at(sfa)).t(), wq, codes(at(sfb)).t(),
                                                     torch.tensor([0, 128, 200]), torch.float32, accumulate_into=c)
    assert torch.equal(d, want)
    for i, (s, e) in enumerate(groups):
        assert float(utils.calc_diff(d[i], c[i] + a[s:e].T @ b[s:e])) < 1e-3


def test_k_grouped_alignment_not_a_multiple_of_the_scale_block():
    """Alignment 160 with 128-row scales (DeepGEMM allows it): groups of K 160 and 320 start at 0 and
    160, not multiples of 128; they run copied to 128-aligned segments, with the same d as the
    groups laid out 128-aligned by hand (bit for bit)."""
    m, n, ks = 32, 32, [160, 320]
    g = torch.Generator().manual_seed(22)
    a, b = torch.randn(480, m, generator=g), torch.randn(480, n, generator=g)

    def cast(x):     # per group, padded to whole 128-row blocks, scale rows one group after another
        qs, sfs = [], []
        for s, k in ((0, 160), (160, 320)):
            xp = torch.zeros(-(-k // 128) * 128, x.shape[1])
            xp[:k] = x[s:s + k]
            q, sf = utils.per_channel_cast_to_fp8(xp, use_ue8m0=False)
            qs.append(q[:k]), sfs.append(sf)
        return torch.cat(qs), torch.cat(sfs)

    (xq, sfa), (wq, sfb) = cast(a), cast(b)
    c = torch.randn(2, m, n, generator=g)
    d = c.clone()
    before = deep_gemm.get_mk_alignment_for_contiguous_layout()
    deep_gemm.set_mk_alignment_for_contiguous_layout(160)
    try:
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous((xq, sfa), (wq, sfb), d, ks, torch.tensor(ks, dtype=torch.int32),
                                                   c=d)
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(before)
    pad = lambda q: torch.cat([q[:160], torch.zeros(96, q.shape[1]).to(q.dtype), q[160:]])  # noqa: E731
    want = c.clone()
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous((pad(xq), sfa), (pad(wq), sfb), want, None,
                                               torch.tensor([160, 576], dtype=torch.int32), c=want,
                                               use_psum_layout=True)
    assert torch.equal(d, want)
    for i, (s, k) in enumerate(((0, 160), (160, 320))):
        assert float(utils.calc_diff(d[i], c[i] + a[s:s + k].T @ b[s:s + k])) < 1e-3
