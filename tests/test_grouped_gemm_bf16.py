"""BF16 / FP16 grouped GEMM: the FMT=bf16 and FMT=f16 variants of the train_grouped_gemm kernel body
(no scales, v_mfma_f32_16x16x32_bf16 / _f16) through mxgemm.grouped_gemm_bf16_kernel /
grouped_gemm_bf16_variable_k on the emulator (race mode, shuffled workgroup order).

Spec: every layout (NT forward, NN dgrad, TT a MN-major, TN variable-K wgrad) x out dtype
(bf16, f16, f32) x accumulate is bit-identical to mxgemm.reference.grouped_gemm_bf16_ref /
grouped_gemm_bf16_variable_k_ref (each 32-wide contraction chunk summed exactly and rounded once
to fp32, chunks added in order into fp32 from +0, out's value added in fp32, one RNE), for ragged
groups with an empty one, N / K (M for TN) off the 64-tile and off the 64-element step, an
over-allocated a whose tail rows come out zero (accumulate: out's value), persistent grids, the
hardware tiles; wide-range bf16 data (where float64 chunk sums are inexact) stays bit-exact.
FP16 operands: every FMT=f16 variant (NT / NN / TN in fp16, TN accumulating into fp32) bit-exact
in the same model, out in a's dtype by default, sums past fp16's range stored as +-inf (RNE
overflow: 65519 -> 65504, 65520 -> inf), as a hardware fp16 store does.
Every broken rule raises GuardError naming the rule, the argument and the value. Code objects:
no spills, two 16-bit MFMAs (bf16 or f16, the operands' own) per 16 x 16 tile per 128-byte step,
ds_read_b64_tr_b16 for MN-major operands, no scaled MFMA and no scale load.
"""
from fractions import Fraction

import numpy as np
import pytest
import torch

import mxgemm
from mxgemm import build, guards, launcher, metrics, reference, registry

KERNEL = "train_grouped_gemm"
OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
CFG64 = "BM=64,BN=64,GROUP_M=2,PERSISTENT=0"
HALF_VARIANTS = [v for v in registry.get(KERNEL).variants if v["FMT"] in ("bf16", "f16")]


def bf16(g, *shape, spread=0, dtype=torch.bfloat16):
    """Gaussian bf16 (or fp16) values; spread: times 2^u, u uniform integer in [-spread, spread]."""
    x = torch.randn(*shape, generator=g)
    if spread:
        x = x * torch.exp2(torch.randint(-spread, spread + 1, shape, generator=g).float())
    return x.to(dtype)


def offsets(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)


def case(layout, lens, n, k, seed=0, tail=0, spread=0, dtype=torch.bfloat16):
    """NT / NN / TT: a [sum_m + tail, k] (TT: [k, sum_m + tail]), b [G, n, k] (NN: [G, k, n]),
    out [sum_m + tail, n]; TN: a [sum_k + tail, n], b [sum_k + tail, k], out [G, n, k]."""
    g = torch.Generator().manual_seed(seed)
    rows, G = sum(lens) + tail, len(lens)
    x = lambda *shape: bf16(g, *shape, spread=spread, dtype=dtype)  # noqa: E731
    if layout == "TN":
        return x(rows, n), x(rows, k)
    a = x(k, rows) if layout == "TT" else x(rows, k)
    return a, x(G, k, n) if layout == "NN" else x(G, n, k)


def out_shape(layout, a, b, lens):
    if layout == "TN":
        return len(lens), a.shape[1], b.shape[1]
    return (a.shape[1] if layout == "TT" else a.shape[0]), (b.shape[2] if layout == "NN" else b.shape[1])


def run_op(layout, a, b, lens, out_dtype, init=None, config=CFG64, num_cu=None):
    """The op on the emulator; out starts NaN (no element may keep it), or init (accumulate)."""
    kw = dict(out_dtype=out_dtype, config=config)
    if init is not None:
        kw.update(out=init.clone(), accumulate=True)
    else:
        kw.update(out=torch.full(out_shape(layout, a, b, lens), float("nan"), dtype=out_dtype))
    group_lens = torch.tensor(lens, dtype=torch.int64)
    with launcher.emulator_settings(race_check=True, wg_order="shuffled", seed=5):
        if layout == "TN":
            return mxgemm.grouped_gemm_bf16_variable_k(a, b, group_lens, **kw)
        return mxgemm.grouped_gemm_bf16_kernel(a, b, group_lens, trans_a=layout == "TT", trans_b=layout != "NN",
                                               num_cu=num_cu, **kw)


