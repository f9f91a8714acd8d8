"""mxgemm.grouped_gemm_fp8 with Primus-Turbo's ROWWISE and BLOCKWISE recipes: forward, dgrad and
wgrad are bit-identical to the reference GEMMs on the operands the recipe's casts give
(mxgemm.quant, tested against torch's own conversions), and within SNR bars of fp32 math."""
import types

import pytest
import torch

import mxgemm
from mxgemm import metrics, quant, reference


def config(granularity, block_size=None):
    return types.SimpleNamespace(format="E4M3", granularity=granularity, block_size=block_size, scale_dtype="FP32")


def colwise(t):
    q, s = quant.rowwise_cast_to_fp8(t.mT)
    return q.mT.contiguous(), s


def recipe_operands(granularity, x, w, dy, offs, trans_b):
    """(forward, dgrad, wgrad) reference calls' operands, built from the recipe's definition."""
    if granularity == "ROWWISE":
        xq, xs = quant.rowwise_cast_to_fp8(x)
        wq, ws = quant.rowwise_cast_to_fp8(w) if trans_b else colwise(w)
        wq_t, ws_t = colwise(w) if trans_b else quant.rowwise_cast_to_fp8(w)
        dq, ds = quant.rowwise_cast_to_fp8(dy)
        (xc, xcs), (dc, dcs) = colwise(x), colwise(dy)
        return ((xq, xs, wq, ws, offs), (dq, ds, wq_t, ws_t, offs), (xc, xcs), (dc, dcs), offs, "row")
    xq, xs = quant.blockwise_cast_to_fp8(x, (1, 128))
    wq, blocks = quant.blockwise_cast_to_fp8(w, (128, 128))
    ws = blocks if trans_b else blocks.transpose(1, 2)
    dq, ds = quant.blockwise_cast_to_fp8(dy, (1, 128))
    xc, xcs, seg = quant.segment_cast_to_fp8(x, offs)
    dc, dcs, _ = quant.segment_cast_to_fp8(dy, offs)
    return ((xq, xs, wq, ws, offs), (dq, ds, wq, ws.transpose(1, 2), offs), (xc, xcs), (dc, dcs), seg, "block")


LENS, OFFS = [70, 0, 58], torch.tensor([0, 70, 70, 128])


