"""mxgemm.grouped_gemm_fp4, Primus-Turbo's differentiable MXFP4 grouped GEMM, on the emulator.

The expected operands are built here from the recipe (docs/primus_turbo_fp4.md), not by the op's
helpers: e8m0 scales by Primus-Turbo's rule written with frexp (amax rounded half-up to one
mantissa bit, then 2^(floor(log2) - 2)), e2m1 codes by formats.encode, a's and b's forward
blocks 1 x 32 and 32 x 32, the wgrad's operands padded per group to 32 rows by a Python loop and
multiplied by the 16-point Sylvester Hadamard matrix / 4 in float64 (the inputs are multiples of
1/4 below 16, so every sum is exact and the op's fp32 butterflies must give the same values).
Forward, dgrad and wgrad are then bit-exact against mxgemm.reference on those operands; on
Gaussian inputs the three are above Primus-Turbo's SNR bar (8 dB, tests/pytorch/ops/
test_grouped_gemm_fp4.py) against the float64 unquantised product.
"""
import types

import pytest
import torch

import mxgemm
from mxgemm import formats, metrics, reference
from mxgemm.guards import GuardError

PRIMUS_SNR_DB = 8.0    # Primus-Turbo's SNR_THRESHOLD for its MXFP4 grouped GEMM


def e8m0(amax):
    """Primus-Turbo's e8m0 code of a block amax: 2^(E - 2), E = floor(log2 amax) after rounding amax
    half-up to one mantissa bit (a mantissa of 1.75 or more carries into the exponent)."""
    m, e = torch.frexp(amax.double())
    exp = torch.where(amax == 0, -127, (e - 1 + (2 * m >= 1.75).long()) - 2).clamp(-127, 127)
    return (exp + 127).to(torch.uint8)


