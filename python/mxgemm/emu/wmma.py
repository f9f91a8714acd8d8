"""gfx1250 WMMA (wave32 matrix core) semantics: register layouts, and D = A*B + C with MX block
scales, on the exact numerics model of the gfx950 MFMAs (matrix._dot_scaled: exact scaled sum
rounded once to fp32, then + C with one more rounding).

Layouts (docs/gfx1250_emulator.md §3 gives the evidence and the remaining doubt): lane l holds
row (A) / column (B) l % 16 of a 16-row operand; its elements, as one little-endian bit string
of the lane's registers, run along K in runs of kw (KW: 16 for 8-bit, 32 for 6- and 4-bit,
8 for 16-bit types, 2 for f32) that alternate between the two lane halves: element i of half h is
K = i % kw + kw * h + 2 kw * (i // kw). Forms: 16x16x128 f8f6f4 (scaled or not), 32x16x128 f4,
16x16x64 fp8/bf8, 16x16x32 bf16/f16, 16x16x4 f32 (A: VGPR v of lane l is K = v + 2 (l // 16), as
the ISA's 32-bit A table; its products are exact in float64, so the f32 form shares the model).
The bf16-result forms (v_wmma_bf16_16x16x32_bf16: bf16 C and D; v_wmma_bf16f32_16x16x32_bf16:
fp32 C, bf16 D) hold 8 bf16 per lane in 4 VGPRs, element i (LLVM's <8 x bfloat> element i) in
the place of the fp32 accumulator's VGPR i: half i % 2 of VGPR i // 2. Their numerics are the
emulator's choice, not a documented one: the fp32 form's result (bf16 C widened exactly) rounded
once more, RNE, to bf16.
The 16x16 fp32 accumulator: lane l holds column l % 16, VGPR r row r + 8 (l // 16); the 32x16
one stacks two of them (VGPRs 8-15: rows 16-31). Scales: one 32-bit VGPR per lane, byte j = K block j (32 wide) of row
(or column) l % 16, read from lanes 0-15 (MATRIX_SCALE_ROW0) or 16-31 (ROW1), except the
32-row A of the 32x16 form: row m from lane m; the scale16 forms take a 64-bit pair, byte j =
K block j of 16. Scale formats (§3.3): E8M0 for every operand format; FP4 operands also take the
unsigned E5M3 (bias 15) and E4M3 (bias 7, bit 7 unused) scales, both with subnormals and one NaN
code; an E4M3 byte with bit 7 set raises (what the hardware does with it is not public)."""
from __future__ import annotations

import functools
import re

import numpy as np

from .isa import GFX12, UnsupportedInstruction
from .matrix import BITS, _dot_scaled, _full_writer, _vec_reader, unpack_items
from .mxcvt import bf16_round, decode_table, e8m0_value, lsb_table

LANES = 32
KW = {32: 2, 16: 8, 8: 16, 6: 32, 4: 32}     # element bits -> K run of a lane half
_FMT = {"FP8": "e4m3", "BF8": "e5m2", "FP6": "e2m3", "BF6": "e3m2", "FP4": "e2m1"}
_NAMES = {"fp8": "e4m3", "bf8": "e5m2", "bf16": "bf16", "f16": "f16", "f32": "f32"}


