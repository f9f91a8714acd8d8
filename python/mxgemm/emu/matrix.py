"""gfx950 matrix-core (MFMA) semantics on register arrays.

Registers are uint32 numpy arrays shaped [nregs, 64 lanes]. Operand layouts are from the CDNA4
ISA (§7.1.4-7.1.5, §7.2) as tabled in docs/gfx950_isa.md §1.3; the bf16/f16 and fp8 16x16x32 /
32x32x16 forms use the ISA's dense layout (lane l holds row l%M, K = kpl*(l/M) + i, the same
pattern the AMD matrix-core blog shows for 32x32x16 fp8).

Numerics model (all of it lives in `_dot_scaled`; change it there if hardware disagrees):
  1. every element product a*b and its block scale 2^(SA-127) * 2^(SB-127) are exact;
  2. the sum over ALL K of the scaled products is computed exactly and rounded ONCE to fp32
     (RNE, fp32 subnormals kept, overflow -> Inf);
  3. C is added afterwards with one more fp32 RNE rounding: D = fp32(P + C).
  NaN/Inf propagate as IEEE: any NaN element or NaN scale (0xFF) in a row/column block makes
  the output NaN, Inf*0 is NaN, +Inf + -Inf is NaN.
The ISA documents neither the accumulation order nor its precision (docs/gfx950_isa.md §1.1), so this
is the "ideal" model: it is independent of summation order, which makes kernels bit-exact
against a reference that sums exactly. Exactness: float64 sums are exact when every partial
sum is a multiple of a common quantum q below 2^53 q; we prove that per output element with a
cheap bound and fall back to Python-integer sums for the rare elements where it fails
(wide-range bf8/bf16 data).
"""
from __future__ import annotations

import functools
import math
import re

import numpy as np

from . import race
from . import regs as R
from .isa import UnsupportedInstruction, handler
from .mxcvt import MFMA_FORMAT_CODES, decode_table, e8m0_value, lsb_table

F8F6F4 = frozenset(("e4m3", "e5m2", "e2m3", "e3m2", "e2m1"))
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4, "bf16": 16, "f16": 16, "f32": 32}