def reference_out(layout, a, b, lens, out_dtype, init=None):
    if layout == "TN":
        return reference.grouped_gemm_bf16_variable_k_ref(a, b, offsets(lens), out_dtype, accumulate_into=init)
    return reference.grouped_gemm_bf16_ref(a, b, offsets(lens), trans_b=layout != "NN", out_dtype=out_dtype,
                                           a_mn_major=layout == "TT", accumulate_into=init)


# (layout, out, accumulate, group sizes, N, K, options); TN: sizes along the contraction, (N, K)
# the output's [rows, columns]. K off the 64-element step; TT's groups start on multiples of 16.
CASES = [
    ("NT", "bf16", False, [40, 0, 77], 80, 144, dict(tail=5)),
    ("NT", "f32", True, [40, 0, 77], 48, 208, dict(tail=3)),
    ("NT", "f16", False, [1, 65], 64, 16, dict(num_cu=2)),
    ("NN", "f16", False, [3, 70, 0], 96, 80, dict(num_cu=2)),
    ("NN", "bf16", True, [65, 0, 12], 80, 272, {}),
    ("NN", "f32", False, [3, 70, 0], 48, 144, dict(tail=9)),
    ("TT", "bf16", False, [16, 0, 80], 48, 208, dict(tail=16)),
    ("TT", "f32", True, [32, 0, 48], 64, 144, {}),
    ("TT", "f16", False, [16, 48], 112, 80, {}),
    ("TN", "bf16", False, [130, 0, 57], 48, 80, dict(tail=7)),
    ("TN", "f32", True, [64, 0, 70, 3], 80, 48, {}),
    ("TN", "f16", True, [100, 0, 29], 48, 64, {}),
    ("TN", "bf16", True, [70, 0, 1], 64, 48, {}),
    ("TN", "f32", False, [0, 90], 32, 96, {}),
    # fp16 operands: every FMT=f16 variant
    ("NT", "f16", False, [40, 0, 77], 80, 144, dict(tail=5, fp16=True, num_cu=2)),
    ("NN", "f16", False, [3, 70, 0], 96, 208, dict(tail=9, fp16=True)),
    ("TN", "f16", False, [130, 0, 57], 48, 80, dict(tail=7, fp16=True)),
    ("TN", "f32", True, [64, 0, 70, 3], 80, 48, dict(fp16=True)),
]


@pytest.mark.parametrize("c", CASES, ids=[f"{c[0]}-{c[1]}{'-acc' if c[2] else ''}-G{len(c[3])}"
                                          f"{'-fp16' if c[6].get('fp16') else ''}" for c in CASES])
def test_bit_exact_vs_reference(c):
    layout, out, acc, lens, n, k, opt = c
    out_dtype = OUT[out]
    a, b = case(layout, lens, n, k, seed=len(lens) + n, tail=opt.get("tail", 0),
                dtype=torch.float16 if opt.get("fp16") else torch.bfloat16)
    init = None
    if acc:
        init = torch.randn(out_shape(layout, a, b, lens), generator=torch.Generator().manual_seed(9)).to(out_dtype)
    got = run_op(layout, a, b, lens, out_dtype, init, num_cu=opt.get("num_cu"))
    ref = reference_out(layout, a, b, lens, out_dtype, init)
    assert ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(got, ref, f"grouped bf16 {layout} {out}")
    if layout == "TN":
        empty = [g for g, m in enumerate(lens) if m == 0]
        for g in empty:   # an empty group: zeros, or out's own values
            assert torch.equal(got[g], init[g] if acc else torch.zeros_like(got[g]))
    elif opt.get("tail"):
        tail = got[sum(lens):]
        assert torch.equal(tail, init[sum(lens):] if acc else torch.zeros_like(tail))