def training_step(seed, trans_b=True, n=64, k=256, dtype=torch.bfloat16):
    """(x [128, k], w [3, n, k] (trans_b) or [3, k, n] scaled by 0.05, both leaves requiring grad,
    dy [128, n], the generator for further draws) in LENS's groups."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(LENS), k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(*((3, n, k) if trans_b else (3, k, n)), generator=g) * 0.05).to(dtype).requires_grad_()
    return x, w, torch.randn(sum(LENS), n, generator=g).to(dtype), g


def fp32_step(x, w, dy, trans_b):
    """fp32 y, grad_a and grad_b of the grouped GEMM over OFFS's groups (the SNR bars' reference)."""
    xf, wf, dyf = x.detach().float(), w.detach().float(), dy.float()
    rows = [slice(s, e) for s, e in zip(OFFS[:-1].tolist(), OFFS[1:].tolist())]
    bmat = [wf[i].T if trans_b else wf[i] for i in range(3)]
    return (torch.cat([xf[r] @ bmat[i] for i, r in enumerate(rows)]),
            torch.cat([dyf[r] @ bmat[i].T for i, r in enumerate(rows)]),
            torch.stack([dyf[r].T @ xf[r] if trans_b else xf[r].T @ dyf[r] for r in rows]))


@pytest.mark.parametrize("granularity", ["ROWWISE", "BLOCKWISE"])
@pytest.mark.parametrize("trans_b", [True, False])
def test_recipe_forward_and_backward(granularity, trans_b):
    x, w, dy, _ = training_step(11, trans_b)
    block = 128 if granularity == "BLOCKWISE" else None
    y = mxgemm.grouped_gemm_fp8(x, w, torch.tensor(LENS), trans_b=trans_b, config=config(granularity, block))
    y.backward(dy)
    fwd, dgrad, xc, dc, w_offs, gran = recipe_operands(granularity, x.detach(), w.detach(), dy, OFFS, trans_b)
    ref = reference.grouped_gemm_fp8_ref
    metrics.assert_bitwise_equal(y, ref(*fwd, trans_b, torch.bfloat16, granularity=gran), "y")
    metrics.assert_bitwise_equal(x.grad, ref(*dgrad, not trans_b, torch.bfloat16, granularity=gran), "grad_a")
    lhs, rhs = (dc, xc) if trans_b else (xc, dc)
    want_b = reference.grouped_gemm_fp8_variable_k_ref(*lhs, *rhs, w_offs, torch.bfloat16, granularity=gran)
    metrics.assert_bitwise_equal(w.grad, want_b, "grad_b")
    y_ref, dx_ref, dw_ref = fp32_step(x, w, dy, trans_b)
    for name, got, want in (("y", y.detach(), y_ref), ("grad_a", x.grad, dx_ref), ("grad_b", w.grad, dw_ref)):
        assert metrics.snr_db(got.float(), want) >= 25.0, name


def test_recipe_refusals():
    x, w, lens = torch.randn(8, 128).bfloat16(), torch.randn(1, 16, 128).bfloat16(), torch.tensor([8])
    for cfg, rule in ((config("BLOCKWISE"), "block_size"), (config("BLOCKWISE", 64), "block_size"),
                      (config("MX_BLOCKWISE", 32), "scale_dtype"), (config("MX_BLOCKWISE", 128), "block_size"),
                      (types.SimpleNamespace(format="E2M1", granularity="BLOCKWISE", block_size=128), "format")):
        with pytest.raises(mxgemm.guards.GuardError, match=rf"\[{rule}\]"):
            mxgemm.grouped_gemm_fp8(x, w, lens, config=cfg)


@pytest.mark.parametrize("granularity,dtype", [("TENSORWISE", torch.float32), ("ROWWISE", torch.bfloat16),
                                               ("BLOCKWISE", torch.float32)])
def test_megatron_fused_main_grad_accumulation(granularity, dtype):
    """fuse_bgrad_accum_pattern="megatron": the wgrad goes into w.main_grad (its old values + the
    wgrad, one rounding: the reference's accumulate_into), w.grad is zeros, grad_a is unchanged and
    w.grad_added_to_main_grad is set by the forward."""
    x, w, dy, g = training_step(5)
    main_grad = torch.randn(*w.shape, generator=g).to(dtype)
    before = main_grad.clone()
    w.main_grad, w.grad_added_to_main_grad = main_grad, False
    cfg = config(granularity, 128 if granularity == "BLOCKWISE" else None)
    y = mxgemm.grouped_gemm_fp8(x, w, torch.tensor(LENS), config=cfg, fuse_bgrad_accum_pattern="megatron")
    assert w.grad_added_to_main_grad is True
    y.backward(dy)
    assert w.main_grad is main_grad and bool((w.grad == 0).all()) and w.grad.shape == w.shape
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    mxgemm.grouped_gemm_fp8(x2, w2, torch.tensor(LENS), config=cfg).backward(dy)
    metrics.assert_bitwise_equal(x.grad, x2.grad, "grad_a unchanged by the fusion")
    if granularity == "TENSORWISE":
        (xq, xs), (dq, ds) = quant.tensorwise_cast_to_fp8(x.detach()), quant.tensorwise_cast_to_fp8(dy)
        lhs, rhs, w_offs, gran = (dq, ds), (xq, xs), OFFS, "tensor"
    else:
        _, _, xc, dc, w_offs, gran = recipe_operands(granularity, x.detach(), w.detach(), dy, OFFS, True)
        lhs, rhs = dc, xc
    want = reference.grouped_gemm_fp8_variable_k_ref(*lhs, *rhs, w_offs, dtype, accumulate_into=before,
                                                     granularity=gran)
    metrics.assert_bitwise_equal(main_grad, want, "main_grad += wgrad")
    assert not torch.equal(main_grad, before)


def test_megatron_fusion_refusals():
    x, lens = torch.randn(8, 128).bfloat16(), torch.tensor([8])
    for main_grad, rule in ((None, "fuse_bgrad_accum_pattern"), (torch.zeros(1, 16, 64), "shape"),
                            (torch.zeros(1, 16, 128, dtype=torch.float16), "dtype")):
        w = torch.randn(1, 16, 128).bfloat16().requires_grad_()
        if main_grad is not None:
            w.main_grad, w.grad_added_to_main_grad = main_grad, False
        with pytest.raises(mxgemm.guards.GuardError, match=rf"\[{rule}\]"):
            mxgemm.grouped_gemm_fp8(x, w, lens, fuse_bgrad_accum_pattern="megatron")
    with pytest.raises(mxgemm.guards.GuardError, match=r"\[fuse_bgrad_accum_pattern\]"):
        mxgemm.grouped_gemm_fp8(x, torch.randn(1, 16, 128).bfloat16(), lens, fuse_bgrad_accum_pattern="deepspeed")


class QuantizedTensor(torch.Tensor):
    """Primus-Turbo's QuantizedTensor as the op sees it: a tensor of the original dtype and shape
    carrying fp8 qdata, fp32 scale_inv (keepdim along the quantised axis), granularity,
    block_size and quantized_axis. Its own elements are zeros (Primus-Turbo's wrapper has no
    storage of its own): an op reading them instead of qdata computes zeros."""

    @staticmethod
    def __new__(cls, hp, qdata, scale_inv, granularity, block_size=None, axis=None):
        t = torch.Tensor._make_subclass(cls, torch.zeros_like(hp), True)
        t.qdata, t.scale_inv, t.granularity, t.block_size, t.quantized_axis = qdata, scale_inv, granularity, block_size, axis
        return t


def pre_quantised(hp, granularity, axis=None):
    """hp quantised by mxgemm.quant's casts, scales laid out as Primus-Turbo's quantisers do."""
    if granularity == "TENSORWISE":
        q, s = quant.tensorwise_cast_to_fp8(hp)
    elif granularity == "ROWWISE":
        q, s = quant.rowwise_cast_to_fp8(hp) if axis == hp.dim() - 1 else colwise(hp)
        s = s.unsqueeze(axis)
    else:
        q, s = quant.blockwise_cast_to_fp8(hp, (128, 128))
    return QuantizedTensor(hp, q, s, types.SimpleNamespace(name=granularity), 128 if granularity == "BLOCKWISE" else None,
                           axis)


@pytest.mark.parametrize("granularity,trans_b", [("TENSORWISE", True), ("ROWWISE", True), ("ROWWISE", False),
                                                 ("BLOCKWISE", False)])
def test_pre_quantised_inputs(granularity, trans_b):
    """QuantizedTensor a / b (b only for BLOCKWISE, as in Primus-Turbo) give the same forward and
    gradients as the op quantising the same values itself (the buffers equal the op's own casts),
    and the gradients reach the wrappers."""
    x, w, dy, _ = training_step(17, trans_b, n=128)
    x, w = x.detach(), w.detach()
    cfg = config(granularity, 128 if granularity == "BLOCKWISE" else None)
    xq = x.clone().requires_grad_() if granularity == "BLOCKWISE" else pre_quantised(x, granularity, 1)
    wq = pre_quantised(w, granularity, 2 if trans_b else 1)
    y = mxgemm.grouped_gemm_fp8(xq, wq, torch.tensor(LENS), trans_b=trans_b, config=cfg)
    y.backward(dy)
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    y2 = mxgemm.grouped_gemm_fp8(x2, w2, torch.tensor(LENS), trans_b=trans_b, config=cfg)
    y2.backward(dy)
    metrics.assert_bitwise_equal(y, y2, "y")
    assert xq.grad is not None and wq.grad is not None
    if granularity != "ROWWISE":   # rowwise re-quantises the dequantised values for the backward
        metrics.assert_bitwise_equal(xq.grad, x2.grad, "grad_a")
        metrics.assert_bitwise_equal(wq.grad, w2.grad, "grad_b")
    else:   # the dgrad and wgrad operands: the dequantised values (fp8 * scale in bf16) quantised along the other axis
        dequantised = [(t.qdata.float() * t.scale_inv).bfloat16() for t in (xq, wq)]
        _, dgrad, xc, dc, w_offs, gran = recipe_operands(granularity, *dequantised, dy, OFFS, trans_b)
        ref = reference.grouped_gemm_fp8_ref
        metrics.assert_bitwise_equal(xq.grad, ref(*dgrad, not trans_b, torch.bfloat16, granularity=gran), "grad_a")
        lhs, rhs = (dc, xc) if trans_b else (xc, dc)
        metrics.assert_bitwise_equal(wq.grad, reference.grouped_gemm_fp8_variable_k_ref(
            *lhs, *rhs, w_offs, torch.bfloat16, granularity=gran), "grad_b")


def test_pre_quantised_refusals():
    x, w, lens = torch.randn(8, 128).bfloat16(), torch.randn(1, 16, 128).bfloat16(), torch.tensor([8])
    row = config("ROWWISE")
    for a, b, cfg, rule in (
            (pre_quantised(x, "TENSORWISE"), w, row, "granularity"),
            (x, pre_quantised(w, "ROWWISE", 1), row, "axis"),
            (pre_quantised(x, "ROWWISE", 1), w, types.SimpleNamespace(format="E5M2", granularity="ROWWISE"), "dtype"),
            (x.clone(), w, config("BLOCKWISE", 128), None)):
        if rule is None:   # BLOCKWISE: a pre-quantised activation is refused (b may be)
            a, rule = pre_quantised(torch.randn(8, 128).bfloat16(), "BLOCKWISE"), "type"
            a.qdata, a.scale_inv = quant.blockwise_cast_to_fp8(torch.randn(8, 128).bfloat16(), (1, 128))
        with pytest.raises(mxgemm.guards.GuardError, match=rf"\[{rule}\]"):
            mxgemm.grouped_gemm_fp8(a, b, lens, config=cfg)


@pytest.mark.parametrize("trans_b", [True, False])
def test_mx_blockwise_recipe(trans_b):
    """MX_BLOCKWISE (block 32, E8M0): forward, dgrad and wgrad bit-identical to the reference
    GEMMs on the operands the recipe defines (quant.quantize_mx along each GEMM's contraction; the
    wgrad's on 32-row aligned segments of each group), within an SNR bar of fp32 math."""
    x, w, dy, _ = training_step(23, trans_b)
    cfg = types.SimpleNamespace(format="E4M3", granularity="MX_BLOCKWISE", block_size=32, scale_dtype="E8M0")
    y = mxgemm.grouped_gemm_fp8(x, w, torch.tensor(LENS), trans_b=trans_b, config=cfg)
    y.backward(dy)
    xd, wd = x.detach(), w.detach()
    along_k = wd if trans_b else wd.mT               # [G, N, K]
    along_n = wd.mT if trans_b else wd               # [G, K, N]
    (xq, xs), (wq, ws), (wq_t, ws_t), (dq, ds) = (quant.quantize_mx(t) for t in (xd, along_k, along_n, dy))
    ref = reference.grouped_gemm_fp8_ref
    fwd_b = wq if trans_b else wq.mT.contiguous()
    metrics.assert_bitwise_equal(y, ref(xq, xs, fwd_b, ws, OFFS, trans_b, torch.bfloat16, granularity="mx"), "y")
    dgrad_b = wq_t.mT.contiguous() if trans_b else wq_t              # the dgrad layout (NN if trans_b, else NT)
    metrics.assert_bitwise_equal(x.grad, ref(dq, ds, dgrad_b, ws_t, OFFS, not trans_b, torch.bfloat16,
                                             granularity="mx"), "grad_a")
    (xc, xcs, seg), (dc, dcs, _) = quant.segment_quantize_mx(xd, OFFS), quant.segment_quantize_mx(dy, OFFS)
    lhs, rhs = ((dc, dcs), (xc, xcs)) if trans_b else ((xc, xcs), (dc, dcs))
    metrics.assert_bitwise_equal(w.grad, reference.grouped_gemm_fp8_variable_k_ref(*lhs, *rhs, seg, torch.bfloat16,
                                                                                   granularity="mx"), "grad_b")
    y_ref, _, dw_ref = fp32_step(x, w, dy, trans_b)
    for name, got, want in (("y", y.detach(), y_ref), ("grad_b", w.grad, dw_ref)):
        assert metrics.snr_db(got.float(), want) >= 25.0, name


@pytest.mark.parametrize("granularity,fmt,out", [("BLOCKWISE", "E5M2", torch.bfloat16),
                                                 ("BLOCKWISE", "HYBRID", torch.float16),
                                                 ("MX_BLOCKWISE", "E5M2", torch.float16),
                                                 ("MX_BLOCKWISE", "HYBRID", torch.bfloat16)])
def test_block_and_mx_recipes_in_e5m2_and_hybrid(granularity, fmt, out):
    """BLOCKWISE / MX_BLOCKWISE with E5M2 or HYBRID (e4m3 a and b, e5m2 grad_out) and bf16 / fp16
    out: forward, dgrad and wgrad bit-identical to the reference on the recipe's operands."""
    x, w, dy, _ = training_step(29, dtype=out)
    mx = granularity == "MX_BLOCKWISE"
    cfg = types.SimpleNamespace(format=fmt, granularity=granularity, block_size=32 if mx else 128,
                                scale_dtype="E8M0" if mx else "FP32")
    y = mxgemm.grouped_gemm_fp8(x, w, torch.tensor(LENS), config=cfg)
    y.backward(dy)
    f, gf = ("e5m2", "e5m2") if fmt == "E5M2" else ("e4m3", "e5m2")
    xd, wd = x.detach(), w.detach()
    ref, ref_k = reference.grouped_gemm_fp8_ref, reference.grouped_gemm_fp8_variable_k_ref
    if mx:
        (xq, xs), (wq, ws), (dq, ds) = quant.quantize_mx(xd, f), quant.quantize_mx(wd, f), quant.quantize_mx(dy, gf)
        wq_t, ws_t = quant.quantize_mx(wd.mT, f)                                    # along N: [G, K, N]
        dgrad_b = wq_t.mT.contiguous()
        (xc, xcs, seg), (dc, dcs, _) = quant.segment_quantize_mx(xd, OFFS, f), quant.segment_quantize_mx(dy, OFFS, gf)
        gran = "mx"
    else:
        (xq, xs), (dq, ds) = quant.blockwise_cast_to_fp8(xd, (1, 128), f), quant.blockwise_cast_to_fp8(dy, (1, 128), gf)
        wq, ws = quant.blockwise_cast_to_fp8(wd, (128, 128), f)
        dgrad_b, ws_t = wq, ws.transpose(1, 2)
        (xc, xcs, seg), (dc, dcs, _) = (quant.segment_cast_to_fp8(t, OFFS, 128, h) for t, h in ((xd, f), (dy, gf)))
        gran = "block"
    metrics.assert_bitwise_equal(y, ref(xq, xs, wq, ws, OFFS, True, out, granularity=gran), "y")
    metrics.assert_bitwise_equal(x.grad, ref(dq, ds, dgrad_b, ws_t, OFFS, False, out, granularity=gran), "grad_a")
    metrics.assert_bitwise_equal(w.grad, ref_k(dc, dcs, xc, xcs, seg, out, granularity=gran), "grad_b")
