"""Independent numpy/Fraction model of gfx950 MFMAs, written from the layout tables of
docs/gfx950_isa.md §1.3-1.5 (ISA §7.1.4-7.1.5, §7.2.1) and ml_dtypes decoders -- not from mxgemm.emu.

Numerics under test: exact sum over K of the exactly scaled products, one fp32 RNE rounding,
then fp32 RNE add of C."""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
          "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
          "e2m1": ml_dtypes.float4_e2m1fn, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4, "bf16": 16, "f16": 16}
CODES = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")      # cbsz / blgp
NREGS = {8: 8, 6: 6, 4: 4}                             # f8f6f4 operand VGPRs per element width


def decode(fmt: str, codes) -> np.ndarray:
    codes = np.asarray(codes)
    if BITS[fmt] == 16:
        with np.errstate(invalid="ignore"):
            return codes.astype(np.uint16).view(DTYPES[fmt]).astype(np.float64)
    return codes.astype(np.uint8).view(DTYPES[fmt]).astype(np.float64)


def lane_items(regs, bits: int, count: int):
    """items[lane][i]: a lane's VGPRs as one little-endian bit string, item i at bits*i."""
    out = []
    for lane in range(64):
        s = sum(int(regs[r][lane]) << (32 * r) for r in range(len(regs)))
        out.append([(s >> (bits * i)) & ((1 << bits) - 1) for i in range(count)])
    return out


def element_of(shape, fmt: str, lane: int, i: int):
    """(row-or-col, k, kblock) of item i in lane l -- docs/gfx950_isa.md §1.3 lane table; dense forms
    (K 32/16): row l%M, k = (K/(64/M)) * (l/M) + i."""
    m, _, k = shape
    if k in (128, 64):
        if fmt in ("e4m3", "e5m2"):
            if m == 16:
                return lane % 16, 16 * (lane // 16) + i % 16 + 64 * (i // 16)
            return lane % 32, 16 * (lane // 32) + i % 16 + 32 * (i // 16)
        return lane % m, 32 * (lane // m) + i
    per = k // (64 // m)
    return lane % m, per * (lane // m) + i


def gather(shape, fmt, regs):
    m, _, k = shape
    count = {128: 32, 64: 32}.get(k, k // (64 // m))
    items = lane_items(regs, BITS[fmt], count)
    mat = np.full((m, k), np.nan)
    seen = np.zeros((m, k), bool)
    for lane in range(64):
        for i in range(count):
            r, kk = element_of(shape, fmt, lane, i)
            assert not seen[r, kk]
            seen[r, kk] = True
            mat[r, kk] = decode(fmt, items[lane][i])
    assert seen.all()
    return mat


def scale_of(scales, opsel, row, kb, m):
    """2^(E-127) of row `row`, K block kb: byte opsel of lane row + m*kb (ISA §7.2.1)."""
    e = (int(scales[row + m * kb]) >> (8 * opsel)) & 0xFF
    return np.nan if e == 0xFF else 2.0 ** (e - 127)


def round_f32(x: Fraction) -> np.float32:
    """Nearest fp32 of an exact rational, ties to even mantissa; overflow -> Inf."""
    lim = Fraction(2 ** 128 - 2 ** 103)
    if abs(x) >= lim:
        return np.float32(np.inf if x > 0 else -np.inf)
    f = np.float32(float(x))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    cands = [c for c in cands if np.isfinite(c)]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(c.view(np.uint32)) & 1))
    return np.float32(best)


def exact_sum_f32(terms) -> np.float32:
    terms = [float(t) for t in terms]
    if not all(np.isfinite(terms)):
        with np.errstate(invalid="ignore"):
            return np.float32(np.sum(terms))        # NaN / +-Inf outcome is order-free
    return round_f32(sum((Fraction(t) for t in terms), Fraction(0)))


def product(x: float, y: float) -> float:
    """One element product as the MFMA forms it: IEEE 754 multiplication, so Inf x 0 (an e5m2
    Inf against a zero element of the other operand) is an invalid operation giving NaN, and
    the dot product is NaN. Spelled out because numpy's Inf * 0 gives NaN with a warning."""
    if (np.isinf(x) and y == 0) or (np.isinf(y) and x == 0):
        return np.nan
    return x * y


def model(shape, fa, fb, a_regs, b_regs, c_bits, sa=None, opa=0, sb=None, opb=0):
    """D bits [nregs, 64] of one MFMA."""
    m, n, k = shape
    a = gather(shape, fa, a_regs)                   # [m, k]
    b = gather(shape, fb, b_regs)                   # [n, k]  (B column n plays A's row)
    block = min(32, k)
    p = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            terms = []
            for kb in range(k // block):
                s = 1.0 if sa is None else scale_of(sa, opa, i, kb, m) * scale_of(sb, opb, j, kb, n)
                terms += [product(a[i, kk], b[j, kk]) * s for kk in range(kb * block, (kb + 1) * block)]
            p[i, j] = exact_sum_f32(terms)
    c = np.asarray(c_bits, np.uint32).view(np.float32)
    d = np.zeros_like(c)
    for r in range(c.shape[0]):
        for lane in range(64):
            if m == 16:
                i, j = 4 * (lane // 16) + r, lane % 16           # ISA §7.1.4.2
            else:
                i, j = (r % 4) + 8 * (r // 4) + 4 * (lane // 32), lane % 32
            with np.errstate(invalid="ignore", over="ignore"):
                d[r, lane] = p[i, j] + c[r, lane]
    return d.view(np.uint32)


def random_codes(rng, fmt, size, special_rate=0.0):
    """Random element codes; NaN codes of fp8 only at special_rate (else every sum is NaN)."""
    bits = BITS[fmt]
    codes = rng.integers(0, 1 << bits, size=size)
    if fmt in ("e4m3", "e5m2", "bf16", "f16"):
        vals = decode(fmt, codes)
        bad = ~np.isfinite(vals) & (rng.random(size) >= special_rate)
        codes = np.where(bad, codes & ~(1 << (bits - 2)), codes)    # clear top exponent bit
    if fmt in ("bf16", "f16"):                                      # keep sums in range
        codes = (codes & ~(0x3 << (bits - 3))) | (0x1 << (bits - 3))
    return codes


def pack(codes, bits, nregs):
    """Pack per-lane item codes [64, count] into VGPRs [nregs, 64] (little-endian bits)."""
    regs = np.zeros((nregs, 64), np.uint32)
    for lane in range(64):
        s = 0
        for i, c in enumerate(codes[lane]):
            s |= int(c) << (bits * i)
        for r in range(nregs):
            regs[r, lane] = (s >> (32 * r)) & 0xFFFFFFFF
    return regs