def test_wide_range_values_bit_exact():
    """Magnitudes 2^-40 .. 2^40 within one 32-chunk: float64 chunk sums would round; the
    reference sums those exactly, as the emulator's MFMA does."""
    for layout in ("NT", "TN"):
        a, b = case(layout, [50, 14], 64, 96, seed=3, spread=40)
        metrics.assert_bitwise_equal(run_op(layout, a, b, [50, 14], torch.float32),
                                     reference_out(layout, a, b, [50, 14], torch.float32), f"wide {layout}")


@pytest.mark.parametrize("layout,tile", [("NT", (128, 128)), ("NN", (128, 128)), ("TT", (256, 128)),
                                         ("TN", (256, 128))])
def test_hardware_tiles_bit_exact(layout, tile):
    lens = [144, 0, 112] if layout != "TN" else [100, 60]
    a, b = case(layout, lens, 256 if layout == "TN" else 144, 128, seed=4)
    cfg = f"BM={tile[0]},BN={tile[1]},GROUP_M=1,PERSISTENT=0"
    metrics.assert_bitwise_equal(run_op(layout, a, b, lens, torch.bfloat16, config=cfg),
                                 reference_out(layout, a, b, lens, torch.bfloat16), f"{layout} {tile}")


def _f32_rne(x: Fraction) -> np.float32:
    """The fp32 nearest (ties to even) to an exact rational (normal range)."""
    if x == 0:
        return np.float32(0)
    e = x.numerator.bit_length() - x.denominator.bit_length()       # 2^e <= |x| < 2^(e + 2)
    e += abs(x) >= Fraction(2) ** (e + 1)
    q = Fraction(2) ** (max(e, -126) - 23)
    return np.float32(float(round(x / q) * q))                       # round(): half to even


def test_fp16_reference_is_the_chunk_model():
    """The reference's fp16 path, against an independent model in exact rationals: each 32-wide
    chunk's products summed exactly and rounded once to fp32, the chunks added in fp32 from +0,
    then one RNE to fp16. Values spread over 2^-12 .. 2^12; out[0, 0] sums 2^24 + 1 + 2^-40, an fp32
    tie only the exact sum breaks (upwards: 2^24 + 2; a float64 sum drops the 2^-40 and ties to 2^24)."""
    g = torch.Generator().manual_seed(8)
    a, b = bf16(g, 5, 96, spread=12, dtype=torch.float16), bf16(g, 1, 7, 96, spread=12, dtype=torch.float16)
    a[0], b[0, 0] = 0, 0
    a[0, :3] = b[0, 0, :3] = torch.tensor([4096, 1, 2.0 ** -20])
    want = np.zeros((5, 7), np.float32)
    for i in range(5):
        for j in range(7):
            acc = np.float32(0)
            for c in range(0, 96, 32):
                acc = np.float32(acc + _f32_rne(sum(Fraction(float(a[i, k])) * Fraction(float(b[0, j, k]))
                                                    for k in range(c, c + 32))))
            want[i, j] = acc
    assert want[0, 0] == 2 ** 24 + 2
    offs = torch.tensor([0, 5])
    metrics.assert_bitwise_equal(reference.grouped_gemm_bf16_ref(a, b, offs, out_dtype=torch.float32),
                                 torch.from_numpy(want), "fp32 accumulator")
    with np.errstate(over="ignore"):   # sums past 65504 become inf, as the fp16 store makes them
        half = torch.from_numpy(want.astype(np.float16))
    assert half.isinf().any() and half.isfinite().any()
    metrics.assert_bitwise_equal(reference.grouped_gemm_bf16_ref(a, b, offs, out_dtype=torch.float16), half, "fp16 out")


