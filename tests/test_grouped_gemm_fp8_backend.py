"""mxgemm.primus_turbo.GroupedGemmFP8Backend, specified as a Primus-Turbo dispatcher uses it:
every call passes the same keyword set; can_handle answers True or False without raising;
execute on a call it handles returns the reference result (bit-exact), forward NT, dgrad NN and
the variable-K wgrad with and without trans_c."""
import enum

import pytest
import torch

from mxgemm import guards, metrics, reference
from mxgemm.primus_turbo import GroupedGemmFP8Backend as Backend

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
Granularity = enum.Enum("ScalingGranularity", "TENSORWISE ROWWISE BLOCKWISE MX_BLOCKWISE")  # the dispatcher's names
LENS = [24, 0, 40]
OFFS = torch.tensor([0, 24, 24, 64])


def fp8(*shape, seed, dtype=E4M3):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def call(a, b, trans_a=False, trans_b=True, **over):
    kw = dict(a=a, b=b, a_scales=torch.tensor(0.5), b_scales=torch.tensor([1.5]),
              group_lens=torch.tensor(LENS), group_offs=OFFS.clone(), trans_a=trans_a, trans_b=trans_b,
              out_dtype=torch.bfloat16, granularity=Granularity.TENSORWISE, num_cu=None,
              maybe_pre_sync=False)   # keys a dispatcher adds for other backends are ignored
    return {**kw, **over}


FWD = call(fp8(64, 128, seed=1), fp8(3, 32, 128, seed=2))
DGRAD = call(fp8(64, 32, seed=3), fp8(3, 32, 128, seed=2), trans_b=False, num_cu=2)
WGRAD = call(fp8(64, 32, seed=3), fp8(64, 48, seed=1), trans_a=True, trans_b=False, trans_c=False)


@pytest.mark.parametrize("kw,want", [
    (FWD, lambda k: reference.grouped_gemm_fp8_ref(k["a"], k["a_scales"], k["b"], k["b_scales"], OFFS)),
    (DGRAD, lambda k: reference.grouped_gemm_fp8_ref(k["a"], k["a_scales"], k["b"], k["b_scales"], OFFS,
                                                     trans_b=False)),
    (WGRAD, lambda k: reference.grouped_gemm_fp8_variable_k_ref(k["a"], k["a_scales"], k["b"], k["b_scales"], OFFS)),
    ({**WGRAD, "trans_c": True},
     lambda k: reference.grouped_gemm_fp8_variable_k_ref(k["b"], k["b_scales"], k["a"], k["a_scales"], OFFS)),
    ({**DGRAD, "a": fp8(64, 32, seed=3, dtype=E5M2)},   # hybrid: e5m2 grad_out x e4m3 weights
     lambda k: reference.grouped_gemm_fp8_ref(k["a"], k["a_scales"], k["b"], k["b_scales"], OFFS, trans_b=False)),
], ids=["fwd-NT", "dgrad-NN", "wgrad-TN", "wgrad-TN-trans_c", "dgrad-NN-hybrid"])
def test_handled_calls_execute_bit_exact(kw, want):
    assert Backend.can_handle(**kw) is True
    out = Backend.execute(**kw)
    ref = want(kw)
    assert out.shape == ref.shape and ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(out, ref, "backend execute")


def test_granularity_accepts_the_name_in_any_case():
    assert Backend.can_handle(**{**FWD, "granularity": "tensorwise"})


def scales(*shape, seed):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) + 0.5


# Primus-Turbo's scale layouts (module docstring of mxgemm.primus_turbo) and the same scales in the
# reference's layouts, written out separately: ROWWISE keeps the quantised axis as size 1, BLOCKWISE
# stores the activation's 1x128 scales transposed [K/128, M] and b's per block of b's own layout.
ROW_A, ROW_B, ROW_BN = scales(64, 1, seed=7), scales(3, 32, 1, seed=8), scales(3, 1, 128, seed=9)
BLK_A, BLK_A2, BLK_B, BLK_BN = scales(1, 64, seed=10), scales(2, 64, seed=16), scales(3, 1, 1, seed=11), scales(3, 2, 1, seed=12)
WGRAD_BLK = call(fp8(128, 32, seed=3), fp8(128, 48, seed=1), trans_a=True, trans_b=False, trans_c=False,
                 group_lens=torch.tensor([0, 128, 0]), group_offs=torch.tensor([0, 0, 128, 128]))

