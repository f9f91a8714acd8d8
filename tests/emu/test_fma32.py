"""valu.fma32 (v_fma_f32 / v_fmac_f32) is the correctly rounded f32 a*b + c: checked element by
element against the exact rational result rounded once (mfma_model.round_f32), on random bit
patterns, normal values, and the double-rounding cases (f64 sum exactly on an f32 halfway
point, the exact sum not) for normal and subnormal results."""
from fractions import Fraction

import numpy as np
from mfma_model import round_f32

from mxgemm.emu.valu import fma32

f32 = np.float32


def exact_fma(a, b, c) -> np.float32:
    a, b, c = float(a), float(b), float(c)
    if not all(np.isfinite((a, b, c))):
        return f32(a * b + c)          # Inf/NaN outcomes: no rounding involved
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:   # IEEE zero sign: -0 only for (-0) + (-0); exact cancellation gives +0
        return f32(-0.0) if np.signbit(a * b) and np.signbit(c) else f32(0.0)
    return round_f32(x)


def tie_cases(rng, n, subnormal):
    """a*b = h(1 - x^2 2^-46) for h half an f32 step of c, so that the f64 sum lands exactly on
    the halfway point next to c (x = 0: exactly there, a true tie)."""
    x = rng.integers(0, 200, n)
    if subnormal:   # |c| < 2^-126: the f32 step is 2^-149
        h = np.full(n, 2.0 ** -150)
        c = rng.integers(1, 2 ** 23, n) * 2.0 ** -149
    else:
        c = np.ldexp(1 + rng.integers(0, 2 ** 23, n) * 2.0 ** -23, rng.integers(-100, 100, n))
        h = np.ldexp(1.0, np.frexp(c)[1] - 25)
    a = np.sqrt(h) * (1 + x * 2.0 ** -23)
    b = np.sqrt(h) * (1 - x * 2.0 ** -23)
    sign = rng.choice([-1.0, 1.0], (3, n))
    return (sign[0] * a).astype(f32), (sign[1] * b).astype(f32), (sign[2] * c).astype(f32)


def check(a, b, c):
    with np.errstate(all="ignore"):
        got = fma32(a, b, c)
    ref = np.array([exact_fma(x, y, z) for x, y, z in zip(a, b, c)], f32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(got.view(np.uint32)[~nan] != ref.view(np.uint32)[~nan])
    assert not bad.size, [(a[~nan][i], b[~nan][i], c[~nan][i], got[~nan][i], ref[~nan][i]) for i in bad[:5]]


def test_random_bit_patterns():
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(f32) for _ in range(3))
    check(a, b, c)


def test_normal_values_and_specials():
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(5000).astype(f32) for _ in range(3))
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0 ** -149, 3.4e38], f32)
    g = np.stack(np.meshgrid(sp, sp, sp)).reshape(3, -1)
    check(np.concatenate([a, g[0]]), np.concatenate([b, g[1]]), np.concatenate([c, g[2]]))


def test_small_results():
    """Products and addends near and below 2^-126 (subnormal and underflowing results)."""
    rng = np.random.default_rng(2)
    n = 10000
    a = np.ldexp(rng.uniform(1, 2, n), rng.integers(-80, -60, n)).astype(f32)
    b = np.ldexp(rng.uniform(-2, 2, n), rng.integers(-80, -60, n)).astype(f32)
    c = (rng.integers(-2 ** 24, 2 ** 24, n) * 2.0 ** -149).astype(f32)
    check(a, b, c)


def test_double_rounding_ties():
    rng = np.random.default_rng(3)
    for subnormal in (False, True):
        a, b, c = tie_cases(rng, 5000, subnormal)
        check(a, b, c)


def test_scalars_and_out():
    """Scalar operands broadcast; out= writes the same bits into a strided f32 view."""
    rng = np.random.default_rng(4)
    a, b, c = (np.concatenate([x, rng.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32).view(f32)])
               for x in tie_cases(rng, 256, False))
    V = np.zeros((512, 8), np.uint32)
    with np.errstate(all="ignore"):
        ref = fma32(a, b, c)
        fma32(a, b, c, out=V[:, 3].view(f32))
        np.testing.assert_array_equal(V[:, 3], ref.view(np.uint32))
        assert fma32(a[7], b[7], c[7]).view(np.uint32) == exact_fma(a[7], b[7], c[7]).view(np.uint32)
        check(np.full_like(c[:256], a[0]), np.full_like(c[:256], b[0]), c[:256])
        np.testing.assert_array_equal(fma32(a[0], b[0], c[:256]), fma32(np.full(256, a[0]), np.full(256, b[0]), c[:256]))