@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_fp16_out_overflows_to_inf(layout):
    """fp16 out is the RNE of the fp32 sum: 65519 stays 65504 (the largest fp16), 65520 and more
    become +-inf, as a hardware fp16 store rounds (IEEE overflow)."""
    inf = float("inf")
    # out[r, j] = 1 * hi + 1 * lo, both exact fp16: (hi, lo, the fp16 of hi + lo) per column j % 7
    table = [(65504, 15, 65504), (65504, 16, inf), (65504, 4496, inf), (-65504, -16, -inf), (65504, 65504, inf),
             (65504, 0, 65504), (1, 2, 3)]
    n, k, m = 16, 32, 64
    hi, lo, want = (torch.tensor([table[j % 7][c] for j in range(n)], dtype=torch.float16) for c in range(3))
    if layout == "NT":
        a, b, lens = torch.zeros(m, k, dtype=torch.float16), torch.zeros(1, n, k, dtype=torch.float16), [m]
        a[:, :2] = 1
        b[0, :, 0], b[0, :, 1] = hi, lo
    else:   # TN: a [sum_k, M], b [sum_k, N], one group over the contraction
        a, b, lens = torch.zeros(k, m, dtype=torch.float16), torch.zeros(k, n, dtype=torch.float16), [k]
        a[:2] = 1
        b[0], b[1] = hi, lo
    got = run_op(layout, a, b, lens, torch.float16)
    metrics.assert_bitwise_equal(got, reference_out(layout, a, b, lens, torch.float16), f"fp16 overflow {layout}")
    assert torch.equal(got.reshape(m, n), want.expand(m, n))


def test_group_offs_default_and_explain():
    a, b = case("NT", [40, 24], 64, 64)
    lens = torch.tensor([40, 24])
    out = mxgemm.grouped_gemm_bf16_kernel(a, b, lens)
    assert out.dtype == torch.bfloat16 and out.shape == (64, 64)
    metrics.assert_bitwise_equal(out, reference_out("NT", a, b, [40, 24], torch.bfloat16), "default call")
    p = mxgemm.explain("grouped_gemm_bf16_kernel", a, b, lens)
    assert p.kernel == KERNEL and p.variant["FMT"] == "bf16" and "bf16 (no scales)" in p.reason
    a, b = case("TN", [40, 24], 64, 64)
    p = mxgemm.explain("grouped_gemm_bf16_variable_k", a, b, lens, out_dtype=torch.float32)
    assert p.variant == dict(LAYOUT="TN", FMT="bf16", FMT_B="bf16", OUT="f32", BM=64, BN=64, ACCUM=0)
    for layout in ("NT", "NN", "TN"):   # fp16 operands: out fp16 by default, the f16 variant
        a, b = case(layout, [40, 24], 128, 128, dtype=torch.float16)
        if layout == "TN":
            p, out = (f(a, b, lens) for f in (mxgemm.grouped_gemm_bf16_variable_k.explain,
                                              mxgemm.grouped_gemm_bf16_variable_k))
        else:
            p, out = (f(a, b, lens, trans_b=layout == "NT") for f in (mxgemm.grouped_gemm_bf16_kernel.explain,
                                                                      mxgemm.grouped_gemm_bf16_kernel))
        assert p.variant == dict(LAYOUT=layout, FMT="f16", FMT_B="f16", OUT="f16", BM=64, BN=64)
        metrics.assert_bitwise_equal(out, reference_out(layout, a, b, [40, 24], torch.float16), f"fp16 {layout}")


