"""quant.py spec: MX scales/payloads as torchao's to_mx, FP8 casts as DeepGEMM's recipes,
and quantise -> dequantise error bounds."""
import re

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxgemm import formats as F
from mxgemm import quant as Q
from mxgemm.guards import GuardError
from mxgemm.metrics import assert_bitwise_equal

try:  # torchao is the upstream definition of the MX scale modes; fall back to the oracle below
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx as _torchao_to_mx
except Exception:
    _torchao_to_mx = None

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn,
      "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn}
MBITS = {"e4m3": 3, "e5m2": 2, "e2m1": 1, "e2m3": 3, "e3m2": 2}
TORCHAO_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}


def numpy_to_mx(x: torch.Tensor, fmt: str, mode: str):
    """Independent restatement of OCP MX / torchao scale modes in numpy float math + ml_dtypes.

    floor: s = 2^(floor(log2 amax) - emax); rceil: s = 2^ceil(log2(f32(amax / max))) (2^-127 when
    that ratio underflows fp32);
    even: amax rounded half-up to mbits mantissa bits, then floor. amax = 0 -> 2^-127.
    Elements: clip(x / s, +-max) cast with ml_dtypes (RNE). Returns (uint8 codes, uint8 scales).
    """
    dt = ML[fmt]
    vmax = np.float32(ml_dtypes.finfo(dt).max)
    emax = int(np.floor(np.log2(vmax)))
    xb = x.numpy().astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(xb).max(-1).astype(np.float64)
    if mode == "rceil":
        d = (amax.astype(np.float32) / vmax).astype(np.float64)
        m, e = np.frexp(d)
        exp = np.where(d == 0, -127, np.where(m == 0.5, e - 1, e))   # an underflowing ratio: 2^-127, as torchao
    else:
        if mode == "even":
            m, e = np.frexp(amax)
            step = 2.0 ** (MBITS[fmt] + 1)
            amax = np.floor(m * step + 0.5) / step * 2.0**e
        exp = np.frexp(amax)[1] - 1 - emax
    exp = np.clip(np.where(amax == 0, -127, exp), -127, 127)
    y = np.clip(xb / np.ldexp(np.float32(1), exp)[..., None].astype(np.float32), -vmax, vmax)
    codes = y.astype(np.float32).astype(dt).view(np.uint8).reshape(x.shape)
    return torch.from_numpy(codes.copy()), torch.from_numpy((exp + 127).astype(np.uint8))


def torchao_to_mx(x, fmt, mode):
    s, d = _torchao_to_mx(x, TORCHAO_DTYPES[fmt], 32, getattr(ScaleCalculationMode, mode.upper()))
    d = d.view(torch.uint8)
    return (F.unpack_fp4(d) if fmt == "e2m1" else d), s.view(torch.uint8)


def our_codes(x, fmt, mode):
    p, s = Q.quantize_mx(x, fmt, mode)
    return (F.PACKED[fmt][3](p) if fmt in F.PACKED else F.as_codes(p)), s