# ---- operand layouts ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def ab_layout(mn: int, k: int, fmt: str, sparse: bool = False):
    """(row, kidx) arrays [64, items]: lane l's item i of the A (or B) operand is element
    A[row][kidx] (or B[kidx][col]) of an mn x k operand. Tables: docs/gfx950_isa.md §1.3; the
    sparse forms (v_smfmac_*, sparse=True; A's items before compression) are K-contiguous per
    lane group whatever the format (§10.2)."""
    lane = np.arange(64)[:, None]
    groups = 64 // mn                     # lane groups along K: 4 for 16x16, 2 for 32x32
    g = lane // mn
    items = k // groups
    i = np.arange(items)[None, :]
    if fmt in ("e4m3", "e5m2") and items == 32 and not sparse:
        # f8f6f4 with FP8/BF8: two 16-byte halves, the second 64 (16x16) or 32 (32x32) K later
        kidx = 16 * g + i % 16 + (k // 2) * (i // 16)
    else:
        # FP6/FP4 f8f6f4 and all dense bf16/f16/fp8 forms: K-contiguous per lane group
        kidx = items * g + i
    row = np.broadcast_to(lane % mn, kidx.shape)
    return np.ascontiguousarray(row), np.ascontiguousarray(kidx)


@functools.lru_cache(maxsize=None)
def cd_layout(mn: int):
    """(row, col) arrays [nregs, 64] of the fp32 C/D accumulator (ISA §7.1.4.2)."""
    nregs = mn * mn // 64
    r = np.arange(nregs)[:, None]
    lane = np.arange(64)[None, :]
    col = np.broadcast_to(lane % mn, (nregs, 64))
    if mn == 16:
        row = 4 * (lane // 16) + r
    else:
        row = (r % 4) + 8 * (r // 4) + 4 * (lane // 32)
    return np.ascontiguousarray(row), np.ascontiguousarray(col)


def unpack_items(regs: np.ndarray, bits: int, items: int) -> np.ndarray:
    """Element codes [lanes, items] of a lane-packed operand: the lane's registers form one
    little-endian bit string and item i is bits [bits*i + bits-1 : bits*i] (ISA §7.1.4)."""
    regs = np.ascontiguousarray(np.asarray(regs, dtype=np.uint32).T)    # [lanes, nregs]
    lanes = regs.shape[0]
    by = regs.view(np.uint8)                                            # [lanes, 4*nregs]
    if bits == 8:
        return by[:, :items].astype(np.uint32)
    if bits == 16:
        return regs.view(np.uint16)[:, :items].astype(np.uint32)
    if bits == 32:
        return regs[:, :items]
    if bits == 4:
        nib = np.stack([by & 0xF, by >> 4], axis=-1).reshape(lanes, -1)
        return nib[:, :items].astype(np.uint32)
    bitv = np.unpackbits(by, axis=1, bitorder="little")[:, : bits * items]
    return (bitv.reshape(lanes, items, bits).astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(
        axis=2, dtype=np.uint32)


def operand_matrix(regs, mn: int, k: int, fmt: str, transpose: bool = False, sparse: bool = False):
    """Decode an A operand into float64 [mn, k] (or a B operand into [k, mn] if transpose),
    plus the matching per-element lsb bounds used by the exactness proof."""
    row, kidx = ab_layout(mn, k, fmt, sparse)
    codes = unpack_items(regs, BITS[fmt], kidx.shape[1])
    vals = np.empty((mn, k))
    lsb = np.empty((mn, k))
    vals[row, kidx], lsb[row, kidx] = _f32_values(codes) if fmt == "f32" else (decode_table(fmt)[codes],
                                                                                 lsb_table(fmt)[codes])
    if transpose:
        return vals.T, lsb.T
    return vals, lsb


def _f32_values(codes):
    """(float64 values, lsb bounds) of fp32 bit patterns: a 24-bit significand's spacing (inf for
    0 / NaN / Inf), as lsb_table gives for the small formats."""
    v = np.ascontiguousarray(codes, np.uint32).view(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(v) & (v != 0)
    _, e = np.frexp(np.where(ok, v, 1.0))
    return v, np.where(ok, np.ldexp(1.0, np.maximum(e - 24, -149)), np.inf)


def sparse_positions(sel, mn: int, k: int, fmt: str):
    """(row, kidx) arrays [64, kept] of a v_smfmac's compressed A (docs/gfx950_isa.md §10.2): lane
    l's kept value c (its packed item c) lies in group c // 2 of four K of the lane's dense window,
    at the place bits [2c+1:2c] of the lane's selector `sel` (uint32 [64]) name."""
    row, kidx = ab_layout(mn, k, fmt, True)
    kept = kidx.shape[1] // 2
    c = np.arange(kept)
    place = 4 * (c // 2)[None, :] + ((np.asarray(sel, np.uint32)[:, None] >> (2 * c).astype(np.uint32)) & 3)
    lane = np.arange(64)[:, None]
    return row[lane, place], kidx[lane, place]


def sparse_operand_matrix(regs, sel, mn: int, k: int, fmt: str):
    """The dense float64 [mn, k] A of a v_smfmac and its lsb bounds. Two kept values naming one
    place add: each multiplies the B element its place selects (the emulator's reading, §10.3)."""
    row, kidx = sparse_positions(sel, mn, k, fmt)
    codes = unpack_items(regs, BITS[fmt], kidx.shape[1])
    vals, lsb = np.zeros((mn, k)), np.full((mn, k), np.inf)
    np.add.at(vals, (row, kidx), decode_table(fmt)[codes])
    np.minimum.at(lsb, (row, kidx), lsb_table(fmt)[codes])
    return vals, lsb


def scale_matrix(scale_u32, opsel: int, mn: int, nblocks: int) -> np.ndarray:
    """Block scales [mn, nblocks] as float64 factors. Row m's scale for K block kb is byte
    `opsel` of lane m + mn*kb's scale VGPR (ISA §7.2.1 tables; Triton's scale layout)."""
    s = np.asarray(scale_u32, dtype=np.uint32)
    byte = (s >> np.uint32(8 * opsel)) & 0xFF
    lanes = np.arange(mn)[:, None] + mn * np.arange(nblocks)[None, :]
    return e8m0_value(byte[lanes])


# ---- numerics model -----------------------------------------------------------------------

def _dot_scaled(a, la, b, lb, sa, sb, block: int) -> np.ndarray:
    """P[m, n] = fp32_RNE( exact sum_kb sa[m,kb] sb[n,kb] sum_{k in kb} a[m,k] b[k,n] ).

    a [M,K], b [K,N] float64 element values; la/lb their lsb bounds; sa [M,nb], sb [N,nb]
    float64 scale factors (NaN for e8m0 0xFF). THE single place of the MFMA numerics model."""
    m, k = a.shape
    n = b.shape[1]
    nb = k // block
    ab = a.reshape(m, nb, block)
    bb = b.reshape(nb, block, n)
    with np.errstate(invalid="ignore", over="ignore"):
        s = sa[:, None, :] * sb[None, :, :]                            # [M, N, nb]
        blk = np.einsum("mbk,bkn->mnb", ab, bb)
        total = (blk * s).sum(axis=2)
        # exactness proof: all terms are multiples of q; if sum |terms| < 2^52 q, every
        # partial float64 sum is exact whatever the order
        mag = (np.einsum("mbk,bkn->mnb", np.abs(ab), np.abs(bb)) * s).sum(axis=2)
        qa = la.reshape(m, nb, block).min(axis=2)                       # [M, nb]
        qb = lb.reshape(nb, block, n).min(axis=1).T                     # [N, nb]
        q = (qa[:, None, :] * qb[None, :, :] * s).min(axis=2)
        risky = np.isfinite(mag) & (mag > 0) & ~(mag < np.ldexp(q, 52))
        out = total.astype(np.float32)
    i, j = np.nonzero(risky)
    if i.size:
        terms = (ab[i] * bb.transpose(2, 0, 1)[j]) * s[i, j][:, :, None]     # [risky, nb, block]
        out[i, j] = round_exact_sums_f32(terms.reshape(i.size, -1))
    return out


_F32_MID_BITS, _F32_MID = np.uint64(0x1FFFFFFF), np.uint64(0x10000000)   # float64 bits below fp32's lsb


def round_exact_sums_f32(rows) -> np.ndarray:
    """fp32 RNE of the exact sum of each row of finite float64 terms. math.fsum gives the exact
    sum rounded once to float64; rounding that to fp32 gives the fp32 rounding of the exact sum
    unless it lies exactly on an fp32 midpoint (which side the exact sum lies on is lost) or
    outside fp32's normal range (other midpoint positions, overflow): those rows take the
    integer path."""
    out = np.empty(len(rows), np.float32)
    sums = np.empty(len(rows))
    for r, row in enumerate(rows.tolist()):
        try:
            sums[r] = math.fsum(row)
        except OverflowError:
            sums[r] = math.inf
    mag = np.abs(sums)
    exact = ((sums.view(np.uint64) & _F32_MID_BITS) == _F32_MID) | ~((mag >= 2.0 ** -126) & (mag < 2.0 ** 127))
    exact &= sums != 0.0         # an exact zero sum is +0
    with np.errstate(over="ignore"):   # sums past the f32 range are among the exact rows, rounded below
        out[:] = sums
    out[sums == 0.0] = 0.0
    for r in np.nonzero(exact)[0]:
        out[r] = round_exact_sum_f32(rows[r])
    return out


def round_exact_sum_f32(terms) -> np.float32:
    """fp32 RNE of the exact sum of finite float64 terms (Python integers, no double rounding)."""
    parts = [math.frexp(float(t)) for t in terms if t != 0.0]
    if not parts:
        return np.float32(0.0)
    ints = [(int(fr * (1 << 53)), e - 53) for fr, e in parts]
    e0 = min(e for _, e in ints)
    n = sum(v << (e - e0) for v, e in ints)
    return np.float32(round_dyadic_f32(n, e0))


def round_dyadic_f32(n: int, e: int) -> float:
    """fp32 RNE of n * 2^e (integers), returned as a Python float (Inf on overflow)."""
    if n == 0:
        return 0.0
    neg, n = n < 0, abs(n)
    top = n.bit_length() - 1 + e                     # floor(log2 |value|)
    shift = (n.bit_length() - 24) if top >= -126 else (-149 - e)
    if shift > 0:
        q, r = divmod(n, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        n, e = q, e + shift
    try:
        v = math.ldexp(n, e)
    except OverflowError:
        v = math.inf
    v = math.inf if v >= 2.0 ** 128 else v
    return -v if neg else v


# ---- instructions -------------------------------------------------------------------------

# the f8f6f4 forms, gfx950's 16x16x32 / 32x32x16 and the CDNA3 single-block ones it keeps
# (16x16x16 / 32x32x8 f16 and bf16, 16x16x4 / 32x32x2 f32: K-contiguous per lane group)
SHAPES = {(16, 16, 128), (32, 32, 64), (16, 16, 32), (32, 32, 16), (16, 16, 16), (32, 32, 8), (16, 16, 4), (32, 32, 2)}
SPARSE_SHAPES = {(16, 16, 32), (32, 32, 16), (16, 16, 64), (32, 32, 32), (16, 16, 128), (32, 32, 64)}   # v_smfmac_*


def mfma(m: int, n: int, k: int, fmt_a: str, fmt_b: str, a_regs, b_regs, c_f32,
         scale_a_u32=None, opsel_a: int = 0, scale_b_u32=None, opsel_b: int = 0,
         neg_c: bool = False, abs_c: bool = False, a_sel=None) -> np.ndarray:
    """D = A*B + C of one MFMA; returns D as uint32 [m*n/64, 64] fp32 bits.

    c_f32: fp32 bit patterns (uint32) [m*n/64, 64]. Scales: VGPR values uint32 [64] (None = the
    unscaled opcode, i.e. scale 1.0, like ABID[0] = 0). Scale blocks are 32 K wide; the dense
    forms (K = 32 or 16 per instruction) have no scales and one block. a_sel: uint32 [64], the
    sparse forms' A selector bits per lane (sparse_positions); None for the dense forms."""
    assert m == n and (m, n, k) in (SHAPES if a_sel is None else SPARSE_SHAPES), (m, n, k)
    if a_sel is None:
        a, la = operand_matrix(a_regs, m, k, fmt_a)
    else:
        a, la = sparse_operand_matrix(a_regs, a_sel, m, k, fmt_a)
    b, lb = operand_matrix(b_regs, n, k, fmt_b, transpose=True, sparse=a_sel is not None)
    block = min(32, k)
    nb = k // block
    sa = np.ones((m, nb)) if scale_a_u32 is None else scale_matrix(scale_a_u32, opsel_a, m, nb)
    sb = np.ones((n, nb)) if scale_b_u32 is None else scale_matrix(scale_b_u32, opsel_b, n, nb)
    p = _dot_scaled(a, la, b, lb, sa, sb, block)
    row, col = cd_layout(m)
    c = np.asarray(c_f32, dtype=np.uint32).view(np.float32)
    if abs_c:
        c = np.abs(c)
    if neg_c:
        c = -c
    with np.errstate(over="ignore", invalid="ignore"):
        d = p[row, col] + c                 # fp32 + fp32 with one RNE rounding (numpy float32)
    return d.astype(np.float32).view(np.uint32)


def mfma_scale_f8f6f4(m, n, k, a_regs, b_regs, c_f32, cbsz, blgp, scale_a_u32, opsel_a,
                      scale_b_u32, opsel_b) -> np.ndarray:
    """v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4. cbsz/blgp: A/B format codes 0..4
    (E4M3, E5M2, E2M3, E3M2, E2M1); opsel_*: the e8m0 byte (0..3) of each lane's scale VGPR,
    decoded as {op_sel_hi[i], op_sel[i]}. Pass None scales for the unscaled opcode."""
    return mfma(m, n, k, MFMA_FORMAT_CODES[cbsz], MFMA_FORMAT_CODES[blgp], a_regs, b_regs, c_f32,
                scale_a_u32, opsel_a, scale_b_u32, opsel_b)


def opsel_byte(op_sel, op_sel_hi, src: int) -> int:
    """Scale byte of source src (0 = A, 1 = B) from the assembly's op_sel / op_sel_hi lists
    (clang 22 syntax, docs/gfx950_isa.md §1.5): byte = op_sel_hi[src] * 2 + op_sel[src]."""
    lo = op_sel[src] if op_sel and len(op_sel) > src else 0
    hi = op_sel_hi[src] if op_sel_hi and len(op_sel_hi) > src else 0
    return (int(hi) << 1) | int(lo)


def mnemonic_formats(mnemonic: str):
    """(m, n, k, fmt_a, fmt_b, scaled) of a v_mfma_* mnemonic this module handles, or None.
    f8f6f4 forms return fmt None (they come from cbsz/blgp)."""
    mt = re.fullmatch(r"v_mfma_(scale_)?f32_(\d+)x(\d+)x(\d+)_?(\w+)", mnemonic)
    if not mt:
        return None
    scaled, m, n, k, ty = bool(mt.group(1)), *map(int, mt.group(2, 3, 4)), mt.group(5)
    if (m, n, k) not in SHAPES:
        return None
    names = {"fp8": "e4m3", "bf8": "e5m2"}
    if ty == "f8f6f4":
        return m, n, k, None, None, scaled
    if ty in ("bf16", "f16", "f32"):
        return m, n, k, ty, ty, False
    parts = ty.split("_")
    if len(parts) == 2 and all(p in names for p in parts):
        return m, n, k, names[parts[0]], names[parts[1]], False
    return None


# ---- emulator handlers (MFMA operand layouts are wave64) -----------------------------------

def _full_writer(ins, i):
    """Setter of uint32 [nregs, w.n]: MFMA destinations ignore EXEC (ISA §7.1): write every lane."""
    op = ins.ops[i]
    r, n = R.vidx(ins, op), op.count
    keys = R.reg_keys(ins, i) if ins.prog.race else ()

    def put(w, val):
        if keys and w.pend:
            race.check_pending(w, keys, ins, "overwrites")
        w.V[r:r + n] = val
    return put


def _vec_reader(ins, i, nregs):
    """w -> uint32 [nregs, w.n] of operand i (constants broadcast, e.g. a literal 0 C)."""
    get = R.src_rows(ins, i)
    return lambda w: np.broadcast_to(get(w), (nregs, w.n)) if ins.ops[i].count < nregs else get(w)[:nregs]


def _build_mfma(ins):
    spec = mnemonic_formats(ins.base)
    if spec is None:
        raise UnsupportedInstruction(f"unknown MFMA {ins.base}")
    m, n, k, fa, fb, scaled = spec
    mods = ins.mods
    if fa is None:
        fa, fb = MFMA_FORMAT_CODES[mods.get("cbsz", 0)], MFMA_FORMAT_CODES[mods.get("blgp", 0)]
    elif mods.get("cbsz", 0) or mods.get("abid", 0) or mods.get("blgp", 0):
        raise UnsupportedInstruction(f"MFMA broadcast modifiers (cbsz/abid/blgp) in {ins.where()}")
    neg = mods.get("neg", [0, 0, 0])
    if neg[0] or neg[1]:
        raise UnsupportedInstruction(f"NEG on MFMA A/B is illegal: {ins.where()}")
    neg_c = bool(neg[2]) if len(neg) > 2 else False
    ncd = m * n // 64
    read_a = _vec_reader(ins, 1, ins.ops[1].count)
    read_b = _vec_reader(ins, 2, ins.ops[2].count)
    read_c = _vec_reader(ins, 3, ncd)
    write_d = _full_writer(ins, 0)
    if scaled:
        opa = opsel_byte(mods.get("op_sel"), mods.get("op_sel_hi"), 0)
        opb = opsel_byte(mods.get("op_sel"), mods.get("op_sel_hi"), 1)
        read_sa, read_sb = _vec_reader(ins, 4, 1), _vec_reader(ins, 5, 1)

        def run(w):
            a, b, c, sa, sb = read_a(w), read_b(w), read_c(w), read_sa(w)[0], read_sb(w)[0]
            write_d(w, np.concatenate([mfma(m, n, k, fa, fb, a[:, s], b[:, s], c[:, s], sa[s], opa, sb[s], opb,
                                            neg_c=neg_c) for s in _waves(w)], axis=1))
    else:
        def run(w):
            a, b, c = read_a(w), read_b(w), read_c(w)
            write_d(w, np.concatenate([mfma(m, n, k, fa, fb, a[:, s], b[:, s], c[:, s], neg_c=neg_c)
                                       for s in _waves(w)], axis=1))
    return run


def _waves(w):
    """Lane slices of the waves of w (one MFMA per wave of a lockstep unit)."""
    return [slice(i, i + 64) for i in range(0, w.n, 64)]


handler(*[f"v_mfma_{s}f32_{sh}_f8f6f4" for s in ("", "scale_") for sh in ("16x16x128", "32x32x64")],
        *[f"v_mfma_f32_{sh}_{ty}" for sh in ("16x16x32", "32x32x16")
          for ty in ("bf16", "f16", "fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8")],
        *[f"v_mfma_f32_{sh}_{ty}" for sh in ("16x16x16", "32x32x8") for ty in ("bf16", "f16")],
        "v_mfma_f32_16x16x4_f32", "v_mfma_f32_32x32x2_f32")(_build_mfma)



@handler("v_mfma_ld_scale_b32")
def _ld_scale(ins):
    """Standalone, it has no public semantics: LLVM defines it with no destination and no
    intrinsic (only the assembler makes it), and the ISA sources describe it only as the first
    dword pair of v_mfma_scale_*, which runs as one instruction here (docs/emu_coverage.md,
    docs/gfx950_isa.md §1.6)."""
    raise UnsupportedInstruction(
        f"v_mfma_ld_scale_b32 on its own: its standalone semantics are undocumented (which state it "
        f"loads, how long that lasts, what a following MFMA does with it); only its fused form "
        f"v_mfma_scale_f32_*_f8f6f4 is defined and emulated: {ins.where()}")


# ---- integer MFMA ---------------------------------------------------------------------------

def _int8_matrix(regs, mn: int, k: int, sel=None, sparse: bool = False) -> np.ndarray:
    """int64 [mn, k] of an i8 operand (A, or B as its columns), the dense layout of ab_layout;
    with sel, a v_smfmac's compressed A placed by sparse_positions (kept values on one place add)."""
    row, kidx = ab_layout(mn, k, "i8", sparse) if sel is None else sparse_positions(sel, mn, k, "i8")
    items = kidx.shape[1]
    vals = np.ascontiguousarray(np.asarray(regs, np.uint32).T).view(np.int8)[:, :items]
    out = np.zeros((mn, k), np.int64)
    np.add.at(out, (row, kidx), vals)
    return out


def mfma_i8(m: int, k: int, a_regs, b_regs, c_u32, a_sel=None) -> np.ndarray:
    """v_mfma_i32_{m}x{m}x{k}_i8 (a_sel: v_smfmac_i32_*, as mfma): D = A*B + C in int32 (wrapping);
    returns uint32 [m*m/64, 64] in the accumulator layout of the fp32 forms."""
    sparse = a_sel is not None
    d = _int8_matrix(a_regs, m, k, a_sel, sparse) @ _int8_matrix(b_regs, m, k, sparse=sparse).T
    row, col = cd_layout(m)
    c = np.asarray(c_u32, dtype=np.uint32).view(np.int32).astype(np.int64)
    return ((d[row, col] + c) & 0xFFFFFFFF).astype(np.uint32)


def _build_mfma_i8(ins):
    m, _, k = map(int, ins.base.split("_")[3].split("x"))
    if any(ins.mods.get(x, 0) for x in ("cbsz", "abid", "blgp")) or any(ins.mods.get("neg", [])):
        raise UnsupportedInstruction(f"MFMA modifiers on an integer MFMA: {ins.where()}")
    read_a, read_b = _vec_reader(ins, 1, ins.ops[1].count), _vec_reader(ins, 2, ins.ops[2].count)
    read_c, write_d = _vec_reader(ins, 3, m * m // 64), _full_writer(ins, 0)

    def run(w):
        a, b, c = read_a(w), read_b(w), read_c(w)
        write_d(w, np.concatenate([mfma_i8(m, k, a[:, s], b[:, s], c[:, s]) for s in _waves(w)], axis=1))
    return run


handler("v_mfma_i32_16x16x64_i8", "v_mfma_i32_32x32x32_i8", "v_mfma_i32_16x16x32_i8",
        "v_mfma_i32_32x32x16_i8")(_build_mfma_i8)


# ---- sparse MFMA (v_smfmac_*): D = A*B + D with a 4:2 structured-sparse A ---------------------

def smfmac_selector_set(ins, kpl: int) -> int:
    """Which kpl-bit set of the index VGPR holds A's selectors: ABID when CBSZ is 0, else set 0
    (docs/gfx950_isa.md §10.2); a set past the register is not a defined encoding."""
    cbsz, abid = ins.mods.get("cbsz", 0), ins.mods.get("abid", 0)
    s = 0 if cbsz else abid
    if s >= 32 // kpl:
        raise UnsupportedInstruction(f"v_smfmac index set {s} of {32 // kpl} in {ins.where()}")
    return s


def _build_smfmac(ins):
    dt, m, n, k, ty = re.fullmatch(r"v_smfmac_(f32|i32)_(\d+)x(\d+)x(\d+)_(\w+)", ins.base).groups()
    m, n, k = int(m), int(n), int(k)
    names = {"fp8": "e4m3", "bf8": "e5m2"}
    fa, fb = (ty, ty) if ty in ("f16", "bf16", "i8") else (names[t] for t in ty.split("_"))
    kpl = k * m // 64                     # K per lane of the dense operand: 8, 16 or 32
    shift, mask = np.uint32(kpl * smfmac_selector_set(ins, kpl)), np.uint32((1 << kpl) - 1)
    ncd = m * n // 64
    read_a, read_b = _vec_reader(ins, 1, ins.ops[1].count), _vec_reader(ins, 2, ins.ops[2].count)
    read_c, read_i, write_d = _vec_reader(ins, 0, ncd), _vec_reader(ins, 3, 1), _full_writer(ins, 0)

    def one(a, b, c, sel):
        if dt == "i32":
            return mfma_i8(m, k, a, b, c, a_sel=sel)
        return mfma(m, n, k, fa, fb, a, b, c, a_sel=sel)

    def run(w):
        a, b, c = read_a(w), read_b(w), read_c(w)
        sel = (read_i(w)[0] >> shift) & mask
        write_d(w, np.concatenate([one(a[:, s], b[:, s], c[:, s], sel[s]) for s in _waves(w)], axis=1))
    return run


# gfx950's forms and the CDNA3 ones it keeps (half the K; the assembler takes them for gfx950)
handler(*[f"v_smfmac_f32_{sh}_{ty}" for sh in ("16x16x64", "32x32x32", "16x16x32", "32x32x16")
          for ty in ("f16", "bf16")],
        *[f"v_smfmac_f32_{sh}_{ty}" for sh in ("16x16x128", "32x32x64", "16x16x64", "32x32x32")
          for ty in ("fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8")],
        *[f"v_smfmac_i32_{sh}_i8" for sh in ("16x16x128", "32x32x64", "16x16x64", "32x32x32")])(_build_smfmac)
