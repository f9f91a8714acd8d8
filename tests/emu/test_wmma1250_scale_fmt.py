"""gfx1250 scaled WMMAs with E5M3 / E4M3 block scales (matrix_{a,b}_scale_fmt), assembled from
LLVM's syntax and run on one emulated wave, against an independent model: FP4 codes decoded by
ml_dtypes, scale bytes decoded from the encodings docs/gfx1250_emulator.md §3.3 cites (CK's
e5m3_scale_t / e4m3_scale_t, hipBLASLt's E5M3: unsigned, bias 15 / 7, subnormals, NaN 0xFF / 0x7F),
the dot product summed exactly in rationals and rounded once to fp32 (the model of §3.3), + C.
Register layouts as in test_wmma1250.py (written there from the documented tables)."""
from fractions import Fraction

import numpy as np
import pytest
from asm_wave import run
from test_wmma1250 import d_row, pack, values

from mxgemm.emu import UnsupportedInstruction

E5M3, E4M3 = (5, 15, 0xFF), (4, 7, 0x7F)     # exponent bits, bias, NaN code


def scale_value(byte, fmt):
    """The unsigned E5M3 / E4M3 scale as an exact Fraction (None: NaN)."""
    ebits, bias, nan = fmt
    byte = int(byte)
    if byte == nan:
        return None
    e, m = byte >> 3 & ((1 << ebits) - 1), byte & 7
    return Fraction(m, 8) * Fraction(2) ** (1 - bias) if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - bias)


def f32(x: Fraction) -> float:
    """fp32 round-to-nearest-even of an exact rational (normal range and subnormals)."""
    if x == 0:
        return 0.0
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e -= Fraction(2) ** e > a
    step = Fraction(2) ** (max(e, -126) - 23)
    return float(np.float32(float(round(a / step) * step) * (1 if x > 0 else -1)))


def reference(A, B, C, sa, sb, block, fmts):
    """D [M, 16] as fp32 values: sum over K blocks of sa sb (A B) exactly, one rounding, + C
    (a second rounding, as the fp32 accumulate). sa [M, nb], sb [16, nb] bytes; fmts: the A and
    B scale formats, None for E8M0."""
    va, vb = values("e2m1", A), values("e2m1", B)
    M, nb = sa.shape
    dec = [lambda b, f=f: (Fraction(2) ** (int(b) - 127) if b != 0xFF else None) if f is None else scale_value(b, f)
           for f in fmts]
    D = np.zeros((M, 16), np.float32)
    for m in range(M):
        for n in range(16):
            total, nan = Fraction(0), False
            for j in range(nb):
                s1, s2 = dec[0](sa[m, j]), dec[1](sb[n, j])
                if s1 is None or s2 is None:
                    nan = True
                    break
                ks = slice(j * block, (j + 1) * block)
                total += s1 * s2 * sum(Fraction(x) * Fraction(y) for x, y in zip(va[m, ks], vb[n, ks]))
            D[m, n] = np.nan if nan else np.float32(f32(total)) + np.float32(C[m, n])
    return D


def pack_scales(s, rows, sel, nregs):
    """Lane registers [nregs, 32] of a scale operand: row r's K-block bytes in lane r (+ 16 sel)."""
    out = np.zeros((nregs, 32), np.uint32)
    for r in range(rows):
        v = sum(int(b) << (8 * j) for j, b in enumerate(s[r]))
        for i in range(nregs):
            out[i, r + 16 * sel] = v >> (32 * i) & 0xFFFFFFFF
    return out