def mx_input(seed, shape=(64, 256)):
    """Gaussian blocks with per-block magnitudes 2^-20..2^20 plus exact-power and zero blocks.
    (Blocks with amax < 2^-118 are avoided for the torchao comparison: torchao divides by
    2^-126 instead of the 2^-127 its e8m0 code states there, a torchao workaround.)"""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    mag = torch.exp2(torch.randint(-20, 21, (shape[0], shape[1] // 32), generator=g).float())
    x = x * mag.repeat_interleave(32, 1)
    x[0, :32] = 0.0
    x[1, :32] = 448.0 * 2.0 ** torch.arange(32).sub(16).float().clamp(max=0)
    x[2, :32] = 6.0
    return x


def assert_same_mx(x, fmt, mode, oracle):
    codes, scales = our_codes(x, fmt, mode)
    want_codes, want_scales = oracle(x, fmt, mode)
    assert_bitwise_equal(scales, want_scales, f"{fmt}/{mode} scales")
    assert_bitwise_equal(codes, want_codes, f"{fmt}/{mode} payload")


@pytest.mark.parametrize("fmt", list(ML))
@pytest.mark.parametrize("mode", Q.MX_MODES)
def test_quantize_mx_matches_torchao(fmt, mode):
    oracle = torchao_to_mx if _torchao_to_mx is not None and fmt in TORCHAO_DTYPES else numpy_to_mx
    assert_same_mx(mx_input(0), fmt, mode, oracle)


@pytest.mark.parametrize("fmt", list(ML))
@pytest.mark.parametrize("mode", Q.MX_MODES)
def test_quantize_mx_matches_numpy_oracle_incl_tiny_blocks(fmt, mode):
    x = mx_input(1)
    x[3, :32] *= 2.0**-130  # amax near 2^-127: the exact scale is used
    assert_same_mx(x, fmt, mode, numpy_to_mx)


# Hand-derived fixtures where the modes disagree (block amax -> e8m0 code):
#  e4m3 (max 448, emax 8, 3 mantissa bits)
#   500: floor 2^(8-8) -> 127 (500 saturates to 448); rceil 500/448=1.12 -> 2^1 -> 128;
#        even 500 = 1.953*2^8 rounds to 2.0*2^8 -> 2^(9-8) -> 128
#   470: floor 127; rceil 470/448=1.05 -> 128 (470/2 = 235 rounds to 240 = 1.875*2^7, code 0x77);
#        even 470 = 1.836*2^8 rounds to 1.875*2^8 -> 127
#   1.0: all modes 2^(0-8) -> 119; 1.0 / 2^-8 = 256 = 2^8 -> code 0x78
#  e2m1 (max 6, emax 2, 1 mantissa bit)
#   7.0: floor 127 (7 saturates to 6); rceil 7/6 -> 2^1 -> 128 (3.5 ties to even 4.0, code 6);
#        even 7 = 1.75*4 rounds to 2.0*4 -> 128
FIXTURES = [("e4m3", 500.0, {"floor": 127, "rceil": 128, "even": 128}, {"floor": 0x7E}),
            ("e4m3", 470.0, {"floor": 127, "rceil": 128, "even": 127}, {"rceil": 0x77}),
            ("e4m3", 1.0, {"floor": 119, "rceil": 119, "even": 119}, {"floor": 0x78}),
            ("e2m1", 7.0, {"floor": 127, "rceil": 128, "even": 128}, {"floor": 0x7, "rceil": 0x6}),
            ("e2m1", 0.0, {"floor": 0, "rceil": 0, "even": 0}, {"floor": 0x0})]


@pytest.mark.parametrize("fmt,amax,scale_codes,first_code", FIXTURES)
def test_mx_scale_mode_fixtures(fmt, amax, scale_codes, first_code):
    x = torch.full((1, 32), amax / 4)
    x[0, 0] = amax
    for mode, want in scale_codes.items():
        codes, s = our_codes(x, fmt, mode)
        assert s.tolist() == [[want]], (fmt, amax, mode)
        if mode in first_code:
            assert codes[0, 0].item() == first_code[mode], (fmt, amax, mode)


def test_mx_layouts():
    x = mx_input(2, (8, 128))
    p, s = Q.quantize_mx(x, "e4m3")
    assert p.dtype == torch.float8_e4m3fn and p.shape == (8, 128) and s.dtype == torch.uint8 and s.shape == (8, 4)
    p, s = Q.quantize_mx(x, "e2m1")
    assert p.dtype == torch.uint8 and p.shape == (8, 64) and s.shape == (8, 4)
    # element 2i of the row sits in the low nibble of byte i
    vals = F.decode(p & 0xF, "e2m1") * F.decode_e8m0(s).repeat_interleave(16, 1)
    assert torch.equal(vals, Q.dequantize_mx(p, s, "e2m1")[:, 0::2])


@pytest.mark.parametrize("K", [1, 33, 100])
def test_quantize_mx_rejects_k_off_the_block(K):
    with pytest.raises(ValueError, match=rf"K % 32 == 0\] K of x \(its last dimension\) = {K} must be a multiple of 32"):
        Q.quantize_mx(torch.ones(2, K))


def half_ulp(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Half the element format's spacing at |y| (the RNE error bound before scaling)."""
    _, mbits, bias = F.SPECS[fmt]
    e = torch.frexp(y.double().abs())[1] - 1
    return torch.exp2((e.clamp(min=1 - bias) - mbits - 1).double())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["e4m3", "e5m2", "e2m1"]), st.sampled_from(Q.MX_MODES),
       st.lists(st.floats(-1e6, 1e6, width=32), min_size=64, max_size=64), st.integers(-30, 30))
def test_mx_roundtrip_error_bound(fmt, mode, vals, shift):
    x = torch.tensor(vals).view(2, 32) * 2.0**shift
    p, s = Q.quantize_mx(x, fmt, mode)
    d = Q.dequantize_mx(p, s, fmt).double()
    sc = F.decode_e8m0(s).double().repeat_interleave(32, 1)
    y = x.double() / sc
    vmax = F.max_value(fmt)
    sat = y.abs() > vmax + half_ulp(torch.tensor(vmax), fmt)
    if mode == "rceil" or (mode == "even" and fmt != "e4m3"):
        # these scales leave room for the block maximum (e4m3's largest mantissa is NaN, so
        # "even" can still round an amax in (448, 480) down to 2^8 and saturate it)
        assert not sat.any()
    ok = torch.where(sat, d == torch.sign(x) * vmax * sc, (d - x).abs() <= half_ulp(y, fmt) * sc)
    assert ok.all(), (x[~ok], d[~ok])


# ---- DeepGEMM FP8 casts ----
def deepgemm_cast(x: torch.Tensor, bm: int, bk: int, use_ue8m0: bool):
    """DeepGEMM's recipe restated with torch's own ops and native float8 cast:
    sf = max(amax, 1e-4) / 448 per (bm x bk) tile (2^ceil(log2 sf) with ue8m0),
    q = float8_e4m3fn(x * (1 / sf))."""
    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    sf = torch.empty(-(-M // bm), -(-K // bk))
    for i in range(sf.shape[0]):
        for j in range(sf.shape[1]):
            tile = x[i * bm:(i + 1) * bm, j * bk:(j + 1) * bk].float()
            s = tile.abs().max().clamp(min=1e-4) / 448.0
            if use_ue8m0:
                s = torch.pow(2.0, torch.ceil(torch.log2(s)))
            sf[i, j] = s
            q[i * bm:(i + 1) * bm, j * bk:(j + 1) * bk] = (tile * (1.0 / s)).to(torch.float8_e4m3fn)
    return q, sf


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("shape", [(4, 256), (3, 200)])
def test_per_token_cast_matches_deepgemm(shape, use_ue8m0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)).bfloat16()
    x[0, :128] = 0  # all-zero group: amax clamps to 1e-4
    q, sf = Q.per_token_cast_to_fp8(x, use_ue8m0)
    wq, wsf = deepgemm_cast(x, 1, 128, use_ue8m0)
    assert_bitwise_equal(sf, wsf, "per-token sf")
    assert_bitwise_equal(q.view(torch.uint8), wq.view(torch.uint8), "per-token payload")


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("shape", [(256, 384), (130, 200)])
def test_per_block_cast_matches_deepgemm(shape, use_ue8m0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5)) * 3
    q, sf = Q.per_block_cast_to_fp8(x, use_ue8m0)
    wq, wsf = deepgemm_cast(x, 128, 128, use_ue8m0)
    assert_bitwise_equal(sf, wsf, "per-block sf")
    assert_bitwise_equal(q.view(torch.uint8), wq.view(torch.uint8), "per-block payload")
    d = Q.dequantize_fp8_blocks(q, sf, 128, 128)
    assert ((d - x).abs() <= half_ulp(x / sf.repeat_interleave(128, 0)[:shape[0]]
                                      .repeat_interleave(128, 1)[:, :shape[1]], "e4m3").float()
            * sf.max() * 1.0001).all()


def test_tensorwise_cast_matches_deepgemm():
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(6))
    q, sf = Q.tensorwise_cast_to_fp8(x)
    wq, wsf = deepgemm_cast(x.reshape(1, -1), 1, x.numel(), False)
    assert sf.shape == () and sf.item() == wsf.item()
    assert_bitwise_equal(q.view(torch.uint8).reshape(1, -1), wq.view(torch.uint8), "tensorwise")


def test_ceil_to_ue8m0_is_next_power_of_two():
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.rand(10_000, generator=g) * torch.exp2(torch.randint(-100, 100, (10_000,), generator=g).float()),
                   torch.exp2(torch.arange(-126, 128).float())])
    m, e = torch.frexp(x.double())
    want = torch.exp2(torch.where(m == 0.5, e - 1, e).double()).float()  # 2^ceil(log2 x), exact
    assert_bitwise_equal(Q.ceil_to_ue8m0(x), want, "ceil_to_ue8m0")
    assert set(F.encode_e8m0(Q.ceil_to_ue8m0(x)).tolist()) <= set(range(1, 255))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=256, max_size=256), st.booleans())
