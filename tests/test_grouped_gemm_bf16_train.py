"""mxgemm.grouped_gemm, the differentiable BF16 / FP16 MoE grouped GEMM (Primus-Turbo's signature):
forward, dgrad and wgrad bit-identical to the reference GEMMs in bf16 and fp16 (out and gradients
in the operands' dtype), both b layouts, ragged and empty groups, a padded tail of a; fp16 against
float64 autograd within Primus-Turbo's fp16 tolerance (rtol = atol = 1e-2) and SNR (> 50 dB);
Megatron's fused main_grad accumulation (fp16 operands: into fp32); guards."""
import pytest
import torch

import mxgemm
from mxgemm import guards, metrics, reference

LENS, OFFS = [40, 0, 24], torch.tensor([0, 40, 40, 64])


def operands(trans_b, tail=0, seed=3, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    n, k = 32, 64
    x = torch.randn(sum(LENS) + tail, k, generator=g).to(dtype).requires_grad_()
    w = torch.randn(*((3, n, k) if trans_b else (3, k, n)), generator=g).to(dtype).requires_grad_()
    dy = torch.randn(sum(LENS) + tail, n, generator=g).to(dtype)
    return x, w, dy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("tail", [0, 16])
def test_forward_and_backward_bit_exact(trans_b, tail, dtype):
    x, w, dy = operands(trans_b, tail, dtype=dtype)
    y = mxgemm.grouped_gemm(x, w, torch.tensor(LENS), trans_b=trans_b)
    y.backward(dy)
    assert y.dtype == x.grad.dtype == w.grad.dtype == dtype
    xd, wd = x.detach(), w.detach()
    metrics.assert_bitwise_equal(y, reference.grouped_gemm_bf16_ref(xd, wd, OFFS, trans_b, dtype), "y")
    metrics.assert_bitwise_equal(x.grad, reference.grouped_gemm_bf16_ref(dy, wd, OFFS, not trans_b, dtype), "grad_a")
    lhs, rhs = (dy, xd) if trans_b else (xd, dy)
    metrics.assert_bitwise_equal(w.grad, reference.grouped_gemm_bf16_variable_k_ref(lhs, rhs, OFFS, dtype), "grad_b")
    assert bool((y[64:] == 0).all()) and bool((x.grad[64:] == 0).all()) and y.float().abs().max() > 0


def _snr_db(ref, got):
    """Primus-Turbo's compute_snr: 10 log10(|ref|^2 / |ref - got|^2)."""
    ref, got = ref.double(), got.double()
    return float(10 * torch.log10(ref.norm() ** 2 / ((ref - got).norm() ** 2 + 1e-12)))


@pytest.mark.parametrize("trans_b", [False, True])
def test_fp16_against_float64_autograd(trans_b):
    """Primus-Turbo's fp16 checks (test_grouped_gemm_func): out, grad_a and grad_b within
    rtol = atol = 1e-2 of the float64 autograd of the same fp16 values, each SNR > 50 dB."""
    x, w, dy = operands(trans_b, dtype=torch.float16, seed=5)
    y = mxgemm.grouped_gemm(x, w, torch.tensor(LENS), trans_b=trans_b)
    y.backward(dy)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    y64 = torch.cat([xg @ (w64[g].T if trans_b else w64[g]) for g, xg in enumerate(x64.split(LENS))])
    y64.backward(dy.double())
    for name, got, want in (("out", y, y64.detach()), ("grad_a", x.grad, x64.grad), ("grad_b", w.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2, msg=name)
        assert _snr_db(want, got.detach()) > 50, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_megatron_fused_main_grad_accumulation(dtype):
    x, w, dy = operands(True)
    main_grad = torch.randn(*w.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    before = main_grad.clone()
    w.main_grad, w.grad_added_to_main_grad = main_grad, False
    mxgemm.grouped_gemm(x, w, torch.tensor(LENS), trans_b=True, fuse_bgrad_accum_pattern="megatron").backward(dy)
    assert w.grad_added_to_main_grad is True and bool((w.grad == 0).all())
    want = reference.grouped_gemm_bf16_variable_k_ref(dy, x.detach(), OFFS, dtype, accumulate_into=before)
    metrics.assert_bitwise_equal(main_grad, want, "main_grad += wgrad")
    assert torch.equal(main_grad[1], before[1]) and not torch.equal(main_grad[0], before[0])


@pytest.mark.parametrize("trans_b", [False, True])
def test_megatron_fused_main_grad_fp16_operands(trans_b):
    """fp16 a and b, main_grad fp32 (Primus-Turbo's test_grouped_gemm_fused_grad_accum): the
    wgrad is added in the epilogue (fp32, one rounding), the empty group's slice untouched."""
    x, w, dy = operands(trans_b, dtype=torch.float16)
    main_grad = torch.randn(*w.shape, generator=torch.Generator().manual_seed(9))
    before = main_grad.clone()
    w.main_grad, w.grad_added_to_main_grad = main_grad, False
    y = mxgemm.grouped_gemm(x, w, torch.tensor(LENS), trans_b=trans_b, fuse_bgrad_accum_pattern="megatron")
    y.backward(dy)
    assert w.grad_added_to_main_grad is True and bool((w.grad == 0).all()) and w.grad.dtype == torch.float16
    lhs, rhs = (dy, x.detach()) if trans_b else (x.detach(), dy)
    want = reference.grouped_gemm_bf16_variable_k_ref(lhs, rhs, OFFS, torch.float32, accumulate_into=before)
    metrics.assert_bitwise_equal(main_grad, want, "main_grad += fp16 wgrad")
    assert torch.equal(main_grad[1], before[1]) and not torch.equal(main_grad[0], before[0])


def test_refusals():
    x, w, _ = operands(False)
    lens = torch.tensor(LENS)
    xh, wh = x.detach().half(), w.detach().half()
    wh.main_grad, wh.grad_added_to_main_grad = torch.zeros(wh.shape, dtype=torch.float16), False
    for call, rule in ((lambda: mxgemm.grouped_gemm(x.half(), w, lens), r"dtype\] a is torch.float16 and b "
                                                                         "torch.bfloat16: grouped_gemm takes both"),
                       (lambda: mxgemm.grouped_gemm(x.float(), w.float(), lens), r"dtype\] a is torch.float32"),
                       (lambda: mxgemm.grouped_gemm(xh, wh, lens, fuse_bgrad_accum_pattern="megatron"),
                        r"dtype\] b.main_grad is torch.float16: no wgrad kernel accumulates f16 x f16"),
                       (lambda: mxgemm.grouped_gemm(x, w, lens, schedule="greedy"), "schedule"),
                       (lambda: mxgemm.grouped_gemm(x, w, lens, fuse_bgrad_accum_pattern="megatron"),
                        "fuse_bgrad_accum_pattern"),
                       (lambda: mxgemm.grouped_gemm(x, w, torch.tensor([40, 0, 30])), "group")):
        with pytest.raises(guards.GuardError, match=rf"\[{rule}"):
            call()


def backend_call(a, b, trans_a=False, trans_b=True, **over):
    kw = dict(a=a, b=b, group_lens=torch.tensor(LENS), group_offs=OFFS.clone(), trans_a=trans_a, trans_b=trans_b,
              num_cu=None, schedule="static", maybe_pre_sync=False)   # keys for other backends are ignored
    return {**kw, **over}


def test_primus_turbo_bf16_backend():
    """mxgemm.primus_turbo.GroupedGemmBackend: forward / dgrad / wgrad (trans_c) bit-exact, main_grad
    accumulation in out's dtype, and can_handle False (no exception) exactly where execute raises."""
    from mxgemm.primus_turbo import GroupedGemmBackend as Backend
    x, w, dy = (t.detach() for t in operands(True))
    for kw, want in ((backend_call(x, w), reference.grouped_gemm_bf16_ref(x, w, OFFS)),
                     (backend_call(dy, w, trans_b=False), reference.grouped_gemm_bf16_ref(dy, w, OFFS, False)),
                     (backend_call(x, dy, trans_a=True, trans_b=False, trans_c=True),
                      reference.grouped_gemm_bf16_variable_k_ref(dy, x, OFFS))):
        assert Backend.can_handle(**kw) is True
        metrics.assert_bitwise_equal(Backend.execute(**kw), want, "backend")
    main_grad = torch.randn(3, 32, 64, generator=torch.Generator().manual_seed(2))
    before = main_grad.clone()
    kw = backend_call(x, dy, trans_a=True, trans_b=False, trans_c=True, out=main_grad, inplace_add_to_out=True)
    assert Backend.can_handle(**kw) and Backend.execute(**kw) is main_grad
    metrics.assert_bitwise_equal(main_grad, reference.grouped_gemm_bf16_variable_k_ref(
        dy, x, OFFS, torch.float32, accumulate_into=before), "main_grad")
    xh, wh, dyh = (t.detach() for t in operands(True, dtype=torch.float16))
    for kw, want in ((backend_call(xh, wh), reference.grouped_gemm_bf16_ref(xh, wh, OFFS, out_dtype=torch.float16)),
                     (backend_call(xh, dyh, trans_a=True, trans_b=False, trans_c=True),
                      reference.grouped_gemm_bf16_variable_k_ref(dyh, xh, OFFS, torch.float16))):
        assert Backend.can_handle(**kw) is True   # fp16: out in the operands' dtype, as Primus-Turbo's backends
        metrics.assert_bitwise_equal(Backend.execute(**kw), want, "fp16 backend")
    for bad in (backend_call(x.half(), w), backend_call(x, w, trans_a=True),
                backend_call(x, w, out=torch.zeros(64, 32, dtype=torch.bfloat16), inplace_add_to_out=True),
                backend_call(x, w[:, :, :48])):
        assert Backend.can_handle(**bad) is False
        with pytest.raises(guards.GuardError):
            Backend.execute(**bad)