def quantise(x, rows):
    """x [..., R, C] -> (packed e2m1 [..., R, C/2], e8m0 [..., R, C/32]) in blocks of rows x 32."""
    *lead, R, C = x.shape
    xb = x.double().reshape(*lead, R // rows, rows, C // 32, 32)
    code = e8m0(xb.abs().amax((-3, -1)))
    scaled = xb / torch.exp2(code.double() - 127)[..., :, None, :, None]
    q = formats.pack_fp4(formats.encode(scaled.float().reshape(x.shape), "e2m1", saturate=True))
    return q, code.repeat_interleave(rows, -2)


H16 = torch.ones(1, 1, dtype=torch.float64)
for _ in range(4):
    H16 = torch.cat([torch.cat([H16, H16], 1), torch.cat([H16, -H16], 1)])


def wgrad_operand(x, lens):
    """x [rows, C]: each group's rows zero-padded to a multiple of 32, concatenated, times H16 / 4
    per 16 rows, quantised per 32 rows -> (packed [C, P/2], e8m0 [C, P/32], padded offsets)."""
    segs, offs, start = [], [0], 0
    for n in lens:
        seg = torch.zeros(-(-n // 32) * 32, x.shape[1], dtype=torch.float64)
        seg[:n] = x[start:start + n].double()
        segs.append(seg)
        offs.append(offs[-1] + seg.shape[0])
        start += n
    t = torch.cat(segs).T
    t = (t.reshape(t.shape[0], -1, 16) @ (H16 / 4)).reshape(t.shape)
    q, s = quantise(t, 1)
    return q, s, torch.tensor(offs)


def grid(g, *shape, dtype=torch.bfloat16):
    """Multiples of 1/4 in (-16, 16): exact in bf16 / fp16, Hadamard sums exact in fp32."""
    return (torch.randint(-63, 64, shape, generator=g) / 4).to(dtype)


def run(a, b, lens, dy, **kw):
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = mxgemm.grouped_gemm_fp4(a, b, torch.tensor(lens), **kw)
    y.backward(dy)
    return y.detach(), a.grad, b.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_dgrad_wgrad_bit_exact(dtype):
    g = torch.Generator().manual_seed(0)
    lens, N, K = [40, 0, 56], 64, 96
    a, b, dy = grid(g, sum(lens), K, dtype=dtype), grid(g, 3, N, K, dtype=dtype), grid(g, sum(lens), N, dtype=dtype)
    y, ga, gb = run(a, b, lens, dy)
    offs = torch.tensor([0, 40, 40, 96])
    qa, sa = quantise(a, 1)
    qb, sb = quantise(b, 32)
    metrics.assert_bitwise_equal(y, reference.grouped_gemm_fp4_ref(qa, sa, qb, sb, offs, dtype), "forward")
    qg, sg = quantise(dy, 1)
    qbt, sbt = quantise(b.mT.contiguous(), 32)
    metrics.assert_bitwise_equal(ga, reference.grouped_gemm_fp4_ref(qg, sg, qbt, sbt, offs, dtype), "dgrad")
    (qgc, sgc, woffs), (qac, sac, _) = wgrad_operand(dy, lens), wgrad_operand(a, lens)
    want = reference.grouped_gemm_fp4_variable_k_ref(qgc, sgc, qac, sac, woffs, dtype)
    metrics.assert_bitwise_equal(gb, want, "wgrad")
    assert not gb[1].any()    # the empty group's gradient

    main_grad = grid(g, 3, N, K, dtype=dtype)    # Megatron's fusion: main_grad += the wgrad in the epilogue
    b2 = b.clone().requires_grad_()
    b2.main_grad, b2.grad_added_to_main_grad = main_grad.clone(), False
    a2 = a.clone().requires_grad_()
    y2 = mxgemm.grouped_gemm_fp4(a2, b2, torch.tensor(lens), fuse_bgrad_accum_pattern="megatron")
    assert b2.grad_added_to_main_grad is True
    y2.backward(dy)
    metrics.assert_bitwise_equal(y2.detach(), y, "fused forward")
    metrics.assert_bitwise_equal(a2.grad, ga, "fused dgrad")
    want = reference.grouped_gemm_fp4_variable_k_ref(qgc, sgc, qac, sac, woffs, dtype, accumulate_into=main_grad)
    metrics.assert_bitwise_equal(b2.main_grad, want, "main_grad + wgrad")
    assert b2.grad.shape == b.shape and b2.grad.dtype == dtype and not b2.grad.any()


def test_snr_zero_groups_tail_and_repeats():
    """Gaussians, groups [0, 50, 0, 46] and 4 padded tail rows: out, grad_a and grad_b above
    Primus-Turbo's bar against float64; empty groups' grad_b and the tail's out / grad_a rows
    exactly 0; a second call bit-identical."""
    g = torch.Generator().manual_seed(1)
    lens, N, K = [0, 50, 0, 46], 64, 128
    a, b = torch.randn(100, K, generator=g).bfloat16(), torch.randn(4, N, K, generator=g).bfloat16()
    dy = torch.randn(100, N, generator=g).bfloat16()
    y, ga, gb = run(a, b, lens, dy)
    offs = [0, 0, 50, 50, 96]
    ad, bd, dyd = a.double(), b.double(), dy.double()
    want_y = torch.zeros(100, N, dtype=torch.float64)
    want_ga = torch.zeros(100, K, dtype=torch.float64)
    want_gb = torch.zeros(4, N, K, dtype=torch.float64)
    for i in range(4):
        r = slice(offs[i], offs[i + 1])
        want_y[r], want_ga[r], want_gb[i] = ad[r] @ bd[i].T, dyd[r] @ bd[i], dyd[r].T @ ad[r]
    for name, got, want in (("out", y, want_y), ("grad_a", ga, want_ga), ("grad_b", gb, want_gb)):
        assert metrics.snr_db(got, want) > PRIMUS_SNR_DB, name
    assert not y[96:].any() and not ga[96:].any() and not gb[0].any() and not gb[2].any()
    for first, again in zip((y, ga, gb), run(a, b, lens, dy)):
        metrics.assert_bitwise_equal(again, first, "repeat")


class QuantizedTensor(torch.Tensor):
    """Primus-Turbo's QuantizedTensor as the op sees it: the original dtype and shape, e2m1 qdata,
    e8m0 scale_inv, granularity and block_size; its own elements are zeros, so an op reading them
    instead of qdata computes zeros."""

    @staticmethod
    def __new__(cls, hp, qdata, scale_inv, granularity="MX_BLOCKWISE", block_size=32):
        t = torch.Tensor._make_subclass(cls, torch.zeros_like(hp), True)
        t.qdata, t.scale_inv, t.block_size = qdata, scale_inv, block_size
        t.granularity = types.SimpleNamespace(name=granularity)
        return t


def test_pre_quantised_inputs():
    """QuantizedTensor a (1 x 32) and b (32 x 32 tiles, Primus-Turbo's weight recipe): qdata serves
    the forward; the backward re-quantises the dequantised values, so the call equals the plain op
    on those values, bit for bit."""
    g = torch.Generator().manual_seed(2)
    lens, N, K = [32, 32], 32, 64
    a, b, dy = grid(g, 64, K), grid(g, 2, N, K), grid(g, 64, N)
    qa, qb = QuantizedTensor(a, *quantise(a, 1)), QuantizedTensor(b, *quantise(b, 32))
    yq = mxgemm.grouped_gemm_fp4(qa, qb, torch.tensor(lens))
    yq.backward(dy)
    deq = [mxgemm.quant.dequantize_mx(t.qdata, t.scale_inv, "e2m1").bfloat16() for t in (qa, qb)]
    for name, got, want in zip(("forward", "grad_a", "grad_b"), (yq.detach(), qa.grad, qb.grad), run(*deq, lens, dy)):
        metrics.assert_bitwise_equal(got, want, name)
    metrics.assert_bitwise_equal(yq.detach(), run(a, b, lens, dy)[0], "forward vs the op's own quantisation")


def test_refusals_name_the_rule_and_touch_nothing():
    g = torch.Generator().manual_seed(3)
    a, b, lens = torch.randn(64, 64, generator=g).bfloat16(), torch.randn(2, 64, 64, generator=g).bfloat16(), \
        torch.tensor([32, 32])
    cfg = types.SimpleNamespace(granularity=types.SimpleNamespace(name="MX_BLOCKWISE"),
                                format=types.SimpleNamespace(name="E2M1_X2"), block_size=32,
                                scale_dtype=types.SimpleNamespace(name="E8M0"), use_gradient_sr=False,
                                use_preshuffle=False)
    cases = [
        (dict(trans_b=False), r"\[trans_b\] trans_b = False"),
        (dict(out_dtype=torch.float32), r"\[dtype\] out_dtype is torch.float32"),
        (dict(config=types.SimpleNamespace(**{**vars(cfg), "use_gradient_sr": True})),
         r"\[use_gradient_sr\] config.use_gradient_sr = True"),
        (dict(config=types.SimpleNamespace(**{**vars(cfg), "granularity": "BLOCKWISE"})),
         r"\[granularity\] config.granularity = 'BLOCKWISE'"),
        (dict(config=types.SimpleNamespace(**{**vars(cfg), "block_size": 16})), r"\[block_size\]"),
        (dict(fuse_bgrad_accum_pattern="deepspeed"), r"\[fuse_bgrad_accum_pattern\]"),
    ]
    for kw, match in cases:
        with pytest.raises(GuardError, match=match):
            mxgemm.grouped_gemm_fp4(a, b, lens, **kw)
    with pytest.raises(GuardError, match=r"\[K%32\] K = 48"):
        mxgemm.grouped_gemm_fp4(a[:, :48], b[..., :48], lens)
    with pytest.raises(GuardError, match=r"\[N%32\] N = 48"):
        mxgemm.grouped_gemm_fp4(a, b[:, :48], lens)
    with pytest.raises(GuardError, match=r"\[granularity\] a is quantised BLOCKWISE"):
        mxgemm.grouped_gemm_fp4(QuantizedTensor(a, *quantise(a, 1), granularity="BLOCKWISE"), b, lens)
    for main_grad, match in ((torch.zeros(2, 64, 32).bfloat16(), r"\[shape\] b.main_grad"),
                             (torch.zeros(2, 64, 64, dtype=torch.float64), r"\[dtype\] b.main_grad is torch.float64")):
        w = b.clone().requires_grad_()
        w.main_grad, w.grad_added_to_main_grad = main_grad, False
        before = main_grad.clone()
        with pytest.raises(GuardError, match=match):
            mxgemm.grouped_gemm_fp4(a, w, lens, fuse_bgrad_accum_pattern="megatron")
        assert torch.equal(w.main_grad, before) and w.grad_added_to_main_grad is False and w.grad is None


def test_primus_turbo_backend():
    """GroupedGemmFP4Backend with Primus-Turbo's FP4 dispatcher keywords: forward (group_offs_out),
    the wgrad into out, accumulated in place (main_grad) and with trans_c; can_handle is True
    exactly when execute runs, and a refused call raises before writing out."""
    from mxgemm.primus_turbo import GroupedGemmFP4Backend as B
    g = torch.Generator().manual_seed(4)
    mx = types.SimpleNamespace(name="MX_BLOCKWISE")
    lens, offs = torch.tensor([32, 0, 64]), torch.tensor([0, 32, 32, 96])
    (qa, sa), (qb, sb) = quantise(grid(g, 96, 64), 1), quantise(grid(g, 3, 32, 64), 1)
    fwd = dict(a=qa.view(torch.float4_e2m1fn_x2), b=qb, a_scales=sa, b_scales=sb, group_lens=lens, group_offs=offs,
               trans_a=False, trans_b=True, out_dtype=torch.bfloat16, granularity=mx, num_cu=None,
               group_offs_out=offs)
    assert B.can_handle(**fwd)
    metrics.assert_bitwise_equal(B.execute(**fwd), reference.grouped_gemm_fp4_ref(qa, sa, qb, sb, offs), "forward")
    (ql, sl), (qr, sr) = quantise(grid(g, 64, 96), 1), quantise(grid(g, 32, 96), 1)
    wg = dict(a=ql, b=qr, a_scales=sl, b_scales=sr, group_lens=lens, group_offs=offs, trans_a=False, trans_b=False,
              trans_c=False, out_dtype=torch.bfloat16, granularity="MX_BLOCKWISE", num_cu=None)
    want = reference.grouped_gemm_fp4_variable_k_ref(ql, sl, qr, sr, offs)
    out = torch.zeros(3, 64, 32).bfloat16()
    assert B.can_handle(**wg, out=out) and B.execute(**wg, out=out) is out
    metrics.assert_bitwise_equal(out, want, "wgrad into out")
    main_grad = grid(g, 3, 64, 32, dtype=torch.float32)
    want_acc = reference.grouped_gemm_fp4_variable_k_ref(ql, sl, qr, sr, offs, torch.float32, accumulate_into=main_grad)
    B.execute(**wg, out=main_grad, inplace_add_to_out=True)
    metrics.assert_bitwise_equal(main_grad, want_acc, "main_grad += wgrad")
    swapped = dict(wg, a=qr, b=ql, a_scales=sr, b_scales=sl, trans_c=True)
    metrics.assert_bitwise_equal(B.execute(**swapped), want, "trans_c")
    out = torch.full((3, 64, 32), 7.0).bfloat16()
    for bad in (dict(wg, granularity="BLOCKWISE"), dict(wg, trans_a=True), dict(fwd, trans_b=False),
                dict(fwd, out_dtype=torch.float32), dict(wg, group_offs=torch.tensor([0, 16, 16, 96])),
                dict(fwd, inplace_add_to_out=True)):
        assert not B.can_handle(**bad, out=out)
        with pytest.raises(GuardError):
            B.execute(**bad, out=out)
        assert bool((out == 7).all())