def test_per_token_roundtrip_error_bound(vals, use_ue8m0):
    x = torch.tensor(vals).view(2, 128)
    q, sf = Q.per_token_cast_to_fp8(x, use_ue8m0)
    d = Q.dequantize_fp8_blocks(q, sf, 1, 128).double()
    y = (x * (1.0 / sf)).double()  # the value actually rounded, incl. the reciprocal's rounding
    assert ((d - y * sf.double()).abs() <= half_ulp(y, "e4m3") * sf.double() + 1e-300).all()
    assert (y.abs() <= 448 * (1 + 2**-20)).all()  # the scale leaves room: nothing saturates


# ---- argument guards ----
X = torch.ones(2, 32)
P, S = Q.quantize_mx(X)  # a valid e4m3 payload [2, 32] with its scales [2, 1]
MX_FORMATS = ", ".join(F.SPECS)
BAD_CALLS = [  # (case, call, message naming the rule, the argument and its value)
    ("quantize_mx-format", lambda: Q.quantize_mx(X, "e9m9"), f"[format] fmt = 'e9m9': expected one of {MX_FORMATS}"),
    ("quantize_mx-mode", lambda: Q.quantize_mx(X, mode="ceil"), "[mode] mode = 'ceil': expected one of floor, rceil, even"),
    ("quantize_mx-0d", lambda: Q.quantize_mx(torch.tensor(1.0)), "[shape] x must have at least 1 dimension; got a 0-d tensor"),
    ("quantize_mx-block-0", lambda: Q.quantize_mx(X, block=0), "[block] block = 0 must be a positive int"),
    ("quantize_mx-list", lambda: Q.quantize_mx([[1.0] * 32]), "[type] x must be a torch.Tensor; got list"),
    ("quantize_mx-int", lambda: Q.quantize_mx(X.int()), "[dtype] x has dtype torch.int32; expected a floating dtype"),
    ("quantize_mx-fp4-odd-K", lambda: Q.quantize_mx(torch.ones(1, 3), "e2m1", block=1),
     "[e2m1 packing: K % 2 == 0] K of x (its last dimension) = 3 must be a multiple of 2"),
    ("quantize_mx-fp6-K", lambda: Q.quantize_mx(torch.ones(1, 6), "e3m2", block=2),
     "[e3m2 packing: K % 4 == 0] K of x (its last dimension) = 6 must be a multiple of 4"),
    ("mx_values-fp6-bytes", lambda: Q.mx_values(torch.zeros(2, 4, dtype=torch.uint8), "e2m3"),
     "[shape] e2m3 payload: the last dimension (4 bytes) must be a multiple of 3"),
    ("mx_scale_e8m0-format", lambda: Q.mx_scale_e8m0(torch.ones(2), "e9m9"), f"[format] fmt = 'e9m9': expected one of {MX_FORMATS}"),
    ("mx_scale_e8m0-mode", lambda: Q.mx_scale_e8m0(torch.ones(2), "e4m3", "x"), "[mode] mode = 'x': expected one of floor, rceil, even"),
    ("mx_values-format", lambda: Q.mx_values(P, "e8m0"), f"[format] fmt = 'e8m0': expected one of {MX_FORMATS}"),
    ("dequantize_mx-format", lambda: Q.dequantize_mx(P, S, "e9m9"), f"[format] fmt = 'e9m9': expected one of {MX_FORMATS}"),
    ("dequantize_mx-list", lambda: Q.dequantize_mx([1], S), "[type] payload must be a torch.Tensor; got list"),
    ("dequantize_mx-payload-dtype", lambda: Q.dequantize_mx(P.float(), S),
     "[dtype] payload has dtype torch.float32; expected torch.uint8 or torch.float8_e4m3fn"),
    ("dequantize_mx-scale-dtype", lambda: Q.dequantize_mx(P, S.float()),
     "[dtype] scale has dtype torch.float32; expected torch.uint8 or torch.float8_e8m0fnu"),
    ("dequantize_mx-scale-shape", lambda: Q.dequantize_mx(P, S.repeat(1, 2)), "[shape] scale has shape [2, 2]; expected [2, 1]"),
    ("dequantize_mx-block-0", lambda: Q.dequantize_mx(P, S, block=0), "[block] block = 0 must be a positive int"),
    ("dequantize_mx-K-off-block", lambda: Q.dequantize_mx(P[:, :20], S),
     "[MX block: K % 32 == 0] K of payload (its last dimension, in elements) = 20 must be a multiple of 32"),
    ("per_token-1d", lambda: Q.per_token_cast_to_fp8(torch.ones(4)), "[shape] x must be 2-D [rows, K]; got shape [4]"),
    ("per_token-gran_k-0", lambda: Q.per_token_cast_to_fp8(X, gran_k=0), "[block] gran_k = 0 must be a positive int"),
    ("per_token-list", lambda: Q.per_token_cast_to_fp8([[1.0]]), "[type] x must be a torch.Tensor; got list"),
    ("per_block-3d", lambda: Q.per_block_cast_to_fp8(torch.ones(2, 4, 4)), "[shape] x must be 2-D [rows, K]; got shape [2, 4, 4]"),
    ("per_block-gran-0", lambda: Q.per_block_cast_to_fp8(X, gran=0), "[block] gran = 0 must be a positive int"),
    ("tensorwise-format", lambda: Q.tensorwise_cast_to_fp8(X, "e2m1"), "[format] fmt = 'e2m1': expected one of e4m3, e5m2"),
    ("tensorwise-list", lambda: Q.tensorwise_cast_to_fp8([1.0]), "[type] x must be a torch.Tensor; got list"),
    ("dequantize_fp8_blocks-1d", lambda: Q.dequantize_fp8_blocks(P[0], S, 1, 32), "[shape] q must be 2-D [M, K]; got shape [32]"),
    ("dequantize_fp8_blocks-e5m2", lambda: Q.dequantize_fp8_blocks(P.view(torch.float8_e5m2), S.float(), 1, 32),
     "[dtype] q has dtype torch.float8_e5m2; expected torch.float8_e4m3fn or torch.uint8"),
    ("dequantize_fp8_blocks-bm-0", lambda: Q.dequantize_fp8_blocks(P, S.float(), 0, 32), "[block] bm = 0 must be a positive int"),
    ("dequantize_fp8_blocks-sf-shape", lambda: Q.dequantize_fp8_blocks(P, S[:1].float(), 1, 32),
     "[shape] sf has shape [1, 1]; expected [2, 1]"),
    ("ceil_to_ue8m0-list", lambda: Q.ceil_to_ue8m0([1.0]), "[type] sf must be a torch.Tensor; got list"),
]


