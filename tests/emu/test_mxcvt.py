"""Conversion semantics (emu/mxcvt.py) vs ml_dtypes over all codes and dense value sweeps."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mxgemm.emu import mxcvt

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")   # overflow/NaN casts are the point

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e2m1": ml_dtypes.float4_e2m1fn}
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}
INSN = {"fp8": "e4m3", "bf8": "e5m2", "fp4": "e2m1"}
SCALES = [0, 1, 100, 126, 127, 128, 140, 254]          # e8m0 exponents (0xFF tested apart)


def ml_decode(fmt, codes):
    return np.asarray(codes, np.uint8).view(ML[fmt]).astype(np.float64)


def ml_max(fmt):
    v = ml_decode(fmt, np.arange(1 << BITS[fmt]))
    return np.nanmax(v[np.isfinite(v)])


def sweep(fmt, rng):
    """Every value, every midpoint, midpoints +- one fp32 ulp, beyond max, random fp32 bits."""
    v = ml_decode(fmt, np.arange(1 << BITS[fmt]))
    v = np.unique(v[np.isfinite(v)])
    mids = (v[1:] + v[:-1]) / 2
    m32 = mids.astype(np.float32)
    near = np.concatenate([np.nextafter(m32, np.float32(np.inf)), np.nextafter(m32, np.float32(-np.inf))])
    big = ml_max(fmt) * np.array([1.01, 1.0625, 1.125, 1.5, 2, 1e3])
    rnd = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    rnd = rnd[np.isfinite(rnd)]
    x = np.concatenate([v, mids, near.astype(np.float64), big, -big, rnd.astype(np.float64),
                        [0.0, -0.0, 1e-45, -1e-45]])
    return x


@pytest.mark.parametrize("fmt", list(ML))
def test_decode_all_codes(fmt):
    codes = np.arange(1 << BITS[fmt])
    np.testing.assert_array_equal(mxcvt.decode_table(fmt), ml_decode(fmt, codes))


def test_e8m0_all_codes():
    e = np.arange(256)
    ref = e.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    np.testing.assert_array_equal(mxcvt.e8m0_value(e), ref)


@pytest.mark.parametrize("fmt", list(ML))
def test_encode_rne_vs_ml_dtypes(fmt):
    x = sweep(fmt, np.random.default_rng(BITS[fmt]))
    got = mxcvt.encode(x, fmt, saturate=False)
    if fmt in ("e4m3", "e5m2"):
        ref = x.astype(ML[fmt]).view(np.uint8)               # ml_dtypes: non-saturating
    else:
        ref = x.astype(ML[fmt]).view(np.uint8)               # FP6/FP4: ml_dtypes saturates
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_encode_saturating(fmt):
    """MODE.FP16_OVFL = 1: overflow and +-Inf clamp to +-max; NaN stays NaN."""
    x = np.concatenate([sweep(fmt, np.random.default_rng(1)), [np.inf, -np.inf]])
    got = mxcvt.encode(x, fmt, saturate=True)
    mx = ml_max(fmt)
    ref = np.clip(x, -mx, mx).astype(ML[fmt]).view(np.uint8)
    np.testing.assert_array_equal(got, ref)
    nan = mxcvt.encode(np.array([np.nan]), fmt, saturate=True)
    assert np.isnan(ml_decode(fmt, nan))[0]


@pytest.mark.parametrize("fmt", ["e2m3", "e3m2", "e2m1"])
def test_small_nan_gives_max(fmt):
    """FP6/FP4 have no NaN: AMD's host model maps NaN (incl. a NaN scale) to the max code."""
    got = mxcvt.encode(np.array([np.nan, -np.nan, np.inf, -np.inf]), fmt, saturate=False)
    mx = (1 << (BITS[fmt] - 1)) - 1
    np.testing.assert_array_equal(got, [mx, mx | (1 << (BITS[fmt] - 1)), mx, mx | (1 << (BITS[fmt] - 1))])


def f32_bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def scale_operand(e):
    """fp32 scale operand whose bits [30:23] are e (sign and mantissa junk must be ignored)."""
    return (np.uint32(e) << np.uint32(23)) | np.uint32(0x80000000 | 0x2AAAAA)