REFUSED = [
    ("rowwise-tensor-scales", {**FWD, "granularity": Granularity.ROWWISE}),
    ("blockwise-tensor-scales", {**FWD, "granularity": Granularity.BLOCKWISE}),
    ("mx-blockwise-fp32-scales", {**FWD, "granularity": Granularity.MX_BLOCKWISE}),
    ("rowwise-scales", {**FWD, "a_scales": torch.ones(64)}),
    ("rowwise-axis", {**FWD, "granularity": Granularity.ROWWISE, "a_scales": torch.ones(1, 64), "b_scales": ROW_B}),
    ("blockwise-rank", {**FWD, "granularity": Granularity.BLOCKWISE, "a_scales": torch.ones(64), "b_scales": BLK_B}),
    ("blockwise-unaligned-group", {**WGRAD, "granularity": Granularity.BLOCKWISE, "a_scales": torch.ones(1, 32),
                                   "b_scales": torch.ones(1, 48)}),
    ("trans_a-3d-b", {**FWD, "trans_a": True}),
    ("wgrad-not-trans_a", {**WGRAD, "trans_a": False}),
    ("wgrad-trans_b", {**WGRAD, "trans_b": True}),
    ("hybrid-forward", {**FWD, "b": fp8(3, 32, 128, seed=2, dtype=E5M2)}),   # mixed only in the backward
    ("bf16-operands", {**FWD, "a": FWD["a"].bfloat16(), "b": FWD["b"].bfloat16()}),
    # fp32 out exists for e4m3 only (grouped_gemm_fp8_kernel's fp32 variants)
    ("fp32-out-e5m2", {**FWD, "a": fp8(64, 128, seed=1, dtype=E5M2), "b": fp8(3, 32, 128, seed=2, dtype=E5M2),
                       "out_dtype": torch.float32}),
    ("k-mismatch", {**FWD, "b": fp8(3, 32, 96, seed=2)}),
    ("n-align", {**FWD, "b": fp8(3, 40, 128, seed=2)}),
    ("group-count", {**FWD, "b": fp8(2, 32, 128, seed=2)}),
    ("meta-device", {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in FWD.items()}),
]


GRANULAR = [
    ("row-fwd", {**FWD, "granularity": Granularity.ROWWISE, "a_scales": ROW_A, "b_scales": ROW_B},
     lambda k: reference.grouped_gemm_fp8_ref(k["a"], ROW_A[:, 0], k["b"], ROW_B[:, :, 0], OFFS)),
    ("row-dgrad", {**DGRAD, "granularity": Granularity.ROWWISE, "a_scales": ROW_A, "b_scales": ROW_BN},
     lambda k: reference.grouped_gemm_fp8_ref(k["a"], ROW_A[:, 0], k["b"], ROW_BN[:, 0, :], OFFS, trans_b=False)),
    ("row-wgrad", {**WGRAD, "granularity": Granularity.ROWWISE, "a_scales": ROW_A[:32].T, "b_scales": scales(1, 48, seed=13)},
     lambda k: reference.grouped_gemm_fp8_variable_k_ref(k["a"], k["a_scales"][0], k["b"], k["b_scales"][0], OFFS,
                                                         granularity="row")),
    ("row-wgrad-trans_c", {**WGRAD, "trans_c": True, "granularity": "rowwise", "a_scales": ROW_A[:32].T,
                           "b_scales": scales(1, 48, seed=13)},
     lambda k: reference.grouped_gemm_fp8_variable_k_ref(k["b"], k["b_scales"][0], k["a"], k["a_scales"][0], OFFS,
                                                         granularity="row")),
    ("block-fwd", {**FWD, "granularity": Granularity.BLOCKWISE, "a_scales": BLK_A, "b_scales": BLK_B},
     lambda k: reference.grouped_gemm_fp8_ref(k["a"], BLK_A.T, k["b"], BLK_B, OFFS, granularity="block")),
    ("block-dgrad", {**call(fp8(64, 256, seed=3), fp8(3, 256, 32, seed=2), trans_b=False),
                     "granularity": Granularity.BLOCKWISE, "a_scales": BLK_A2, "b_scales": BLK_BN},
     lambda k: reference.grouped_gemm_fp8_ref(k["a"], BLK_A2.T, k["b"], BLK_BN.transpose(1, 2), OFFS, trans_b=False,
                                              granularity="block")),
    ("block-wgrad", {**WGRAD_BLK, "granularity": Granularity.BLOCKWISE, "a_scales": scales(1, 32, seed=14),
                     "b_scales": scales(1, 48, seed=15)},
     lambda k: reference.grouped_gemm_fp8_variable_k_ref(k["a"], k["a_scales"], k["b"], k["b_scales"],
                                                         k["group_offs"], granularity="block")),
]