@functools.lru_cache(maxsize=None)
def ab_layout(rows: int, k: int, bits: int):
    """(row, kidx) [32, items]: item i of lane l is element [row, kidx] of a rows x k operand
    (A as stored, B transposed). rows = 32 (the 32x16x128 FP4 A): two 16-row operands stacked,
    VGPRs 0-7 rows 0-15, VGPRs 8-15 rows 16-31."""
    kw = KW[bits]
    lane = np.arange(LANES)[:, None]
    items = rows * k // LANES
    i = np.arange(items)[None, :]
    per_row = k // 2                          # items of one row in one lane half
    g, p = i // per_row, i % per_row
    kidx = p % kw + kw * (lane // 16) + 2 * kw * (p // kw)
    row = lane % 16 + 16 * g
    return np.ascontiguousarray(np.broadcast_to(row, kidx.shape)), np.ascontiguousarray(kidx)


@functools.lru_cache(maxsize=None)
def cd_layout(rows: int):
    """(row, col) [rows / 2, 32] of the fp32 accumulator: VGPR r of lane l is row r % 8 +
    8 (l // 16) + 16 (r // 8), column l % 16 (the 32-row form stacks two 16-row ones)."""
    r = np.arange(rows // 2)[:, None]
    lane = np.arange(LANES)[None, :]
    return (np.ascontiguousarray(np.broadcast_to(r % 8 + 8 * (lane // 16) + 16 * (r // 8), (rows // 2, LANES))),
            np.ascontiguousarray(np.broadcast_to(lane % 16, (rows // 2, LANES))))


def operand(regs, rows, k, fmt, neg=False):
    """float64 [rows, k] values and lsb bounds of an A (or transposed B) operand."""
    row, kidx = ab_layout(rows, k, 32 if fmt == "f32" else BITS[fmt])
    vals, lsb = np.empty((rows, k)), np.empty((rows, k))
    if fmt == "f32":                    # one element per register
        v = np.ascontiguousarray(np.asarray(regs, np.uint32).T).view(np.float32).astype(np.float64)
        ok = np.isfinite(v) & (v != 0)
        vals[row, kidx] = v
        lsb[row, kidx] = np.where(ok, np.ldexp(1.0, np.frexp(np.where(ok, v, 1.0))[1] - 24), np.inf)
    else:
        codes = unpack_items(regs, BITS[fmt], kidx.shape[1])
        vals[row, kidx] = decode_table(fmt)[codes]
        lsb[row, kidx] = lsb_table(fmt)[codes]
    return (-vals if neg else vals), lsb


def scale_bytes(scale_regs, rows, nblocks, sel):
    """uint32 [rows, nblocks] scale bytes: byte j of lane m (+ 16 sel) for a 16-row operand, of
    lane m for the 32-row A; scale_regs uint32 [nregs, 32] (nregs 2: scale16, 8 bytes)."""
    by = np.ascontiguousarray(np.asarray(scale_regs, np.uint32).T).view(np.uint8)   # [32, 4 nregs]
    lanes = np.arange(rows) + (16 * sel if rows == 16 else 0)
    return by[lanes, :nblocks].astype(np.uint32)


# matrix_{a,b}_scale_fmt: LLVM's MATRIX_SCALE_FMT_* names, or the raw field
SCALE_FMT = {0: "e8m0", 1: "e5m3", 2: "e4m3", "MATRIX_SCALE_FMT_E8": "e8m0", "MATRIX_SCALE_FMT_E5M3": "e5m3",
             "MATRIX_SCALE_FMT_E4M3": "e4m3"}
_SCALE_BITS = {"e5m3": (5, 15, 0xFF), "e4m3": (4, 7, 0x7F)}     # exponent bits, bias, NaN code


@functools.lru_cache(maxsize=None)
def scale_table(fmt: str):
    """(n, f) float64 [256]: an E5M3 / E4M3 scale byte's value as n * f, n an integer (<= 15;
    NaN for the NaN code), f a power of two (docs/gfx1250_emulator.md §3.3)."""
    ebits, bias, nan = _SCALE_BITS[fmt]
    code = np.arange(256)
    e, m = code >> 3 & ((1 << ebits) - 1), code & 7
    n = np.where(e > 0, 8 + m, m).astype(np.float64)
    n[nan] = np.nan
    return n, np.ldexp(1.0, np.maximum(e, 1) - bias - 3)


def scaled(vals, scale_regs, rows, block, sel, fmt, where=""):
    """Operand values and power-of-two block factors [rows, k / block]. An E5M3 / E4M3 scale
    n * f multiplies the values by n (exact in float64), so the factors stay powers of two, as
    _dot_scaled's exactness bound assumes."""
    nb = vals.shape[1] // block
    if scale_regs is None:
        return vals, np.ones((rows, nb))
    by = scale_bytes(scale_regs, rows, nb, sel)
    if fmt == "e8m0":
        return vals, e8m0_value(by)
    if fmt == "e4m3" and (by & 0x80).any():
        raise UnsupportedInstruction(f"E4M3 scale byte with bit 7 set (not defined publicly): {where}")
    n, f = scale_table(fmt)
    return vals * np.repeat(n[by], block, axis=1), f[by]


def wmma(m, k, fa, fb, a, b, c, sa=None, sb=None, sel_a=0, sel_b=0, block=32, neg=(0, 0, 0), abs_c=False,
         sfmt=("e8m0", "e8m0"), where=""):
    """D (uint32 fp32 bits [m / 2, 32]) of one wave's WMMA D = A*B + C; a, b, c, sa, sb: uint32
    register arrays [nregs, 32]; fa / fb: element formats; sa / sb None: unscaled; sfmt: the
    A and B scale formats; where: the instruction, for errors."""
    va, la = operand(a, m, k, fa, neg[0])
    vb, lb = operand(b, 16, k, fb, neg[1])
    block = min(block, k)
    va, fa_ = scaled(va, sa, m, block, sel_a, sfmt[0], where)
    vb, fb_ = scaled(vb, sb, 16, block, sel_b, sfmt[1], where)
    p = _dot_scaled(va, la, vb.T, lb.T, fa_, fb_, block)
    row, col = cd_layout(m)
    cf = np.asarray(c, np.uint32).view(np.float32)
    cf = np.abs(cf) if abs_c else cf
    cf = -cf if neg[2] else cf
    with np.errstate(over="ignore", invalid="ignore"):
        return (p[row, col] + cf).astype(np.float32).view(np.uint32)


_WMMA = re.compile(r"v_wmma_(scale16_|scale_)?(f32|bf16|bf16f32)_(16|32)x16x(\d+)_(\w+)")


def unpack16(regs):
    """bf16 accumulator registers uint32 [4, 32] -> fp32 bits [8, 32]: element i of a lane (the
    fp32 accumulator's VGPR i) is half i % 2 of VGPR i // 2."""
    r = np.asarray(regs, np.uint32)
    out = np.empty((2 * r.shape[0], r.shape[1]), np.uint32)
    out[0::2], out[1::2] = r << np.uint32(16), r & np.uint32(0xFFFF0000)
    return out


def pack16(d):
    """fp32 bits [8, 32] -> bf16 registers [4, 32], each element rounded once (RNE)."""
    h = bf16_round(np.asarray(d, np.uint32).view(np.float32).astype(np.float64))
    return (h[0::2] | (h[1::2] << np.uint32(16))).astype(np.uint32)


def _fmt_mod(mods, key, default):
    v = mods.get(key)
    if v is None:
        return default
    name = str(v).rsplit("_", 1)[-1]
    if name not in _FMT:
        raise UnsupportedInstruction(f"{key}:{v}")
    return _FMT[name]


def _build(ins):
    mt = _WMMA.fullmatch(ins.base)
    scaled, acc, m, k, ty = mt.group(1), mt.group(2), int(mt.group(3)), int(mt.group(4)), mt.group(5)
    mods = ins.mods
    if ty in ("f8f6f4", "f4"):
        fa = _fmt_mod(mods, "matrix_a_fmt", "e2m1" if ty == "f4" else "e4m3")
        fb = _fmt_mod(mods, "matrix_b_fmt", "e2m1" if ty == "f4" else "e4m3")
    elif ty in _NAMES:
        fa = fb = _NAMES[ty]
    else:
        fa, fb = (_NAMES[t] for t in ty.split("_"))
    neg_lo, neg_hi = mods.get("neg_lo", [0, 0, 0]), mods.get("neg_hi", [0, 0, 0])
    neg, abs_c = (tuple(neg_lo) + (0, 0, 0))[:3], bool((tuple(neg_hi) + (0, 0, 0))[2])
    ncd = m // 2
    read_a, read_b = _vec_reader(ins, 1, ins.ops[1].count), _vec_reader(ins, 2, ins.ops[2].count)
    read_c, write_d = _vec_reader(ins, 3, ncd // 2 if acc == "bf16" else ncd), _full_writer(ins, 0)
    if acc == "bf16":      # bf16 C, widened exactly
        get_c = read_c
        read_c = lambda w: unpack16(get_c(w))  # noqa: E731
    if acc != "f32":       # bf16 D: the fp32 result rounded once more
        put_d = write_d
        write_d = lambda w, d: put_d(w, pack16(d))  # noqa: E731
    if scaled:
        sfmt = tuple(SCALE_FMT.get(mods.get(key, 0)) for key in ("matrix_a_scale_fmt", "matrix_b_scale_fmt"))
        # E5M3 / E4M3 scale only FP4, and two FP4 operands share the scale format (§3.3)
        if (None in sfmt or any(s != "e8m0" and f != "e2m1" for s, f in zip(sfmt, (fa, fb)))
                or (fa == fb == "e2m1" and sfmt[0] != sfmt[1])):
            raise UnsupportedInstruction(f"scale formats {sfmt} with operands {fa}, {fb}: {ins.where()}")
        where = ins.where()
        nsr = 2 if scaled == "scale16_" else 1
        read_sa, read_sb = _vec_reader(ins, 4, nsr), _vec_reader(ins, 5, nsr)
        sel_a, sel_b = (int(str(mods.get(key, "ROW0"))[-1]) for key in ("matrix_a_scale", "matrix_b_scale"))
        block = 16 if nsr == 2 else 32

        def run(w):
            a, b, c, sa, sb = read_a(w), read_b(w), read_c(w), read_sa(w), read_sb(w)
            write_d(w, np.concatenate([wmma(m, k, fa, fb, a[:, s], b[:, s], c[:, s], sa[:, s], sb[:, s], sel_a, sel_b,
                                            block, neg, abs_c, sfmt, where) for s in _waves(w)], axis=1))
    else:
        def run(w):
            a, b, c = read_a(w), read_b(w), read_c(w)
            write_d(w, np.concatenate([wmma(m, k, fa, fb, a[:, s], b[:, s], c[:, s], neg=neg, abs_c=abs_c)
                                       for s in _waves(w)], axis=1))
    return run


def _waves(w):
    return [slice(i, i + LANES) for i in range(0, w.n, LANES)]


GFX12.register(*[f"v_wmma_f32_16x16x128_{a}_{b}" for a in ("fp8", "bf8") for b in ("fp8", "bf8")],
               "v_wmma_f32_16x16x128_f8f6f4", "v_wmma_scale_f32_16x16x128_f8f6f4",
               "v_wmma_scale16_f32_16x16x128_f8f6f4", "v_wmma_f32_32x16x128_f4", "v_wmma_scale_f32_32x16x128_f4",
               "v_wmma_scale16_f32_32x16x128_f4", "v_wmma_f32_16x16x32_bf16", "v_wmma_f32_16x16x32_f16",
               *[f"v_wmma_f32_16x16x64_{a}_{b}" for a in ("fp8", "bf8") for b in ("fp8", "bf8")],
               "v_wmma_f32_16x16x4_f32", "v_wmma_bf16_16x16x32_bf16", "v_wmma_bf16f32_16x16x32_bf16")(_build)
