"""The public tensorwise FP8 grouped GEMM ops (mxgemm.grouped_gemm_fp8_kernel,
mxgemm.grouped_gemm_fp8_variable_k) on CPU tensors (the emulator): bit-identical to
mxgemm.reference, group_offs derived from group_lens when omitted, persistent grids via num_cu,
explain names the kernel and tiles; every broken rule raises GuardError before any launch with
the caller's out left untouched. mxgemm.grouped_gemm_fp8 (dynamic tensorwise quantisation +
autograd): forward and both gradients bit-identical to the reference on the quantised tensors,
SNR against fp32 math."""
import dataclasses
import enum
import functools

import pytest
import torch

import mxgemm
from mxgemm import guards, metrics, reference
from mxgemm.ops import train_grouped_gemm as op

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def fp8(*shape, dtype=E4M3, seed=0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def offsets(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)


def rows_case(lens=(40, 0, 77), n=64, k=128, dtype=E4M3, trans_b=True):
    G = len(lens)
    b = fp8(G, n, k, dtype=dtype, seed=2) if trans_b else fp8(G, k, n, dtype=dtype, seed=2)
    return dict(a=fp8(sum(lens), k, dtype=dtype, seed=1), a_scale=torch.tensor(0.75), b=b,
                b_scale=torch.tensor([1.5]), group_lens=torch.tensor(lens, dtype=torch.int64))


def variable_k_case(lens=(130, 0, 57), m=48, n=80, dtype=E4M3):
    return dict(a=fp8(sum(lens), m, dtype=dtype, seed=3), a_scale=torch.tensor(0.5), b=fp8(sum(lens), n, dtype=dtype,
                seed=4), b_scale=torch.tensor(1.25), group_lens=torch.tensor(lens, dtype=torch.int64))


@pytest.mark.parametrize("dtype,trans_b,out_dtype,num_cu", [(E4M3, True, torch.bfloat16, None),
                                                            (E5M2, False, torch.float16, 2)])
def test_rows_op_bit_exact(dtype, trans_b, out_dtype, num_cu):
    c = rows_case(dtype=dtype, trans_b=trans_b)
    out = mxgemm.grouped_gemm_fp8_kernel(**c, trans_b=trans_b, out_dtype=out_dtype, num_cu=num_cu)
    ref = reference.grouped_gemm_fp8_ref(c["a"], c["a_scale"].reshape(()), c["b"], c["b_scale"].reshape(()),
                                         offsets(c["group_lens"].tolist()), trans_b=trans_b, out_dtype=out_dtype)
    assert ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(out, ref, "grouped_gemm_fp8_kernel")


def test_variable_k_op_bit_exact_with_given_offsets():
    c = variable_k_case()
    offs = offsets(c["group_lens"].tolist())
    out = torch.full((3, 48, 80), float("nan"), dtype=torch.bfloat16)
    got = mxgemm.grouped_gemm_fp8_variable_k(**c, group_offs=offs, out=out)
    assert got is out
    ref = reference.grouped_gemm_fp8_variable_k_ref(c["a"], c["a_scale"], c["b"], c["b_scale"], offs)
    metrics.assert_bitwise_equal(out, ref, "grouped_gemm_fp8_variable_k")
    assert bool((out[1] == 0).all())   # the empty group


def test_explain_names_kernel_tiles_and_grid():
    p = mxgemm.explain("grouped_gemm_fp8_kernel", **rows_case(lens=(300, 212), n=128), num_cu=3)
    assert (p.kernel, p.variant["LAYOUT"], p.variant["BM"], p.variant["BN"], p.grid) == \
        ("train_grouped_gemm", "NT", 128, 128, (3, 1, 1))
    p = mxgemm.explain("grouped_gemm_fp8_variable_k", **variable_k_case(m=128, n=128), out_dtype=torch.float16)
    assert (p.variant["LAYOUT"], p.variant["OUT"], p.variant["BM"], p.grid) == ("TN", "f16", 64, (3 * 2 * 2, 1, 1))
    assert "variable-K" in str(p)


def _with(case, **changes):
    return {**case, **changes}


ROWS = rows_case()
VK = variable_k_case()
ROWS_BAD = [
    ("dtype", _with(ROWS, a=ROWS["a"].to(torch.float16)), r"\[dtype\] a has dtype torch.float16"),
    ("dtype-b", _with(ROWS, b=ROWS["b"].to(torch.bfloat16)), r"\[dtype\] b has dtype torch.bfloat16; expected"),
    ("mixed-forward", _with(ROWS, b=ROWS["b"].to(torch.float32).to(E5M2)),
     r"\[dtype\] no NT variant for a torch.float8_e4m3fn x b torch.float8_e5m2 -> torch.bfloat16; registered for NT: e4m3 x e4m3 -> bf16"),
    ("scale", _with(ROWS, a_scale=torch.ones(2)), r"\[scale-shape\] a_scale \[2\] and b_scale \[1\] fit no scale "
                                                  r"granularity of this call; expected tensor: a_scale \[1\] or \[\]"),
    ("k-mismatch", _with(ROWS, b=fp8(3, 64, 96)), r"\[shape\] b has K = 96 .* but a has K = 128"),
    ("groups", _with(ROWS, b=fp8(2, 64, 128)), r"\[shape\] b holds 2 groups .* group_lens has 3"),
    ("offs-shape", _with(ROWS, group_offs=torch.zeros(3, dtype=torch.int64)),
     r"\[shape\] group_offs has shape \[3\]; expected \[4\]"),
    ("offs-values", _with(ROWS, group_offs=torch.tensor([0, 40, 41, 117])),
     r"\[group_offs\] group_offs\[2\] = 41; expected 40"),
    ("lens-sum", _with(ROWS, group_lens=torch.tensor([40, 0, 78])),
     r"\[group_lens\] group_lens sums to 118, more than a.shape\[0\] \(sum_m\) = 117"),
    ("lens-negative", _with(ROWS, group_lens=torch.tensor([41, -1, 77])), r"\[group_lens\] group_lens\[1\] = -1"),
    ("lens-dtype", _with(ROWS, group_lens=torch.tensor([40, 0, 77], dtype=torch.int32)),
     r"\[dtype\] group_lens has dtype torch.int32"),
    ("contiguity", _with(ROWS, b=fp8(3, 128, 64).transpose(1, 2)), r"\[contiguity\] b must be contiguous"),
    ("n-align", _with(ROWS, b=fp8(3, 40, 128)), r"\[N%16\] N = 40"),
    ("device", _with(ROWS, group_lens=ROWS["group_lens"].to("meta")), r"\[device\]"),
    # scale granularities: shapes that fit none, a granularity the shapes do not have
    ("block-a-scale-k-blocks", _with(ROWS, a_scale=torch.ones(117, 2), b_scale=torch.ones(3, 1, 1)),
     r"\[scale-shape\] a_scale \[117, 2\] and b_scale \[3, 1, 1\] fit no scale granularity .*block: a_scale "
     r"\[117, 1\], b_scale \[3, 1, 1\] or \[3, 64, 1\]"),
    ("block-b-scale-columns", _with(ROWS, a_scale=torch.ones(117, 1), b_scale=torch.ones(3, 32, 1)),
     r"\[scale-shape\] a_scale \[117, 1\] and b_scale \[3, 32, 1\] fit no scale granularity"),
    ("row-b-scale-groups", _with(ROWS, a_scale=torch.ones(117), b_scale=torch.ones(2, 64)),
     r"\[scale-shape\] .* row: a_scale \[117\], b_scale \[3, 64\]"),
    ("granularity-not-fitting", _with(ROWS, a_scale=torch.ones(117), b_scale=torch.ones(3, 64), granularity="block"),
     r"\[scale-shape\] a_scale \[117\] and b_scale \[3, 64\] fit no block granularity"),
    ("granularity-name", _with(ROWS, granularity="channel"), r"\[granularity\] granularity = 'channel'"),
    ("block-e4m3-x-e5m2", _with(ROWS, b=ROWS["b"].float().to(E5M2), a_scale=torch.ones(117, 1),
                                b_scale=torch.ones(3, 1, 1)),
     r"\[dtype\] no NT variant with block scales for a torch.float8_e4m3fn x b torch.float8_e5m2"),
    ("trans-a-without-trans-b", _with(ROWS, a=fp8(128, 117), b=fp8(3, 128, 64), trans_a=True, trans_b=False),
     r"\[layout\] trans_a=True \(a \[K, sum_m\]\) takes b as \[G, N, K\]"),
    ("tt-sum-m-align", _with(ROWS, a=fp8(128, 117), trans_a=True), r"\[sum_m%16\] sum_m \(a.shape\[1\], trans_a\)"),
]


@pytest.mark.parametrize("name,args,match", ROWS_BAD, ids=[b[0] for b in ROWS_BAD])
def test_rows_op_guards_leave_out_untouched(name, args, match):
    out = torch.full((117, 64), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(guards.GuardError, match=match):
        mxgemm.grouped_gemm_fp8_kernel(**args, out=out)
    assert bool(out.isnan().all())


def test_tensors_on_a_device_without_a_gfx950_kernel_raise_arch():
    with pytest.raises(guards.GuardError, match=r"\[arch\] .* tensors are on meta"):
        mxgemm.grouped_gemm_fp8_kernel(**{k: v.to("meta") for k, v in ROWS.items()})
    with pytest.raises(guards.GuardError, match=r"\[arch\]"):
        mxgemm.grouped_gemm_fp8_variable_k(**{k: v.to("meta") for k, v in VK.items()})


VK_BAD = [
    ("dtype", _with(VK, b=VK["b"].float()), r"\[dtype\] b has dtype torch.float32; expected"),
    ("k-mismatch", _with(VK, b=fp8(186, 80)), r"\[shape\] b has 186 contraction rows .* but a has 187"),
    ("lens-sum", _with(VK, group_lens=torch.tensor([130, 0, 60])),
     r"\[group_lens\] group_lens sums to 190, more than a.shape\[0\] \(sum_k\) = 187"),
    ("m-align", _with(VK, a=fp8(187, 40)), r"\[M%16\] M = 40"),
    ("out-dtype", _with(VK, out_dtype=torch.float64), r"\[dtype\] out_dtype is torch.float64"),
    ("contiguity", _with(VK, a=fp8(48, 187).T), r"\[contiguity\] a must be contiguous"),
    ("block-group-start", _with(VK, a_scale=torch.ones(2, 48), b_scale=torch.ones(2, 1)),
     r"\[group_offs\] group 2 starts at row 130, not a multiple of 128: block scales of the wgrad"),
    ("row-scale-shape", _with(VK, a_scale=torch.ones(3, 47), b_scale=torch.ones(80)),
     r"\[scale-shape\] a_scale \[3, 47\] and b_scale \[80\] fit no scale granularity .*row: a_scale \[48\] or "
     r"\[3, 48\], b_scale \[80\] or \[3, 80\]"),
]


@pytest.mark.parametrize("name,args,match", VK_BAD, ids=[b[0] for b in VK_BAD])
def test_variable_k_op_guards_leave_out_untouched(name, args, match):
    out = torch.full((3, args["a"].shape[1], 80), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(guards.GuardError, match=match):
        mxgemm.grouped_gemm_fp8_variable_k(**{**args, "out_dtype": args.get("out_dtype", torch.bfloat16)}, out=out)
    assert bool(out.isnan().all())


def test_scale_granularity_ambiguous_or_misaligned_raises():
    """[G, X] scales of a wgrad with G = ceil(sum_k / 128) fit both row and block: granularity=
    decides (and runs); TT groups starting off a multiple of 16 are refused (16-byte reads along
    sum_m). out stays untouched."""
    c = variable_k_case(lens=(128, 59))
    scales = dict(a_scale=torch.full((2, 48), 0.5), b_scale=torch.full((2, 80), 2.0))
    out = torch.full((2, 48, 80), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(guards.GuardError, match=r"\[granularity\] a_scale \[2, 48\] and b_scale \[2, 80\] fit both "
                                                r"row and block scales: pass granularity="):
        mxgemm.grouped_gemm_fp8_variable_k(**{**c, **scales}, out=out)
    assert bool(out.isnan().all())
    got = mxgemm.grouped_gemm_fp8_variable_k(**{**c, **scales}, granularity="row")
    offs = offsets([128, 59])
    metrics.assert_bitwise_equal(got, reference.grouped_gemm_fp8_variable_k_ref(
        c["a"], scales["a_scale"], c["b"], scales["b_scale"], offs, granularity="row"), "row")
    tt = dict(rows_case(lens=(40, 0, 88)), trans_a=True)
    tt["a"] = tt["a"].T.contiguous()
    out = torch.full((128, 64), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(guards.GuardError, match=r"\[group_offs\] group 2 starts at row 40, not a multiple of 16"):
        mxgemm.grouped_gemm_fp8_kernel(**tt, out=out)
    assert bool(out.isnan().all())


def test_mixed_formats_bit_exact():
    """e5m2 x e4m3 (and e4m3 x e5m2) operands: one MFMA format code per source, same bits as the
    reference decoding each operand in its own format; large problems take the largest mixed tile."""
    c = rows_case(n=64, k=128, trans_b=False)
    c["a"] = c["a"].to(torch.float32).to(E5M2)
    ref = reference.grouped_gemm_fp8_ref(c["a"], c["a_scale"], c["b"], c["b_scale"], offsets([40, 0, 77]),
                                         trans_b=False)
    metrics.assert_bitwise_equal(mxgemm.grouped_gemm_fp8_kernel(**c, trans_b=False), ref, "NN e5m2 x e4m3")
    v = variable_k_case()
    v["b"] = v["b"].to(torch.float32).to(E5M2)
    ref = reference.grouped_gemm_fp8_variable_k_ref(v["a"], v["a_scale"], v["b"], v["b_scale"],
                                                    offsets([130, 0, 57]))
    metrics.assert_bitwise_equal(mxgemm.grouped_gemm_fp8_variable_k(**v), ref, "TN e4m3 x e5m2")
    big = variable_k_case(m=256, n=256)
    big["b"] = big["b"].to(torch.float32).to(E5M2)
    p = mxgemm.explain("grouped_gemm_fp8_variable_k", **big)
    assert (p.variant["FMT"], p.variant["FMT_B"], p.variant["BM"], p.variant["BN"]) == ("e4m3", "e5m2", 256, 128)
    fwd = rows_case(n=64, k=128)                    # a forward never mixes formats
    fwd["b"] = fwd["b"].to(torch.float32).to(E5M2)
    with pytest.raises(guards.GuardError, match=r"\[dtype\] no NT variant for a torch.float8_e4m3fn x b torch.float8_e5m2"):
        mxgemm.grouped_gemm_fp8_kernel(**fwd)


@pytest.mark.parametrize("trans_b,fmt,dtype,y_db,grad_db", [
    (True, "e4m3", torch.bfloat16, 25.0, 25.0), (False, "e5m2", torch.bfloat16, 20.0, 20.0),
    (True, "hybrid", torch.bfloat16, 25.0, 20.0), (False, "hybrid", torch.bfloat16, 25.0, 20.0),
    (True, "hybrid", torch.float16, 25.0, 20.0), (False, "hybrid", torch.float16, 25.0, 20.0)])
def test_autograd_op_forward_and_backward(trans_b, fmt, dtype, y_db, grad_db):
    """mxgemm.grouped_gemm_fp8 (dynamic tensorwise quantisation + autograd): y, grad_a and
    grad_b are bit-identical to the reference on the quantised tensors (hybrid: a and b in
    e4m3, grad_out in e5m2, both weight layouts and both half outputs), and within y_db /
    grad_db SNR of fp32 math on the unquantised ones."""
    from mxgemm.ops.train_grouped_gemm import FORMATS
    from mxgemm.quant import tensorwise_cast_to_fp8
    g = torch.Generator().manual_seed(7)
    lens, n, k = [40, 0, 77], 96, 128
    offs = offsets(lens)
    x = torch.randn(sum(lens), k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(3, n, k, generator=g) * 0.05 if trans_b else torch.randn(3, k, n, generator=g) * 0.05)
    w = w.to(dtype).requires_grad_()
    dy = torch.randn(sum(lens), n, generator=g).to(dtype)
    y = mxgemm.grouped_gemm_fp8(x, w, torch.tensor(lens), trans_b=trans_b, format=fmt)
    y.backward(dy)
    fwd, grad = FORMATS[fmt]
    (xq, xs), (wq, ws), (dq, ds) = (tensorwise_cast_to_fp8(t.detach(), f) for t, f in ((x, fwd), (w, fwd), (dy, grad)))
    ref = functools.partial(reference.grouped_gemm_fp8_ref, out_dtype=dtype)
    metrics.assert_bitwise_equal(y, ref(xq, xs, wq, ws, offs, trans_b=trans_b), "y")
    metrics.assert_bitwise_equal(x.grad, ref(dq, ds, wq, ws, offs, trans_b=not trans_b), "grad_a")
    vk = functools.partial(reference.grouped_gemm_fp8_variable_k_ref, out_dtype=dtype)
    metrics.assert_bitwise_equal(w.grad, vk(dq, ds, xq, xs, offs) if trans_b else vk(xq, xs, dq, ds, offs), "grad_b")
    rows = [slice(s, e) for s, e in zip(offs[:-1].tolist(), offs[1:].tolist())]
    xf, wf, dyf = x.detach().float(), w.detach().float(), dy.float()
    bmat = [wf[i].T if trans_b else wf[i] for i in range(3)]    # [k, n]
    y_ref = torch.cat([xf[r] @ bmat[i] for i, r in enumerate(rows)])
    dx_ref = torch.cat([dyf[r] @ bmat[i].T for i, r in enumerate(rows)])
    dw_ref = torch.stack([dyf[r].T @ xf[r] if trans_b else xf[r].T @ dyf[r] for r in rows])
    snrs = {name: metrics.snr_db(got.float(), ref) for name, got, ref in
            (("y", y.detach(), y_ref), ("grad_a", x.grad, dx_ref), ("grad_b", w.grad, dw_ref))}
    print(f"\n{fmt} trans_b={trans_b} SNR dB: " + ", ".join(f"{k_}={v:.1f}" for k_, v in snrs.items()))
    assert snrs["y"] >= y_db and snrs["grad_a"] >= grad_db and snrs["grad_b"] >= grad_db, snrs


def test_autograd_op_fp32_inputs_and_guards():
    x, w = torch.randn(4, 16, requires_grad=True), torch.randn(1, 16, 16, requires_grad=True)
    y = mxgemm.grouped_gemm_fp8(x, w, torch.tensor([4]), out_dtype=torch.bfloat16)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == w.grad.dtype == torch.float32
    with pytest.raises(guards.GuardError, match=r"\[dtype\] out_dtype is torch.float32 \(a's dtype when None\)"):
        mxgemm.grouped_gemm_fp8(x, w, torch.tensor([4]))
    with pytest.raises(guards.GuardError, match=r"\[dtype\] a and b must share one dtype.*got a torch.float32, b "
                                                 r"torch.bfloat16"):
        mxgemm.grouped_gemm_fp8(x, w.bfloat16(), torch.tensor([4]))
    with pytest.raises(guards.GuardError, match=r"\[format\] format = 'e3m4'; expected one of 'e4m3', 'e5m2', "
                                                 r"'hybrid'"):
        mxgemm.grouped_gemm_fp8(x.bfloat16(), w.bfloat16(), torch.tensor([4]), format="e3m4")


def test_heuristic_persistent_128_tiles_loop_bit_exact():
    """The heuristic's forward: 128 x 128 tiles (loads two steps ahead) on a persistent grid; with
    num_cu = 2 each workgroup runs five tiles of two groups in a row, K 400 ends in a partial step."""
    c = rows_case(lens=(300, 0, 212), n=256, k=400)
    p = mxgemm.explain("grouped_gemm_fp8_kernel", **c, num_cu=2)
    assert (p.variant["BM"], p.variant["BN"], p.grid[0]) == (128, 128, 2)
    ref = reference.grouped_gemm_fp8_ref(c["a"], c["a_scale"], c["b"], c["b_scale"], offsets([300, 0, 212]))
    metrics.assert_bitwise_equal(mxgemm.grouped_gemm_fp8_kernel(**c, num_cu=2), ref, "persistent 128 x 128")


@pytest.mark.parametrize("bn", [192, 224, 256])
def test_persistent_256_tiles_dma_bit_exact(bn):
    """256-row tiles whose operands reach LDS by DMA, one workgroup per CU; with num_cu = 2 each
    workgroup runs its tiles in a row (each tile's first DMA after the previous tile's reads), partial
    in rows, columns and K."""
    c = rows_case(lens=(300, 0, 480), n=288, k=400)
    cfg = dict(BM=256, BN=bn, GROUP_M=2, PERSISTENT=1)
    p = mxgemm.explain("grouped_gemm_fp8_kernel", **c, num_cu=2, config=cfg)
    assert (p.variant["BM"], p.variant["BN"], p.grid[0]) == (256, bn, 2)
    ref = reference.grouped_gemm_fp8_ref(c["a"], c["a_scale"], c["b"], c["b_scale"], offsets([300, 0, 480]))
    metrics.assert_bitwise_equal(mxgemm.grouped_gemm_fp8_kernel(**c, num_cu=2, config=cfg), ref, f"persistent 256 x {bn}")


@pytest.mark.parametrize("layout,G,M,N,bn", [
    ("NT", 8, 8 * 512, 2880, 192),     # 240 tiles: one round of 256 CUs (256 x 256: 192 tiles, also one)
    ("NT", 8, 8 * 512, 7168, 224),     # 512 tiles: two rounds (256 x 256: 448, two; 256 x 192: 608, three)
    ("NT", 8, 8 * 512, 4096, 256),     # 256 tiles: one round
    ("NN", 8, 8 * 512, 2880, 256), ("TN", 8, 2880, 2880, 256),
    ("NN", 8, 8 * 512, 2048, 128),     # 128 tiles of 256 x 256 for 256 CUs
    ("NT", 8, 8 * 200, 2880, 128),     # under 256 rows per group
])
def test_heuristic_256_tiles_when_they_fill_the_cus(layout, G, M, N, bn):
    """The rule takes a 256-row DMA tile at 256 rows per group and 256 columns when 256 x 256 tiles
    make 3/4 of one per CU, of the widths the call's formats have the one whose rounds of tiles over
    the CUs cost least (a tile's cost: its width), and none where the formats have none."""
    cfg = op.heuristic_config(layout, G, M, N)
    assert (cfg["BM"], cfg["BN"]) == ((256, bn) if bn > 128 else (256 if layout == "TN" else 128, 128))
    assert cfg["PERSISTENT"] == (1 if bn > 128 else 0 if layout == "TN" else 2)   # DMA tiles in a row per CU
    assert op.heuristic_config(layout, G, M, N, wide=())["BN"] == 128
    assert op.heuristic_config(layout, G, M, N, wide=(256,))["BN"] == (256 if bn > 128 else 128)


def test_forced_config_same_bits_and_explained():
    """Configs change speed, never bits: a persistent GROUP_M=1 grid of 64 x 64 tiles gives the
    heuristic's output; explain names the config and where it came from."""
    c = rows_case(n=128)
    cfg = dict(BM=64, BN=64, GROUP_M=1, PERSISTENT=1)
    p = mxgemm.explain("grouped_gemm_fp8_kernel", **c, config=cfg)
    assert (p.variant["BM"], p.args["group_m"], p.grid[0]) == (64, 1, (2 + 3) * 2)
    assert "1 per CU" in p.reason and "config given by the caller" in p.reason
    assert "config: heuristic" in mxgemm.explain("grouped_gemm_fp8_kernel", **c).reason
    metrics.assert_bitwise_equal(mxgemm.grouped_gemm_fp8_kernel(**c, config="BM=64,BN=64,GROUP_M=1,PERSISTENT=1"),
                                 mxgemm.grouped_gemm_fp8_kernel(**c), "forced config")


@pytest.mark.parametrize("config,match", [
    ("BM=32,BN=64,GROUP_M=1,PERSISTENT=0", r"\[config\] no registered NT e4m3 x e4m3 -> bf16 variant with 32 x 64 tiles; registered tiles: 64 x 64, "
     r"128 x 128, 256 x 128, 256 x 192, 256 x 224, 256 x 256$"),
    ({"BM": 64, "BN": 64, "GROUP_M": 3, "PERSISTENT": 0}, r"\[config\] .*GROUP_M in \(1, 2, 4, 8\)"),
    ("BM=64,BN=64", r"\[config\] grouped_gemm_fp8: config .* lacks GROUP_M, PERSISTENT; expected 'KEY=value,...' "
                    r"or a dict with all of: BM \(int\), BN \(int\), GROUP_M \(int\), PERSISTENT \(int\)"),
    ("tiles=big", r"\[config\] grouped_gemm_fp8: config has unknown key 'tiles'"),
    ("BM 64", r"\[config\] grouped_gemm_fp8: config 'BM 64' has a part without '='"),
    ("BM=x,BN=64,GROUP_M=1,PERSISTENT=0", r"\[config\] .* has a value that is not int"),
])
def test_bad_config_raises(config, match):
    with pytest.raises(guards.GuardError, match=match):
        mxgemm.grouped_gemm_fp8_kernel(**ROWS, config=config)


def test_planner_reads_the_tuned_table(tmp_path, monkeypatch):
    """A tuned row for the problem (layout, G, M, N, K) replaces the heuristic (a shape planned
    nowhere else: plans are memoised per shape)."""
    from mxgemm import tuned
    from mxgemm.ops import train_grouped_gemm as op
    row = dict(layout="TN", G=3, M=128, N=144, K=187, BM=128, BN=128, GROUP_M=4, PERSISTENT=2, us="1.00",
               source="measured")
    tuned.write_rows([row], tmp_path / "t.csv", list(row))
    monkeypatch.setattr(op, "CONFIG_CSV", tmp_path / "t.csv")
    op.tuned_table.cache_clear()
    try:
        p = mxgemm.explain("grouped_gemm_fp8_variable_k", **variable_k_case(m=128, n=144))
    finally:
        op.tuned_table.cache_clear()
    assert (p.variant["BM"], p.variant["BN"], p.args["group_m"], p.grid[0]) == (128, 128, 4, 3 * 2)
    assert "2 per CU" in p.reason and "config: tuned table row (source=measured)" in p.reason


def test_autograd_op_with_a_padded_tail():
    """Over-allocated a (rows past sum(group_lens)): out's tail rows and grad_a's are zeros,
    grad_b is that of the rows in the groups alone (tail rows of zeros here: the tensorwise
    scales are each tensor's amax, tail included)."""
    g = torch.Generator().manual_seed(3)
    lens = torch.tensor([24, 0, 40])
    a, b = torch.randn(64 + 30, 128, generator=g).bfloat16(), torch.randn(3, 32, 128, generator=g).bfloat16()
    dy = torch.randn(64 + 30, 32, generator=g).bfloat16()
    a[64:], dy[64:] = 0, 0
    a1, b1 = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = mxgemm.grouped_gemm_fp8(a1, b1, lens)
    out.backward(dy)
    assert bool((out[64:] == 0).all()) and bool((a1.grad[64:] == 0).all())
    a2, b2 = a[:64].clone().requires_grad_(), b.clone().requires_grad_()
    mxgemm.grouped_gemm_fp8(a2, b2, lens).backward(dy[:64])
    assert torch.equal(b1.grad, b2.grad) and torch.equal(a1.grad[:64], a2.grad)


class _Enum(enum.Enum):   # stand-ins for Primus-Turbo's Format / ScalingGranularity / ScaleDtype members
    E4M3, E5M2, HYBRID, TENSORWISE, ROWWISE, MX_BLOCKWISE, FP32, E8M0 = range(8)


@dataclasses.dataclass
class Float8QuantConfig:   # Primus-Turbo's fields, read by name
    format: _Enum = _Enum.E4M3
    granularity: _Enum = _Enum.TENSORWISE
    scale_dtype: _Enum = _Enum.FP32
    block_size: int | None = None


def test_autograd_op_takes_primus_turbo_signature_and_config():
    """Primus-Turbo's call, positional (a, b, group_lens, group_offs, trans_b, out_dtype, config,
    num_cu), gives format="hybrid"'s bits for Format.HYBRID; what it cannot do is refused by name."""
    g = torch.Generator().manual_seed(5)
    lens = torch.tensor([24, 0, 40])
    a, b = torch.randn(64, 128, generator=g).bfloat16(), torch.randn(3, 32, 128, generator=g).bfloat16()
    want = mxgemm.grouped_gemm_fp8(a, b, lens, format="hybrid")
    got = mxgemm.grouped_gemm_fp8(a, b, lens, None, True, None, Float8QuantConfig(_Enum.HYBRID), 2)
    assert torch.equal(got, want)
    for config, rule in ((Float8QuantConfig(granularity=_Enum.MX_BLOCKWISE, block_size=32), "scale_dtype"),
                         (Float8QuantConfig(scale_dtype=_Enum.E8M0), "scale_dtype")):
        with pytest.raises(guards.GuardError, match=rf"\[{rule}\] config.{rule} = "):
            mxgemm.grouped_gemm_fp8(a, b, lens, config=config)
    with pytest.raises(guards.GuardError, match=r"\[format\] config.format = 'e4m3' and format = 'e5m2'"):
        mxgemm.grouped_gemm_fp8(a, b, lens, config=Float8QuantConfig(), format="e5m2")


def test_autograd_op_refuses_pre_quantised_inputs_by_name():
    class QuantizedTensor(torch.Tensor):    # the name of Primus-Turbo's pre-quantised wrapper
        pass
    a = torch.randn(64, 128).bfloat16().as_subclass(QuantizedTensor)
    with pytest.raises(guards.GuardError, match=r"\[type\] a must be a bf16 / fp16 / fp32 torch.Tensor .* got "
                                                 r"QuantizedTensor"):
        mxgemm.grouped_gemm_fp8(a, torch.randn(3, 32, 128).bfloat16(), torch.tensor([24, 0, 40]))
