"""mxgemm.deep_gemm.einsum / fp8_einsum / cublaslt_gemm_* (DeepGEMM's signatures) on the emulator:
each head's (or the batch-summed) product bit-exact against the independent chunked models of
test_deep_gemm_dense, built per head from the original tensors."""
import pytest
import torch
from test_deep_gemm_dense import chunked_bf16, promoted

import mxgemm.deep_gemm as deep_gemm
from mxgemm import formats as F
from mxgemm import reference
from mxgemm.deep_gemm import utils
from mxgemm.guards import GuardError


def bf16(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_bmk_bnk_mn_sums_the_batch(out):
    s, m, n, k = 3, 32, 48, 64
    a, b = bf16(s, m, k, seed=1), bf16(s, n, k, seed=2)
    # one contraction over (b, k), batch by batch: its 32-K chunks (k % 32 == 0) in that order
    want = chunked_bf16(torch.cat(list(a), dim=1), torch.cat(list(b), dim=1))
    if out == torch.float32:
        d = (torch.randn(m, n, generator=torch.Generator().manual_seed(3)) * 4)
        want = d + want
        deep_gemm.einsum("bmk,bnk->mn", a, b, d, c=d)
        assert torch.equal(d, want)
    else:
        d = torch.empty(m, n, dtype=torch.bfloat16)
        deep_gemm.einsum("bmk,bnk->mn", a, b, d)
        assert torch.equal(d.view(torch.int16), F.bf16_rne(want).view(torch.int16))


@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_per_head_einsum_with_a_strided_weight(expr):
    bsz, h, r, dd = 32, 2, 64, 32
    contraction = r if expr == "bhr,hdr->bhd" else dd
    x = bf16(bsz, h, contraction, seed=4)
    y = bf16(h, dd, r + 32, seed=5)[:, :, :r]   # a view with padded rows, as DeepGEMM's test passes
    n = dd if expr == "bhr,hdr->bhd" else r
    z = torch.full((bsz, h, n), float("nan"), dtype=torch.bfloat16)
    deep_gemm.einsum(expr, x, y, z)
    for i in range(h):
        w = y[i] if expr == "bhr,hdr->bhd" else y[i].t()
        assert torch.equal(z[:, i].view(torch.int16), F.bf16_rne(chunked_bf16(x[:, i], w)).view(torch.int16)), i
    assert float(utils.calc_diff(z, torch.einsum(expr, x.double(), y.double()))) < 1e-5


@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_fp8_einsum_per_head_block_scales(expr):
    bsz, h, r, dd = 32, 2, 256, 128
    g = torch.Generator().manual_seed(6)
    x_contraction = r if expr == "bhr,hdr->bhd" else dd
    x, y = torch.randn(bsz, h, x_contraction, generator=g), torch.randn(h, dd, r, generator=g)
    xq, sfa = utils.per_token_cast_to_fp8(x.view(-1, x_contraction), use_ue8m0=False)
    xq, sfa = xq.view(bsz, h, x_contraction), sfa.view(bsz, h, -1)
    wq = torch.empty(h, dd, r, dtype=torch.float8_e4m3fn)
    sfb = torch.empty(h, dd // 128, r // 128)
    for i in range(h):
        wq[i], sfb[i] = utils.per_block_cast_to_fp8(y[i], use_ue8m0=False)
    n = dd if expr == "bhr,hdr->bhd" else r
    z = torch.full((bsz, h, n), float("nan"), dtype=torch.bfloat16)
    deep_gemm.fp8_einsum(expr, (xq, sfa), (wq, sfb), z)
    for i in range(h):
        w, s = (wq[i], sfb[i]) if expr == "bhr,hdr->bhd" else (wq[i].t().contiguous(), sfb[i].t().contiguous())
        want = reference.m_grouped_fp8_gemm_nt_masked_ref(xq[:, i][None], sfa[:, i][None], w[None], s[None],
                                                           torch.tensor([bsz], dtype=torch.int32))[0]
        assert torch.equal(z[:, i], want), i
    assert float(utils.calc_diff(z, torch.einsum(expr, x, y))) < 1e-3


def test_fp8_einsum_per_head_wgrad_accumulates_into_c():
    """'bhd,bhr->hdr' (DeepGEMM's SM100 form, per-channel scales per 128 rows of b): each head's
    product promoted per 128-row block of the contraction, added to c."""
    bsz, h, dd, r = 256, 2, 64, 32
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(bsz, h, dd, generator=g), torch.randn(bsz, h, r, generator=g)
    xq, sfa = utils.per_channel_cast_to_fp8(x.view(bsz, -1), use_ue8m0=True)
    yq, sfb = utils.per_channel_cast_to_fp8(y.view(bsz, -1), use_ue8m0=True)
    xq, sfa, yq, sfb = xq.view(bsz, h, dd), sfa.view(-1, h, dd), yq.view(bsz, h, r), sfb.view(-1, h, r)
    z0 = torch.randn(h, dd, r, generator=g) * 10
    z = z0.clone()
    deep_gemm.fp8_einsum("bhd,bhr->hdr", (xq, sfa), (yq, sfb), z, z, recipe=(1, 1, 128))
    for i in range(h):
        want = promoted(xq[:, i].t(), sfa[:, i].t(), yq[:, i].t(), sfb[:, i].t()) + z0[i]
        assert torch.equal(z[i], want), i
    assert float(utils.calc_diff(z, z0 + torch.einsum("bhd,bhr->hdr", x, y))) < 1e-3


def test_cublaslt_gemms_are_the_bf16_dense_gemms():
    m, n, k = 32, 32, 64
    a, b = bf16(m, k, seed=7), bf16(n, k, seed=8)
    want = F.bf16_rne(chunked_bf16(a, b))
    for fn, xa, wb in ((deep_gemm.cublaslt_gemm_nt, a, b), (deep_gemm.cublaslt_gemm_nn, a, b.t().contiguous()),
                       (deep_gemm.cublaslt_gemm_tn, a.t().contiguous(), b.t().contiguous()),
                       (deep_gemm.cublaslt_gemm_tt, a.t().contiguous(), b)):
        d = torch.empty(m, n, dtype=torch.bfloat16)
        fn(xa, wb, d)
        assert torch.equal(d.float(), want.float()), fn.__name__


def test_cublaslt_gemm_takes_unscaled_e4m3():
    """cuBLASLt's FP8 path (DeepGEMM's fp8_fp4 test benchmarks against it): e4m3 a and b, no
    scales, fp32 d accumulated onto c, each 128-K block's exact sum rounded to fp32 and added."""
    m, n, k = 32, 48, 256
    g = torch.Generator().manual_seed(12)
    a, b = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn), \
        (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    c = torch.randn(m, n, generator=g)
    d = torch.empty(m, n)
    deep_gemm.cublaslt_gemm_nt(a, b, d, c=c)
    want = promoted(a, torch.ones(m, k // 128), b, torch.ones(n, k // 128)) + c
    assert torch.equal(d, want)
    d2 = torch.empty(m, n)
    deep_gemm.cublaslt_gemm_tn(a.t().contiguous(), b.t().contiguous(), d2, c=c)
    assert torch.equal(d2, want)
    d3, c3 = torch.empty(m, n, dtype=torch.bfloat16), c.bfloat16()
    deep_gemm.cublaslt_gemm_nt(a, b, d3, c=c3)
    want3 = promoted(a, torch.ones(m, k // 128), b, torch.ones(n, k // 128)) + c3.float()
    assert torch.equal(d3.view(torch.int16), F.bf16_rne(want3).view(torch.int16))
    before = d3.clone()
    with pytest.raises(GuardError, match=r"\[shape\]"):     # a c that would broadcast is refused, d untouched
        deep_gemm.cublaslt_gemm_nt(a, b, d3, c=c3[:1])
    assert torch.equal(d3, before)


@pytest.mark.parametrize("call,rule", [
    (lambda a, b, d: deep_gemm.einsum("bik,bjk->ij", a, b, d), "expr"),
    (lambda a, b, d: deep_gemm.einsum("bmk,bnk->mn", a, b, d.float()), "c"),
    (lambda a, b, d: deep_gemm.einsum("bmk,bnk->mn", a, b, d, use_cublaslt=True), "use_cublaslt"),
    (lambda a, b, d: deep_gemm.einsum("bmk,bnk->mn", a.float(), b, d), "dtype"),
    (lambda a, b, d: deep_gemm.fp8_einsum("bhd,hdr->bhd", (a, None), (b, None), d), "expr"),
])
def test_refusals_name_the_rule_and_leave_d_untouched(call, rule):
    a, b = bf16(2, 32, 64, seed=9), bf16(2, 32, 64, seed=10)
    d = torch.full((32, 32), 7.0, dtype=torch.bfloat16)
    with pytest.raises(GuardError, match=rf"\[{rule}\]"):
        call(a, b, d)
    assert bool((d == 7).all())