@pytest.mark.parametrize("name,kw,want", GRANULAR, ids=[g[0] for g in GRANULAR])
def test_rowwise_and_blockwise_scales_in_primus_turbo_layouts(name, kw, want):
    """ROWWISE / BLOCKWISE calls with the scales as Primus-Turbo's quantisers lay them out: read in
    place, bit-exact with the reference fed the same scales in its own layouts."""
    assert Backend.can_handle(**kw) is True
    out, ref = Backend.execute(**kw), want(kw)
    assert out.shape == ref.shape and ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(out, ref, name)


@pytest.mark.parametrize("name,kw", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_calls_answer_false_and_execute_raises_guard_error(name, kw):
    assert Backend.can_handle(**kw) is False
    with pytest.raises(guards.GuardError):
        Backend.execute(**kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trans_c", [False, True])
def test_wgrad_accumulates_into_main_grad(dtype, trans_c):
    """inplace_add_to_out=True, out=main_grad (Megatron's fused wgrad accumulation): main_grad +=
    the wgrad, bit-exact with the reference's one-rounding accumulation; an empty group's slice
    keeps its values; execute returns main_grad itself."""
    lhs, rhs = ("b", "a") if trans_c else ("a", "b")
    kw = {**WGRAD, "trans_c": trans_c, "out_dtype": torch.bfloat16}
    G, m, n = len(LENS), kw[lhs].shape[1], kw[rhs].shape[1]
    main_grad = torch.randn(G, m, n, generator=torch.Generator().manual_seed(4)).to(dtype)
    before = main_grad.clone()
    kw.update(out=main_grad, inplace_add_to_out=True)
    assert Backend.can_handle(**kw) is True
    assert Backend.execute(**kw) is main_grad
    want = reference.grouped_gemm_fp8_variable_k_ref(kw[lhs], kw[f"{lhs}_scales"], kw[rhs], kw[f"{rhs}_scales"], OFFS,
                                                     dtype, accumulate_into=before)
    metrics.assert_bitwise_equal(main_grad, want, "main_grad += wgrad")
    assert torch.equal(main_grad[1], before[1]) and not torch.equal(main_grad[0], before[0])


def test_out_is_written_and_returned():
    out = torch.empty(64, 32, dtype=torch.bfloat16)
    assert Backend.can_handle(**FWD, out=out)
    assert Backend.execute(**FWD, out=out) is out
    metrics.assert_bitwise_equal(out, reference.grouped_gemm_fp8_ref(FWD["a"], FWD["a_scales"], FWD["b"],
                                                                     FWD["b_scales"], OFFS), "out")


ACCUMULATE_REFUSED = [
    ("forward", {**FWD, "out": torch.zeros(64, 32, dtype=torch.bfloat16), "inplace_add_to_out": True}),
    ("no-out", {**WGRAD, "inplace_add_to_out": True}),
    ("f16-main_grad", {**WGRAD, "out": torch.zeros(3, 32, 48, dtype=torch.float16), "inplace_add_to_out": True}),
    ("main_grad-shape", {**WGRAD, "out": torch.zeros(3, 48, 32), "inplace_add_to_out": True}),
]


@pytest.mark.parametrize("name,kw", ACCUMULATE_REFUSED, ids=[r[0] for r in ACCUMULATE_REFUSED])
def test_accumulation_it_cannot_do_is_refused_untouched(name, kw):
    out = kw.get("out")
    before = None if out is None else out.clone()
    assert Backend.can_handle(**kw) is False
    with pytest.raises(guards.GuardError):
        Backend.execute(**kw)
    assert out is None or torch.equal(out, before)


def test_over_allocated_activations():
    """a.shape[0] > sum(group_lens), the padded tail of Primus-Turbo's fixed-capacity permute:
    handled; the forward's and dgrad's tail rows are zeros, the wgrad ignores the tail rows."""
    pad = 40
    fwd = {**FWD, "a": torch.cat([FWD["a"], fp8(pad, 128, seed=5)])}
    assert Backend.can_handle(**fwd)
    out = Backend.execute(**fwd)
    metrics.assert_bitwise_equal(out[:64], Backend.execute(**FWD), "rows of the groups")
    assert out.shape == (64 + pad, 32) and bool((out[64:] == 0).all())
    wgrad = {**WGRAD, "a": torch.cat([WGRAD["a"], fp8(pad, 32, seed=6)]), "b": torch.cat([WGRAD["b"], fp8(pad, 48, seed=7)])}
    assert Backend.can_handle(**wgrad)
    metrics.assert_bitwise_equal(Backend.execute(**wgrad), Backend.execute(**WGRAD), "wgrad ignores the tail")
    over = {**FWD, "group_lens": torch.tensor([24, 0, 41]), "group_offs": torch.tensor([0, 24, 24, 65])}
    assert Backend.can_handle(**over) is False      # more rows in the groups than a has


def e8m0(*shape, seed):
    return torch.randint(124, 131, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_mx_forward_reads_padded_groups_and_writes_out_offsets():
    """MX_BLOCKWISE forward as Primus-Turbo calls it: a's groups at padded read offsets (rows
    between them garbage), out's at group_offs_out; bit-exact with the reference on the compact
    rows, out's rows past the groups zeros."""
    a, sa = fp8(64, 128, seed=20), e8m0(64, 4, seed=21)
    b, sb = fp8(3, 32, 128, seed=22), e8m0(3, 32, 4, seed=23)
    read = torch.tensor([0, 32, 32, 96])
    a_pad, sa_pad = fp8(100, 128, seed=24), e8m0(100, 4, seed=25)
    for g in range(3):
        a_pad[read[g]:read[g] + LENS[g]], sa_pad[read[g]:read[g] + LENS[g]] = a[OFFS[g]:OFFS[g + 1]], sa[OFFS[g]:OFFS[g + 1]]
    kw = call(a_pad, b, a_scales=sa_pad, b_scales=sb, granularity=Granularity.MX_BLOCKWISE, group_offs=read,
              group_offs_out=OFFS.clone())
    assert Backend.can_handle(**kw) is True
    out = Backend.execute(**kw)
    ref = reference.grouped_gemm_fp8_ref(a, sa, b, sb, OFFS, granularity="mx")
    assert out.shape == (100, 32) and bool((out[64:] == 0).all()) and ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(out[:64], ref, "mx forward")
    assert Backend.can_handle(**{**kw, "trans_b": False, "b": b.transpose(1, 2).contiguous()}) is False


@pytest.mark.parametrize("trans_c", [False, True])
def test_mx_wgrad_takes_contraction_contiguous_operands(trans_c):
    """MX_BLOCKWISE wgrad as Primus-Turbo calls it: trans_a=False, lhs [M, sum_k] and rhs [N, sum_k]
    (contraction-contiguous), e8m0 scales [M, sum_k/32] / [N, sum_k/32], groups on multiples of 32."""
    lens, offs = torch.tensor([32, 0, 64]), torch.tensor([0, 32, 32, 96])
    x, sx = fp8(32, 96, seed=26), e8m0(32, 3, seed=27)
    w, sw = fp8(48, 96, seed=28), e8m0(48, 3, seed=29)
    (a, sa), (b, sb) = ((w, sw), (x, sx)) if trans_c else ((x, sx), (w, sw))
    kw = call(a, b, a_scales=sa, b_scales=sb, trans_a=False, trans_b=False, trans_c=trans_c, group_lens=lens,
              group_offs=offs, granularity=Granularity.MX_BLOCKWISE)
    assert Backend.can_handle(**kw) is True
    ref = reference.grouped_gemm_fp8_variable_k_ref(x.t().contiguous(), sx, w.t().contiguous(), sw, offs,
                                                    granularity="mx")
    assert ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(Backend.execute(**kw), ref, "mx wgrad")