@pytest.mark.parametrize("call,message", [pytest.param(c, m, id=i) for i, c, m in BAD_CALLS])
def test_rejects_bad_arguments(call, message):
    with pytest.raises(GuardError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_tensorwise_cast_of_an_empty_tensor_has_the_zero_tensor_scale(fmt):
    q, sf = Q.tensorwise_cast_to_fp8(torch.ones(0, 4, dtype=torch.bfloat16), fmt)
    assert q.shape == (0, 4) and q.dtype == F.TORCH_DTYPES[fmt]
    assert sf.shape == () and sf.item() == Q.tensorwise_cast_to_fp8(torch.zeros(3, 4), fmt)[1].item()


# ---- row-wise, block-wise and segment (column block) FP8 casts of the grouped GEMMs' recipes ----
def fp8_oracle(x, sf, fmt):
    """Codes of x / sf by torch's own RNE conversion (x * (1 / sf), in range by construction)."""
    return (x.float() * (1.0 / sf)).to({"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_rowwise_cast_one_scale_per_row(fmt):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, 96, generator=g) * torch.logspace(-3, 3, 4)[None, :, None]
    x[1, 2] = 0
    q, sf = Q.rowwise_cast_to_fp8(x, fmt)
    fmax = 448.0 if fmt == "e4m3" else 57344.0
    assert q.shape == x.shape and sf.shape == (3, 4)
    assert torch.equal(sf, x.abs().amax(-1).clamp(min=1e-4) / fmax)
    assert torch.equal(q.view(torch.uint8), fp8_oracle(x, sf[..., None], fmt).view(torch.uint8))


def test_blockwise_cast_batched_blocks():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 200, 300, generator=g)
    q, sf = Q.blockwise_cast_to_fp8(x, (128, 128))
    assert sf.shape == (2, 2, 3)
    pad = torch.nn.functional.pad(x, (0, 84, 0, 56)).view(2, 2, 128, 3, 128)
    assert torch.equal(sf, pad.abs().amax(dim=(2, 4)).clamp(min=1e-4) / 448)
    full = sf.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :200, :300]
    assert torch.equal(q.view(torch.uint8), fp8_oracle(x, full, "e4m3").view(torch.uint8))


def test_segment_cast_pads_each_group_to_its_own_blocks():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(300, 24, generator=g)
    offs = torch.tensor([10, 110, 110, 290])           # rows 0..9 and 290.. belong to no group
    q, sf, padded = Q.segment_cast_to_fp8(x, offs, fmt="e5m2")
    assert padded.tolist() == [0, 128, 128, 384]
    assert q.shape[0] % 128 == 0 and q.shape[0] >= 384 and sf.shape == (q.shape[0] // 128, 24)
    seg = torch.zeros(q.shape[0], 24)
    seg[0:100], seg[128:308] = x[10:110], x[110:290]
    assert torch.equal(sf, seg.view(-1, 128, 24).abs().amax(1).clamp(min=1e-4) / 57344.0)
    want = fp8_oracle(seg, sf.repeat_interleave(128, 0), "e5m2")
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))


def test_shuffle_scales_places_every_byte_and_pads_with_zeros():
    """Row r = 32 r0 + 16 r1 + r2, column c = 8 c0 + 4 c1 + c2 -> byte (((4 c0 + c2) 16 + r2) 2 + c1) 2 + r1
    of row group r0's 32 C' bytes (aiter's e8m0_shuffle, Triton's CDNA4 tutorial); 40 x 12 pads to 64 x 16."""
    s = torch.randint(1, 255, (40, 12), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    got = Q.shuffle_scales(s.view(torch.float8_e8m0fnu))
    assert got.dtype == torch.float8_e8m0fnu and got.shape == (64, 16)
    flat, seen = got.view(torch.uint8).reshape(2, 32 * 16), torch.zeros(2, 32 * 16, dtype=torch.bool)
    for r in range(40):
        for c in range(12):
            r0, r1, r2, c0, c1, c2 = r // 32, r // 16 % 2, r % 16, c // 8, c // 4 % 2, c % 4
            at = (((4 * c0 + c2) * 16 + r2) * 2 + c1) * 2 + r1
            assert flat[r0, at] == s[r, c]
            seen[r0, at] = True
    assert not flat[~seen].any()