def execute(mnemonic, M, A, B, C, sa, sb, sel_b, block, mods):
    """Assemble `mnemonic` with LLVM's modifiers, run it, return D [M, 16]."""
    nr = M // 2
    a_regs, b_regs = pack(A, 4), pack(B, 4)
    na, nsc = a_regs.shape[1] if M == 32 else 8, 2 if block == 16 else 1
    va, vb, vc, vsa, vsb, vd = 8, 32, 40, 60, 62, 64
    regs = {}
    for base, arr in ((va, a_regs[:, :na].T), (vb, b_regs[:, :8].T)):
        regs.update({base + i: arr[i] for i in range(len(arr))})
    c_raw = np.zeros((nr, 32), np.float32)
    for lane in range(32):
        for r in range(nr):
            c_raw[r, lane] = C[d_row(lane, r), lane % 16]
    regs.update({vc + r: c_raw[r].view(np.uint32) for r in range(nr)})
    for base, s, rows, sel in ((vsa, sa, M, 0), (vsb, sb, 16, sel_b)):
        regs.update({base + i: w for i, w in enumerate(pack_scales(s, rows, sel, nsc))})

    def t(base, n):
        return f"v[{base}:{base + n - 1}]" if n > 1 else f"v{base}"
    body = (f"{mnemonic} {t(vd, nr)}, {t(va, na)}, {t(vb, 8)}, {t(vc, nr)}, {t(vsa, nsc)}, {t(vsb, nsc)} "
            + (" matrix_b_scale:MATRIX_SCALE_ROW1" if sel_b else "") + " " + mods)
    out = run("gfx1250", body, regs, list(range(vd, vd + nr)))
    raw = np.stack([out[vd + r] for r in range(nr)]).view(np.float32)
    D = np.zeros((M, 16), np.float32)
    for lane in range(32):
        for r in range(nr):
            D[d_row(lane, r), lane % 16] = raw[r, lane]
    return D


FP4 = "matrix_a_fmt:MATRIX_FMT_FP4 matrix_b_fmt:MATRIX_FMT_FP4"
# name -> (mnemonic, M, block, scale format, modifiers)
CASES = {
    "scale_e5m3": ("v_wmma_scale_f32_16x16x128_f8f6f4", 16, 32, E5M3,
                   f"{FP4} matrix_a_scale_fmt:MATRIX_SCALE_FMT_E5M3 matrix_b_scale_fmt:MATRIX_SCALE_FMT_E5M3"),
    "scale16_e4m3_nvfp4": ("v_wmma_scale16_f32_16x16x128_f8f6f4", 16, 16, E4M3,
                           f"{FP4} matrix_a_scale_fmt:MATRIX_SCALE_FMT_E4M3 matrix_b_scale_fmt:MATRIX_SCALE_FMT_E4M3"),
    "scale_32x16_e4m3": ("v_wmma_scale_f32_32x16x128_f4", 32, 32, E4M3,
                         "matrix_a_scale_fmt:MATRIX_SCALE_FMT_E4M3 matrix_b_scale_fmt:2"),
    "scale16_32x16_e5m3": ("v_wmma_scale16_f32_32x16x128_f4", 32, 16, E5M3,
                           "matrix_a_scale_fmt:1 matrix_b_scale_fmt:MATRIX_SCALE_FMT_E5M3"),
}


def scale_bytes(rng, fmt, shape):
    """Random scale bytes over the whole finite range: subnormals, zero, the largest code."""
    ebits, _, nan = fmt
    hi = (1 << (ebits + 3)) - 1
    s = rng.integers(0, hi, shape)
    s.flat[:4] = [0x00, 0x01, 0x07, hi - 1]
    return s


