"""MFMA semantics vs an independent layout model (tests/emu/mfma_model.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from mfma_model import BITS, CODES, NREGS, model, pack, random_codes

from mxgemm.emu import matrix

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


def test_fsum_rounding_equals_the_integer_path():
    """round_exact_sums_f32 (fsum, then one fp32 rounding unless the float64 sum is an fp32
    midpoint or outside fp32's normal range) against the integer path, row by row, on rows
    built to hit its cases: exact fp32 midpoints with and without a tiny term deciding the
    side, cancellation to zero and to subnormals, overflow, and wide random dyadic terms."""
    rng = np.random.default_rng(9)
    one, lsb = 1.0, 2.0 ** -23
    rows = [[one, lsb / 2], [one, lsb / 2, 2.0 ** -80], [one, lsb / 2, -2.0 ** -80], [one + lsb, lsb / 2],
            [3.0, -3.0], [2.0 ** -140, 2.0 ** -141, -2.0 ** -149], [2.0 ** -149, -2.0 ** -151],
            [2.0 ** 127, 2.0 ** 127], [3.4e38, 3.4e38, -3.4e38], [1e308, 1e308, -1e308],
            [2.0 ** 100, 1.0, -2.0 ** 100, 2.0 ** -30]]
    for _ in range(400):
        n = int(rng.integers(1, 40))
        mant = rng.integers(-255, 256, n).astype(np.float64)
        exp = rng.integers(-160, 140, n) if rng.random() < 0.5 else rng.integers(-30, 30, n)
        rows.append(list(np.ldexp(mant, exp)))
    width = max(map(len, rows))
    table = np.array([r + [0.0] * (width - len(r)) for r in rows])
    got = matrix.round_exact_sums_f32(table)
    want = np.array([matrix.round_exact_sum_f32(r) for r in table], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[0] == np.float32(1.0) and got[1] == np.float32(1.0 + lsb) and got[2] == np.float32(1.0)


def test_opsel_byte_decoding():
    """clang 22 prints opselA=2, opselB=3 as op_sel:[0,1,0] op_sel_hi:[1,1,0] (docs/gfx950_isa.md §1.5)."""
    assert matrix.opsel_byte([0, 1, 0], [1, 1, 0], 0) == 2
    assert matrix.opsel_byte([0, 1, 0], [1, 1, 0], 1) == 3
    assert matrix.opsel_byte(None, None, 1) == 0


# ---- the same forms through compiled HIP builtins on the emulator --------------------------

from hip_run import run  # noqa: E402

F8_PAIRS = list(itertools.product(range(5), range(5)))


def _opsel(fa, fb):
    """Scale bytes per format pair: every byte value is used for A and for B across pairs."""
    return (fa + fb) % 4, (fa + 2 * fb + 1) % 4


def _scaled_kernels():
    out = []
    for (m, n, k), ctype, nc in (((16, 16, 128), "v4f", 4), ((32, 32, 64), "v16f", 16)):
        for fa, fb in F8_PAIRS:
            oa, ob = _opsel(fa, fb)
            out.append(f"""
MXGEMM_KERNEL(scale{m}_{fa}{fb})(const v8i* a, const v8i* b, {ctype}* d, const int* s) {{
  int t = mxgemm::thread_x();
  d[t] = __builtin_amdgcn_mfma_scale_f32_{m}x{n}x{k}_f8f6f4(a[t], b[t], d[t], {fa}, {fb}, {oa}, s[t], {ob}, s[t + 64]);
}}""")
    # AGPR accumulator through inline asm: exercises v_accvgpr_write/read and 'a' operands
    out.append("""
MXGEMM_KERNEL(scale16_agpr)(const v8i* a, const v8i* b, v4f* d, const int* s) {
  int t = mxgemm::thread_x();
  v4f c = d[t];
  v8i av = a[t], bv = b[t];
  int sa = s[t], sb = s[t + 64];
  asm volatile("s_nop 0\\n\\tv_mfma_scale_f32_16x16x128_f8f6f4 %0, %1, %2, %0, %3, %4 op_sel:[1,0,0] op_sel_hi:[1,1,0]\\n\\ts_nop 7\\n\\ts_nop 7"
               : "+a"(c) : "v"(av), "v"(bv), "v"(sa), "v"(sb));
  d[t] = c;
}""")
    # explicit accumulator moves: v -> a -> a -> v
    out.append("""
MXGEMM_KERNEL(accvgpr_moves)(const int* x, int* y) {
  int t = mxgemm::thread_x();
  int v = x[t], r;
  asm volatile("v_accvgpr_write_b32 a5, %1\\n\\tv_accvgpr_mov_b32 a6, a5\\n\\tv_accvgpr_read_b32 %0, a6"
               : "=v"(r) : "v"(v) : "a5", "a6");
  y[t] = r;
}""")
    return "\n".join(out)


def _dense_kernels():
    out = []
    ty = {"bf16": "v8bf", "f16": "v8h", "e4m3": "long", "e5m2": "long"}
    nm = {"bf16": "bf16", "f16": "f16", "e4m3": "fp8", "e5m2": "bf8"}
    for mn, k, ctype in ((16, 32, "v4f"), (32, 16, "v16f")):
        for fa, fb in DENSE:
            suffix = nm[fa] if fa in ("bf16", "f16") else f"{nm[fa]}_{nm[fb]}"
            out.append(f"""
MXGEMM_KERNEL(dense{mn}_{fa}_{fb})(const {ty[fa]}* a, const {ty[fb]}* b, {ctype}* d) {{
  int t = mxgemm::thread_x();
  d[t] = __builtin_amdgcn_mfma_f32_{mn}x{mn}x{k}_{suffix}(a[t], b[t], d[t], 0, 0, 0);
}}""")
    return "\n".join(out)


SCALED_SRC, DENSE_SRC = _scaled_kernels(), _dense_kernels()


def _lane_major(regs, width):
    """[nregs, 64] registers -> [64, width] uint32 rows the kernel loads per lane."""
    out = np.zeros((64, width), np.uint32)
    out[:, : regs.shape[0]] = regs.T
    return out


@pytest.mark.parametrize("shape", F8F6F4_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fa,fb", F8_PAIRS)
def test_hip_mfma_scale(shape, fa, fb):
    m, n, k = shape
    rng = np.random.default_rng(50 * fa + fb + m)
    a = operand(rng, CODES[fa], NREGS[BITS[CODES[fa]]], special_rate=0.002)
    b = operand(rng, CODES[fb], NREGS[BITS[CODES[fb]]], special_rate=0.002)
    c = accum(rng, m * n // 64, specials=fa == fb)
    sa, sb = scales(rng, specials=fa == fb), scales(rng, specials=fa == fb)
    oa, ob = _opsel(fa, fb)
    _, _, d, _ = run(SCALED_SRC, f"scale{m}_{fa}{fb}", _lane_major(a, 8), _lane_major(b, 8),
                     c.T.copy(), np.concatenate([sa, sb]))
    assert_same(d.T, model(shape, CODES[fa], CODES[fb], a, b, c, sa, oa, sb, ob))


def test_hip_mfma_scale_agpr():
    rng = np.random.default_rng(11)
    a, b = operand(rng, "e4m3", 8), operand(rng, "e4m3", 8)
    c = accum(rng, 4)
    sa, sb = scales(rng), scales(rng)
    _, _, d, _ = run(SCALED_SRC, "scale16_agpr", a.T.copy(), b.T.copy(), c.T.copy(), np.concatenate([sa, sb]))
    assert_same(d.T, model((16, 16, 128), "e4m3", "e4m3", a, b, c, sa, 3, sb, 2))


def test_hip_accvgpr_moves():
    x = np.arange(64, dtype=np.uint32) * 0x01010101
    _, y = run(SCALED_SRC, "accvgpr_moves", x, np.zeros(64, np.uint32))
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("mn", [16, 32])
@pytest.mark.parametrize("fa,fb", DENSE)
def test_hip_mfma_dense(mn, fa, fb):
    shape = (mn, mn, 32 if mn == 16 else 16)
    rng = np.random.default_rng(mn * 3 + len(fa))
    nregs = 4 if BITS[fa] == 16 else 2
    a, b = operand(rng, fa, nregs, 0.01), operand(rng, fb, nregs, 0.01)
    c = accum(rng, mn * mn // 64)
    _, _, d = run(DENSE_SRC, f"dense{mn}_{fa}_{fb}", a.T.copy(), b.T.copy(), c.T.copy())
    assert_same(d.T, model(shape, fa, fb, a, b, c))