def _guard_cases():
    a, b = case("NT", [40, 24], 64, 64)
    lens = torch.tensor([40, 24])
    e4m3 = a.to(torch.float8_e4m3fn)
    return [
        ("rows", (e4m3, b, lens), {}, r"\[dtype\] a has dtype torch.float8_e4m3fn; expected torch.bfloat16"),
        ("rows", (a, b.half(), lens), {}, r"\[dtype\] a is torch.bfloat16 and b torch.float16: the unscaled ops take "
                                          r"both operands in one dtype"),
        ("wgrad", (a.half(), a, lens), {}, r"\[dtype\] a is torch.float16 and b torch.bfloat16"),
        ("rows", (a.float(), b.float(), lens), {},
         r"\[dtype\] a has dtype torch.float32; expected torch.bfloat16 or torch.float16"),
        ("rows", (a.half(), b.half(), lens), dict(out_dtype=torch.bfloat16),
         r"\[dtype\] no NT variant for a torch.float16 x b torch.float16 -> torch.bfloat16; registered for NT: "
         r".*f16 x f16 -> f16"),
        ("rows", (a.T.contiguous().half(), b.half(), torch.tensor([48, 16])), dict(trans_a=True),
         r"\[dtype\] no TT variant for a torch.float16 x b torch.float16 -> torch.float16"),
        ("rows", (a.half(), b.half(), lens), dict(config="BM=128,BN=128,GROUP_M=1,PERSISTENT=0"),
         r"\[config\] no registered NT f16 x f16 -> f16 variant with 128 x 128 tiles; registered tiles: 64 x 64"),
        ("wgrad", (a.half(), a.half(), lens), dict(accumulate=True, out=torch.zeros(2, 64, 64).half()),
         r"\[dtype\] no TN variant for a torch.float16 x b torch.float16 -> torch.float16 accumulating into out"),
        ("rows", (a, b, lens), dict(accumulate=True), r"\[accumulate\] accumulate=True adds the product into out"),
        ("rows", (a, b, lens), dict(out_dtype=torch.float16, accumulate=True, out=torch.zeros(64, 64).half()),
         r"\[dtype\] no NT variant for a torch.bfloat16 x b torch.bfloat16 -> torch.float16 accumulating"),
        ("rows", (a, b[:, :, :48].contiguous(), lens), {}, r"\[shape\] b has K = 48"),
        ("rows", (a, b, torch.tensor([40, 25])), {}, r"\[group_lens\] group_lens sums to 65, more than a.shape\[0\]"),
        ("rows", (a.T.contiguous(), b, torch.tensor([40, 24])), dict(trans_a=True),
         r"\[group_offs\] group 1 starts at row 40, not a multiple of 16"),
        ("rows", (a, b, lens), dict(out_dtype=torch.int32), r"\[dtype\] out_dtype is torch.int32"),
        ("wgrad", (a, b, lens), {}, r"\[shape\] b must be 2-D; got shape \[2, 64, 64\]"),
        ("wgrad", (a, a[:, :40].contiguous(), lens), {}, r"N%16.*40|40.*N%16"),
        ("wgrad", (a, a, lens), dict(out_dtype=torch.float16, accumulate=True, out=torch.zeros(2, 64, 64).half(),
                                     config="BM=128,BN=128,GROUP_M=1,PERSISTENT=0"),
         r"\[config\] no registered TN bf16 x bf16 -> f16 variant with 128 x 128 tiles"),
    ]


@pytest.mark.parametrize("op,args,kw,match", _guard_cases())
def test_guards_name_the_rule_and_value(op, args, kw, match):
    fn = mxgemm.grouped_gemm_bf16_kernel if op == "rows" else mxgemm.grouped_gemm_bf16_variable_k
    with pytest.raises(guards.GuardError, match=match):
        fn(*args, **kw)


@pytest.mark.parametrize("variant", HALF_VARIANTS, ids=registry.variant_id)
def test_code_object(variant):
    art = build.artifact(KERNEL, variant)
    info = art.isa()
    print(f"\n{KERNEL} [{registry.variant_id(variant)}]: {info.summary(256)}")
    assert info.spills == 0 and info.scratch_bytes == 0 and 0 < info.lds_bytes <= 160 * 1024
    text = art.asm_path.read_text()
    own, other = ("bf16", "f16") if variant["FMT"] == "bf16" else ("f16", "bf16")
    assert f"v_mfma_f32_16x16x32_{own}" in text and f"v_mfma_f32_16x16x32_{other}" not in text
    assert "v_mfma_scale" not in text and "f8f6f4" not in text
    assert ("ds_read_b64_tr_b16" in text) == (variant["LAYOUT"] != "NT") and "ds_read_b64_tr_b8" not in text
    # no scale load: the only buffer loads are 16-byte operand chunks and (ACCUM) out's old values
    loads = {line.split()[0] for line in text.splitlines() if line.strip().startswith("buffer_load")}
    assert loads <= {"buffer_load_dwordx4", "buffer_load_dwordx2"}