@pytest.mark.parametrize("insn", ["fp8", "bf8", "fp4"])
@pytest.mark.parametrize("e", SCALES)
def test_scaled_pk_down(insn, e):
    fmt = INSN[insn]
    rng = np.random.default_rng(e)
    x = sweep(fmt, rng).astype(np.float32).astype(np.float64) * 2.0 ** (e - 127)
    x = x.astype(np.float32)
    x = rng.permutation(x[np.isfinite(x)])
    x = x[: x.size // 128 * 128].reshape(-1, 2, 64).astype(np.float64)
    for opsel in (0, 4, 8, 12):
        old = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
        for x0, x1 in x:
            got = mxcvt.cvt_pk_down(old, x0, x1, insn, opsel, scale_operand(e))
            q = [(xi / 2.0 ** (e - 127)).astype(ML[fmt]).view(np.uint8).astype(np.uint32) for xi in (x0, x1)]
            if insn == "fp4":
                sh = 8 * (opsel >> 2)
                ref = (old & ~np.uint32(0xFF << sh)) | (((q[1] << 4) | q[0]) << sh)
            else:
                sh = 16 * (opsel >> 3)
                ref = (old & ~np.uint32(0xFFFF << sh)) | (((q[1] << 8) | q[0]) << sh)
            np.testing.assert_array_equal(got, ref.astype(np.uint32))


@pytest.mark.parametrize("insn", ["fp8", "bf8", "fp4"])
def test_nan_scale_down(insn):
    got = mxcvt.cvt_pk_down(np.zeros(64, np.uint32), np.ones(64), np.ones(64), insn, 0, scale_operand(255))
    if insn == "fp4":
        assert (got == 0x77).all()
    else:
        assert np.isnan(ml_decode(INSN[insn], got & 0xFF)).all()


@pytest.mark.parametrize("insn", ["fp8", "bf8", "fp4"])
@pytest.mark.parametrize("e", SCALES + [255])
def test_scaled_up_all_codes(insn, e):
    """Every code (each position of the selected word/byte) times 2^(E-127); NaN scale -> NaN."""
    fmt = INSN[insn]
    bits = BITS[fmt]
    codes = np.arange(1 << bits, dtype=np.uint32)
    lanes = np.resize(codes, 256)
    s = 2.0 ** (e - 127) if e != 255 else np.nan
    for count in ((2,) if insn == "fp4" else (1, 2)):
        for opsel in range(4 if (insn == "fp4" or count == 1) else 2):
            for base in range(0, 256, 64):
                c = lanes[base:base + 64]
                c2 = np.roll(c, 5)
                if insn == "fp4":
                    src = ((c2 << 4) | c) << np.uint32(8 * opsel)
                    want = [c, c2]
                elif count == 2:
                    src = ((c2 << 8) | c) << np.uint32(16 * opsel)
                    want = [c, c2]
                else:
                    src = c << np.uint32(8 * opsel)
                    want = [c]
                got = mxcvt.cvt_up(src.astype(np.uint32) | np.uint32(0), insn, opsel, count, scale_operand(e))
                for g, w in zip(got, want):
                    ref = ml_decode(fmt, w) * s
                    g32 = g.astype(np.float32)
                    with np.errstate(over="ignore"):
                        np.testing.assert_array_equal(g32, ref.astype(np.float32))


PK_BF16 = r"""
MXGEMM_KERNEL(pk_bf16)(unsigned* __restrict__ out, const float* __restrict__ x) {
  int i = mxgemm::block_x() * 256 + mxgemm::thread_x();
  v2f f = {x[2 * i], x[2 * i + 1]};
  out[i] = __builtin_bit_cast(unsigned, __builtin_convertvector(f, v2bf));
}"""


def test_cvt_pk_bf16_f32_rne():
    """The emulator's one v_cvt_pk_bf16_f32 (run from a compiled kernel) rounds each half to
    nearest even like ml_dtypes, keeping NaNs quiet."""
    from hip_run import program, run
    assert "v_cvt_pk_bf16_f32" in program(PK_BF16)[2]
    rng = np.random.default_rng(5)
    edge = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F7F8000, 0x00008000,
                     0x00018000, 0x7F800000, 0xFF800000, 0x80000000, 0x7FC00001, 0xFF800001], np.uint32)
    x = np.concatenate([edge, rng.integers(0, 1 << 32, 2 * 256 * 16 - edge.size, dtype=np.uint64).astype(np.uint32)])
    got, _ = run(PK_BF16, "pk_bf16", np.zeros(x.size // 2, np.uint32), x.view(np.float32), grid=16, block=256)
    for half, xi in ((got & 0xFFFF, x[0::2]), (got >> 16, x[1::2])):
        f = xi.view(np.float32)
        ref = f.astype(ml_dtypes.bfloat16).view(np.uint16)
        nan = np.isnan(f)
        np.testing.assert_array_equal(half[~nan], ref[~nan])
        assert ((half[nan] & 0x7FC0) == 0x7FC0).all() and ((half[nan] ^ (xi[nan] >> 16)) & 0x8000 == 0).all()


def test_opsel_bits_from_clang_syntax():
    # as printed by clang 22 (see the .s of tests in this directory)
    assert mxcvt.opsel_bits([0, 0, 1]) == 8          # v_cvt_pk_fp8_f32 ... op_sel:[0,0,1]
    assert mxcvt.opsel_bits([0, 0, 0, 1]) == 8       # v_cvt_scalef32_pk_fp8_f32 word 1 / fp4 byte 2
    assert mxcvt.opsel_bits([0, 0, 1, 0]) == 4       # v_cvt_scalef32_pk_fp4_f16 byte 1
    assert mxcvt.opsel_bits([1, 1, 0]) == 3          # v_cvt_scalef32_pk_bf16_fp4 byte 3
    assert mxcvt.opsel_bits(None) == 0


# ---- the conversion handlers through compiled HIP builtins ---------------------------------

from hip_run import run  # noqa: E402

CVT_SRC = r"""
MXGEMM_KERNEL(cvts)(const float* x, const unsigned* c, const float* sc, unsigned* o) {
  int t = mxgemm::thread_x();
  float s = sc[t];
  unsigned old = c[t + 64];
  v2s w = __builtin_amdgcn_cvt_scalef32_pk_fp8_f32(__builtin_bit_cast(v2s, old), x[t], x[t + 64], s, true);
  o[t] = __builtin_bit_cast(unsigned, w);
  o[64 + t] = __builtin_amdgcn_cvt_scalef32_pk_fp4_f32(old, x[t], x[t + 64], s, 2);
  v2f f = __builtin_amdgcn_cvt_scalef32_pk_f32_fp8(c[t], s, true);
  ((v2f*)(o + 128))[t] = f;
  o[256 + t] = __builtin_bit_cast(unsigned, __builtin_amdgcn_cvt_scalef32_f32_fp8(c[t], s, 3));
  v2f g = __builtin_amdgcn_cvt_scalef32_pk_f32_fp4(c[t], s, 1);
  ((v2f*)(o + 320))[t] = g;
  o[448 + t] = __builtin_amdgcn_cvt_pk_bf8_f32(x[t], x[t + 64], old, true);
  o[512 + t] = __builtin_bit_cast(unsigned, __builtin_amdgcn_cvt_f32_fp8(c[t], 1));
  v2bf b = {(__bf16)x[t], (__bf16)x[t + 64]};
  o[576 + t] = __builtin_bit_cast(unsigned, b);
}
"""


def test_hip_conversions():
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(128) * 2.0 ** rng.integers(-20, 20, 128)).astype(np.float32)
    x[:4] = [np.nan, np.inf, -1e30, 3e-40]
    c = rng.integers(0, 1 << 32, 128, dtype=np.uint64).astype(np.uint32)
    e = rng.integers(100, 150, 64)
    e[:3] = [0, 255, 254]
    sc = (e.astype(np.uint32) << 23).view(np.float32)
    o = run(CVT_SRC, "cvts", x, c, sc, np.zeros(640, np.uint32))[3].reshape(10, 64)
    s = np.where(e == 255, np.nan, 2.0 ** (e.astype(np.float64) - 127))
    x0, x1, old, src = x[:64].astype(np.float64), x[64:].astype(np.float64), c[64:], c[:64]

    def enc(v, dt):                       # non-saturating (MODE.FP16_OVFL = 0) RNE
        with np.errstate(invalid="ignore", over="ignore"):
            return v.astype(dt).view(np.uint8).astype(np.uint32)

    fp8 = (enc(x1 / s, ML["e4m3"]) << 8) | enc(x0 / s, ML["e4m3"])
    np.testing.assert_array_equal(o[0], (old & 0xFFFF) | (fp8 << 16))
    q0 = np.where(np.isnan(x0 / s), 7 | (np.signbit(x0) << 3), enc(x0 / s, ML["e2m1"]))
    q1 = np.where(np.isnan(x1 / s), 7 | (np.signbit(x1) << 3), enc(x1 / s, ML["e2m1"]))
    np.testing.assert_array_equal(o[1], (old & 0xFF00FFFF) | (((q1 << 4) | q0) << 16))

    def dec(codes, fmt, scale):
        with np.errstate(invalid="ignore", over="ignore"):
            return (ml_decode(fmt, codes) * scale).astype(np.float32).view(np.uint32)

    def same(a, b):
        fa, fb = a.view(np.float32), b.view(np.float32)
        assert ((a == b) | (np.isnan(fa) & np.isnan(fb))).all()

    # pk results are stored as float2 per lane: rows 2-3 (and 5-6) hold [lane][2] pairs
    same(o[2:4].reshape(-1)[0::2], dec((src >> 16) & 0xFF, "e4m3", s))
    same(o[2:4].reshape(-1)[1::2], dec(src >> 24, "e4m3", s))
    same(o[4], dec(src >> 24, "e4m3", s))
    same(o[5:7].reshape(-1)[0::2], dec((src >> 8) & 0xF, "e2m1", s))
    same(o[5:7].reshape(-1)[1::2], dec((src >> 12) & 0xF, "e2m1", s))
    bf8 = (enc(x1, ML["e5m2"]) << 8) | enc(x0, ML["e5m2"])
    np.testing.assert_array_equal(o[7], (old & 0xFFFF) | (bf8 << 16))
    same(o[8], dec((src >> 8) & 0xFF, "e4m3", 1.0))
    rb = [x_.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32) for x_ in (x[:64], x[64:])]
    ok = ~np.isnan(x[:64]) & ~np.isnan(x[64:])
    np.testing.assert_array_equal(o[9][ok], ((rb[1] << 16) | rb[0])[ok])
