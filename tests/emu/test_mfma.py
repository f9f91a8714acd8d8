"""MFMA semantics vs an independent layout model (tests/emu/mfma_model.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from mfma_model import BITS, CODES, NREGS, model, pack, random_codes

matrix = pytest.importorskip("mxgemm.emu.matrix")

F8F6F4_SHAPES = [(16, 16, 128), (32, 32, 64)]
DENSE = [("bf16", "bf16"), ("f16", "f16"), ("e4m3", "e4m3"), ("e4m3", "e5m2"),
         ("e5m2", "e4m3"), ("e5m2", "e5m2")]


def operand(rng, fmt, nregs, special_rate=0.0):
    bits = BITS[fmt]
    count = nregs * 32 // bits
    return pack(random_codes(rng, fmt, (64, count), special_rate), bits, nregs)


def accum(rng, nregs, specials=False):
    c = (rng.standard_normal((nregs, 64)) * 4).astype(np.float32)
    if specials:
        c.flat[:4] = [0.0, -0.0, np.float32(3.4e38), np.float32(1e-40)]
    return c.view(np.uint32)


def scales(rng, specials=False):
    s = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
    if not specials:       # keep bytes near 127 so products stay finite and comparable
        s = (s & 0x0F0F0F0F) + 0x76767676
    else:
        s[::7] = 0xFFFFFFFF          # NaN scale in every byte
        s[3::11] = 0x00000000        # 2^-127
        s[5::13] = 0xFEFEFEFE        # 2^127
    return s


def assert_same(d, ref):
    d, ref = np.asarray(d, np.uint32), np.asarray(ref, np.uint32)
    df, rf = d.view(np.float32), ref.view(np.float32)
    same = (d == ref) | (np.isnan(df) & np.isnan(rf))
    if not same.all():
        bad = np.argwhere(~same)[:5]
        raise AssertionError(f"{(~same).sum()} mismatches, e.g. "
                             + ", ".join(f"{tuple(i)}: {df[tuple(i)]!r} vs {rf[tuple(i)]!r}" for i in bad))


@pytest.mark.parametrize("shape", F8F6F4_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fa,fb", list(itertools.product(range(5), range(5))))
def test_mfma_scale_f8f6f4_all_formats(shape, fa, fb):
    rng = np.random.default_rng(1000 * fa + 10 * fb + shape[0])
    m, n, k = shape
    a = operand(rng, CODES[fa], NREGS[BITS[CODES[fa]]])
    b = operand(rng, CODES[fb], NREGS[BITS[CODES[fb]]])
    c = accum(rng, m * n // 64)
    sa, sb = scales(rng), scales(rng)
    opa, opb = int(rng.integers(4)), int(rng.integers(4))
    d = matrix.mfma_scale_f8f6f4(m, n, k, a, b, c, fa, fb, sa, opa, sb, opb)
    assert_same(d, model(shape, CODES[fa], CODES[fb], a, b, c, sa, opa, sb, opb))


@pytest.mark.parametrize("shape", F8F6F4_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fmt", [0, 1, 4])
def test_mfma_scale_specials(shape, fmt):
    """NaN (0xFF), 2^-127 and 2^127 scales, NaN/Inf/max elements, huge/denormal C."""
    rng = np.random.default_rng(7 + fmt + shape[0])
    m, n, k = shape
    f = CODES[fmt]
    a = operand(rng, f, NREGS[BITS[f]], special_rate=0.02)
    b = operand(rng, f, NREGS[BITS[f]], special_rate=0.02)
    a[0, :8] = 0x7E7E7E7E if f == "e4m3" else 0x7B7B7B7B     # max finite (fp8/bf8)
    c = accum(rng, m * n // 64, specials=True)
    sa, sb = scales(rng, True), scales(rng, True)
    for opa, opb in [(0, 3), (2, 1)]:
        d = matrix.mfma_scale_f8f6f4(m, n, k, a, b, c, fmt, fmt, sa, opa, sb, opb)
        assert_same(d, model(shape, f, f, a, b, c, sa, opa, sb, opb))


@pytest.mark.parametrize("shape", F8F6F4_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mfma_f8f6f4_unscaled(shape):
    rng = np.random.default_rng(3)
    m, n, k = shape
    a, b = operand(rng, "e2m3", 6), operand(rng, "e5m2", 8)
    c = accum(rng, m * n // 64)
    d = matrix.mfma(m, n, k, "e2m3", "e5m2", a, b, c)
    assert_same(d, model(shape, "e2m3", "e5m2", a, b, c))


@pytest.mark.parametrize("mn", [16, 32])
@pytest.mark.parametrize("fa,fb", DENSE)
def test_mfma_dense(mn, fa, fb):
    shape = (mn, mn, 32 if mn == 16 else 16)
    rng = np.random.default_rng(mn + len(fa) + 3 * len(fb))
    nregs = 4 if BITS[fa] == 16 else 2
    a, b = operand(rng, fa, nregs, 0.01), operand(rng, fb, nregs, 0.01)
    c = accum(rng, mn * mn // 64)
    d = matrix.mfma(*shape, fa, fb, a, b, c)
    assert_same(d, model(shape, fa, fb, a, b, c))


def test_exact_fallback_wide_range():
    """bf8 products spanning > 53 bits force the exact integer path; cancellation must be exact."""
    m, n, k = 16, 16, 128
    a = np.zeros((8, 64), np.uint32)
    b = np.zeros((8, 64), np.uint32)
    a[0, 0] = 0x00FB017B          # A[0][0..2] = max, min subnormal, -max
    b[0, 0] = 0x007B017B          # B[0..2][0] = max, min subnormal, max
    c = np.zeros((4, 64), np.uint32)
    d = matrix.mfma(m, n, k, "e5m2", "e5m2", a, b, c)
    assert d.view(np.float32)[0, 0] == np.float32(2.0 ** -32)   # a sequential fp64 sum gives 0
    assert_same(d, model((m, n, k), "e5m2", "e5m2", a, b, c))


def test_opsel_byte_decoding():
    """clang 22 prints opselA=2, opselB=3 as op_sel:[0,1,0] op_sel_hi:[1,1,0] (MFMA_FACTS §1)."""
    assert matrix.opsel_byte([0, 1, 0], [1, 1, 0], 0) == 2
    assert matrix.opsel_byte([0, 1, 0], [1, 1, 0], 1) == 3
    assert matrix.opsel_byte(None, None, 1) == 0