@pytest.mark.parametrize("name", sorted(CASES))
def test_scale_format_matches_exact_model(name):
    mnemonic, M, block, fmt, mods = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    A, B = rng.integers(0, 16, (M, 128)), rng.integers(0, 16, (16, 128))
    C = rng.integers(-64, 64, (M, 16)).astype(np.float32) / 8
    sa, sb = scale_bytes(rng, fmt, (M, 128 // block)), scale_bytes(rng, fmt, (16, 128 // block))
    sel_b = 1 if M == 16 else 0
    got = execute(mnemonic, M, A, B, C, sa, sb, sel_b, block, mods)
    np.testing.assert_array_equal(got, reference(A, B, C, sa, sb, block, (fmt, fmt)))


def test_fp8_e8m0_times_fp4_e5m3_as_the_compiler_emits_it():
    """FP8 A with E8M0 scales, FP4 B with E5M3 (clang 22 emits this pair for the builtin with
    scale formats 0 and 1); A's 16 VGPRs hold fp8 codes."""
    rng = np.random.default_rng(7)
    A8 = rng.choice(np.arange(256)[np.isfinite(values("e4m3", np.arange(256)))], (16, 128))
    B = rng.integers(0, 16, (16, 128))
    sa, sb = rng.integers(120, 135, (16, 4)), scale_bytes(rng, E5M3, (16, 4))
    a_regs, b_regs = pack(A8, 8), pack(B, 4)
    regs = {8 + i: a_regs[:, i] for i in range(16)}
    regs.update({32 + i: b_regs[:, i] for i in range(8)})
    regs.update({40 + r: np.zeros(32, np.uint32) for r in range(8)})
    regs[60], regs[61] = pack_scales(sa, 16, 0, 1)[0], pack_scales(sb, 16, 1, 1)[0]
    out = run("gfx1250", "v_wmma_scale_f32_16x16x128_f8f6f4 v[64:71], v[8:23], v[32:39], v[40:47], v60, v61 "
              "matrix_b_fmt:MATRIX_FMT_FP4 matrix_b_scale:MATRIX_SCALE_ROW1 matrix_b_scale_fmt:MATRIX_SCALE_FMT_E5M3",
              regs, list(range(64, 72)))
    raw = np.stack([out[64 + r] for r in range(8)]).view(np.float32)
    got = np.zeros((16, 16), np.float32)
    for lane in range(32):
        for r in range(8):
            got[d_row(lane, r), lane % 16] = raw[r, lane]
    va, vb = values("e4m3", A8), values("e2m1", B)
    want = np.zeros((16, 16), np.float32)
    for m in range(16):
        for n in range(16):
            want[m, n] = f32(sum(Fraction(2) ** (int(sa[m, j]) - 127) * scale_value(sb[n, j], E5M3)
                                 * sum(Fraction(x) * Fraction(y) for x, y in zip(va[m, 32 * j:32 * j + 32],
                                                                                 vb[n, 32 * j:32 * j + 32]))
                                 for j in range(4)))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt,mod", [(E5M3, "MATRIX_SCALE_FMT_E5M3"), (E4M3, "MATRIX_SCALE_FMT_E4M3")])
def test_nan_code_poisons_its_row(fmt, mod):
    """The NaN code (E5M3 0xFF, E4M3 0x7F) in one A row's block makes that row of D NaN and
    leaves the others finite."""
    rng = np.random.default_rng(3)
    A, B = rng.integers(0, 16, (16, 128)), rng.integers(0, 16, (16, 128))
    C = np.ones((16, 16), np.float32)
    sa, sb = np.full((16, 4), 0x38 if fmt is E4M3 else 0x78), np.full((16, 4), 0x38 if fmt is E4M3 else 0x78)
    sa[5, 2] = fmt[2]
    got = execute("v_wmma_scale_f32_16x16x128_f8f6f4", 16, A, B, C, sa, sb, 0, 32,
                  f"{FP4} matrix_a_scale_fmt:{mod} matrix_b_scale_fmt:{mod}")
    assert np.isnan(got[5]).all() and np.isfinite(np.delete(got, 5, 0)).all()
    np.testing.assert_array_equal(np.delete(got, 5, 0), np.delete(reference(A, B, C, sa, sb, 32, (fmt, fmt)), 5, 0))


@pytest.mark.parametrize("mods,match", [
    # bit 7 of an E4M3 scale: a sign to OCP's E4M3, masked off by CK; not defined for the WMMA
    (f"{FP4} matrix_a_scale_fmt:MATRIX_SCALE_FMT_E4M3 matrix_b_scale_fmt:MATRIX_SCALE_FMT_E4M3", "bit 7"),
    # E5M3 / E4M3 scale only FP4 operands: FP8 A with an E4M3 scale is outside the ISA's combinations
    ("matrix_b_fmt:MATRIX_FMT_FP4 matrix_a_scale_fmt:MATRIX_SCALE_FMT_E4M3", "with operands e4m3, e2m1"),
    # two FP4 operands must share the scale format
    (f"{FP4} matrix_a_scale_fmt:MATRIX_SCALE_FMT_E5M3 matrix_b_scale_fmt:MATRIX_SCALE_FMT_E4M3", "with operands"),
])
def test_open_or_illegal_cases_raise(mods, match):
    regs = {r: np.full(32, 0xB8B8B8B8, np.uint32) for r in (60, 61)}       # E4M3 bytes with bit 7 set
    na = 8 if "matrix_a_fmt" in mods else 16
    regs.update({8 + i: np.zeros(32, np.uint32) for i in range(na)})
    regs.update({32 + i: np.zeros(32, np.uint32) for i in range(16)})
    with pytest.raises(UnsupportedInstruction, match=match):
        run("gfx1250", f"v_wmma_scale_f32_16x16x128_f8f6f4 v[64:71], v[8:{7 + na}], v[32:39], v[40:47], v60, v61 {mods}",
            regs, [64])
