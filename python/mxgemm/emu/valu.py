"""Vector ALU: VOP1/2/3/3P/C with modifiers, DPP, SDWA, lane ops. Lanes are numpy arrays."""
from __future__ import annotations

import inspect

import numpy as np

from . import regs as R
from .isa import (
    EmulatorFault,
    PerWave,
    UnsupportedInstruction,
    const_bits,
    f16,
    f32,
    f64,
    handler,
    i16,
    i32,
    i64,
    u16,
    u32,
    u64,
)

_LO_MASKS = np.array([(1 << min(l, 32)) - 1 for l in range(64)], u64)   # v_mbcnt_lo: lanes below l
_HI_MASKS = np.array([((1 << (l - 32)) - 1) << 32 if l > 32 else 0 for l in range(64)], u64)


def _bits_u32(x, ty):
    """Reinterpret a typed per-lane value as uint32 (16-bit values zero-extended)."""
    x = np.asarray(x)
    if x.dtype.itemsize == 2:
        return x.view(u16).astype(u32)
    return x.view(u32) if x.dtype != u32 else x


# ---------------------------------------------------------------------------- exact fused FMA

# Constants as 0-d arrays, built once: a ufunc takes those faster than numpy scalars.
_LOW28, _LOW29, _HALF = (np.array(m, u64) for m in (0x0FFFFFFF, 0x1FFFFFFF, 0x10000000))   # low f64 bits
_F32_MIN_NORMAL = np.array(2.0 ** -126)    # below it the f32 grid is fixed, 2^-149


def fma32(a, b, c, out=None):
    """Correctly rounded f32 fma. a*b is exact in f64; the f64 sum s = p + c rounds again when
    converted to f32, which is wrong (double rounding) only when s lands exactly on an f32
    halfway point while p + c does not. Every f32 halfway point (normal or subnormal) has its
    low 28 f64 mantissa bits zero, so only sums with those go to _break_ties.
    out: an f32 array to write the result into (every element) instead of returning it."""
    p = np.multiply(a, b, dtype=f64)
    s = np.add(p, c, out=p) if p.ndim else np.add(p, c, dtype=f64)   # p is not needed below
    if np.count_nonzero(s.view(u64) & _LOW28) < s.size:
        s = _break_ties(a, b, c, s)
    if out is not None:
        out[...] = s   # the same f64 -> f32 conversion as astype, into the destination
        return out
    return s.astype(f32) if isinstance(s, np.ndarray) and s.ndim else f32(s)


def _break_ties(a, b, c, s):
    """s (p + c rounded to f64) moved one f64 step toward p + c where it is exactly an f32
    halfway point and p + c is not, so that rounding it to f32 goes the way p + c would. The
    halfway points: low 29 f64 bits 0x10000000 for |s| >= 2^-126, odd multiples of 2^-150 below."""
    small = np.abs(s) < _F32_MIN_NORMAL
    half = np.where(small, np.abs(np.fmod(np.where(small, s, 0) * 2.0 ** 150, 2)) == 1,
                    (s.view(u64) & _LOW29) == _HALF)
    if not np.count_nonzero(half):
        return s
    p = np.multiply(a, b, dtype=f64)
    bb = s - p
    err = (p - (s - bb)) + (np.asarray(c, f64) - bb)     # TwoSum: p + c - s exactly
    return np.where(half & (err != 0), np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)


# ---------------------------------------------------------------------------- op tables
# name: (dst type, src types, fn). fn takes typed numpy values; "t&m" types the source's low bits
# (u32 & m: a shift count, a 24-bit factor) as type t. An fn that takes out= may write into the
# destination.

def _cvt_i(x, t, lo, hi):
    """Float -> int with truncation, saturation and NaN -> 0 (v_cvt_i32_f32 rules)."""
    x = np.nan_to_num(np.asarray(x, f64), nan=0.0)
    return np.clip(np.trunc(x), lo, hi).astype(t)


def _bf16(x):
    """f32 -> bf16 bits, round to nearest even, NaN kept quiet."""
    b = np.asarray(x, f32).view(u32)
    r = (b + u32(0x7FFF) + ((b >> u32(16)) & u32(1))) >> u32(16)
    return np.where(np.isnan(np.asarray(x, f32)), (b >> u32(16)) | u32(0x40), r).astype(u32)


def _med3(a, b, c):
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def _ieee_extreme(a, b, sign):
    """IEEE 754-2019 maximum (sign 1) / minimum (-1), gfx950's v_maximum3 / v_minimum3: a NaN
    operand gives a NaN (its payload is numpy's choice: untested), -0 < +0."""
    m = np.maximum(a, b) if sign > 0 else np.minimum(a, b)
    zeros = (a == 0) & (b == 0)
    neg = (np.signbit(a) & np.signbit(b)) if sign > 0 else (np.signbit(a) | np.signbit(b))
    return np.where(zeros, np.where(neg, a.dtype.type(-0.0), a.dtype.type(0.0)), m)


def _fmed3(a, b, c):
    return np.fmax(np.fmin(a, b), np.fmin(np.fmax(a, b), c))


def _ffbh(a):
    a = np.asarray(a, u32)
    n = np.where(a == 0, u32(0xFFFFFFFF), u32(31) - np.floor(np.log2(np.maximum(a, 1).astype(f64))).astype(u32))
    return n.astype(u32)


def _ffbl(a):
    a = np.asarray(a, u32)
    low = (a & (~a + u32(1))).astype(f64)
    return np.where(a == 0, u32(0xFFFFFFFF), np.log2(np.maximum(low, 1)).astype(u32))


def _bfe_u(a, b, c):
    w = c & u32(31)
    return np.where(w == 0, u32(0), (a >> (b & u32(31))) & ((u32(1) << w) - u32(1)))


def _bfe_i(a, b, c):
    w = (c & u32(31)).astype(i32)
    x = _bfe_u(a, b, c).astype(i32)
    sh = np.where(w == 0, 0, 32 - w).astype(i32)
    return np.where(w == 0, 0, (x << sh) >> sh).astype(i32)


def _alignbit(a, b, c):
    x = (np.asarray(a, u64) << u64(32)) | np.asarray(b, u64)
    return (x >> (np.asarray(c, u64) & u64(31))).astype(u32)


def _perm(a, b, c):
    x = (np.asarray(a, u64) << u64(32)) | np.asarray(b, u64)
    a, b, c = np.asarray(a, u32), np.asarray(b, u32), np.asarray(c, u32)
    out = np.zeros(np.broadcast(a, b, c).shape, u32)
    for k in range(4):
        s = (c >> u32(8 * k)) & u32(0xFF)
        byte = ((x >> (u64(8) * np.minimum(s, 7).astype(u64))) & u64(0xFF)).astype(u32)
        sign = [(b >> u32(15)) & 1, (b >> u32(31)) & 1, (a >> u32(15)) & 1, (a >> u32(31)) & 1]
        for j in range(4):
            byte = np.where(s == 8 + j, sign[j] * u32(0xFF), byte)
        byte = np.where(s == 12, u32(0), np.where(s > 12, u32(0xFF), byte))
        out |= byte.astype(u32) << u32(8 * k)
    return out


def _frexp_mant(a):
    m, e = np.frexp(a)
    return np.where(np.isfinite(a), m, a).astype(a.dtype)


def _frexp_exp(a):
    m, e = np.frexp(a)
    return np.where(np.isfinite(a), e, 0).astype(i32)


def _rcp(a):
    return (a.dtype.type(1) / a) if isinstance(a, np.ndarray) else np.reciprocal(a)


def _i24(x):
    return ((np.asarray(x, u32) << u32(8)).view(i32) >> 8).astype(i64)


_OPS = {
    # float32
    "v_add_f32": ("f32", "f32 f32", np.add),
    "v_sub_f32": ("f32", "f32 f32", np.subtract),
    "v_subrev_f32": ("f32", "f32 f32", lambda a, b, out=None: np.subtract(b, a, out=out)),
    "v_mul_f32": ("f32", "f32 f32", np.multiply),
    "v_mul_legacy_f32": ("f32", "f32 f32", lambda a, b: np.where((a == 0) | (b == 0), f32(0), a * b)),
    "v_min_f32": ("f32", "f32 f32", np.fmin), "v_max_f32": ("f32", "f32 f32", np.fmax),
    "v_fma_f32": ("f32", "f32 f32 f32", fma32),
    "v_fmac_f32": ("f32", "f32 f32 f32", fma32),           # src2 = dst, added at decode
    "v_fmamk_f32": ("f32", "f32 f32 f32", fma32),
    "v_fmaak_f32": ("f32", "f32 f32 f32", fma32),
    "v_mac_f32": ("f32", "f32 f32 f32", lambda a, b, c: a * b + c),
    "v_mad_f32": ("f32", "f32 f32 f32", lambda a, b, c: a * b + c),
    "v_madmk_f32": ("f32", "f32 f32 f32", lambda a, k, b: a * k + b),
    "v_madak_f32": ("f32", "f32 f32 f32", lambda a, b, k: a * b + k),
    "v_min3_f32": ("f32", "f32 f32 f32", lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_max3_f32": ("f32", "f32 f32 f32", lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_maximum3_f32": ("f32", "f32 f32 f32", lambda a, b, c: _ieee_extreme(_ieee_extreme(a, b, 1), c, 1)),
    "v_minimum3_f32": ("f32", "f32 f32 f32", lambda a, b, c: _ieee_extreme(_ieee_extreme(a, b, -1), c, -1)),
    "v_med3_f32": ("f32", "f32 f32 f32", _fmed3),
    "v_rcp_f32": ("f32", "f32", _rcp), "v_rcp_iflag_f32": ("f32", "f32", _rcp),
    "v_rsq_f32": ("f32", "f32", lambda a: f32(1) / np.sqrt(a)),
    "v_sqrt_f32": ("f32", "f32", np.sqrt),
    "v_exp_f32": ("f32", "f32", np.exp2), "v_log_f32": ("f32", "f32", np.log2),
    "v_sin_f32": ("f32", "f32", lambda a: np.sin(a * f32(2 * np.pi))),   # input in revolutions
    "v_cos_f32": ("f32", "f32", lambda a: np.cos(a * f32(2 * np.pi))),
    "v_fract_f32": ("f32", "f32", lambda a: np.minimum(a - np.floor(a), f32(0.99999994))),
    "v_trunc_f32": ("f32", "f32", np.trunc), "v_ceil_f32": ("f32", "f32", np.ceil),
    "v_floor_f32": ("f32", "f32", np.floor), "v_rndne_f32": ("f32", "f32", np.rint),
    "v_ldexp_f32": ("f32", "f32 i32", lambda a, b: np.ldexp(a, np.clip(b, -300, 300))),
    "v_frexp_mant_f32": ("f32", "f32", _frexp_mant), "v_frexp_exp_i32_f32": ("i32", "f32", _frexp_exp),
    "v_div_fixup_f32": ("f32", "f32 f32 f32", lambda q, d, n: n / d),
    "v_div_fmas_f32": ("f32", "f32 f32 f32", fma32),
    # float64
    "v_add_f64": ("f64", "f64 f64", np.add), "v_mul_f64": ("f64", "f64 f64", np.multiply),
    "v_fma_f64": ("f64", "f64 f64 f64", lambda a, b, c: np.float64(np.longdouble(a) * b + c)),
    "v_min_f64": ("f64", "f64 f64", np.fmin), "v_max_f64": ("f64", "f64 f64", np.fmax),
    "v_rcp_f64": ("f64", "f64", _rcp), "v_sqrt_f64": ("f64", "f64", np.sqrt),
    "v_rsq_f64": ("f64", "f64", lambda a: 1.0 / np.sqrt(a)),
    "v_ldexp_f64": ("f64", "f64 i32", lambda a, b: np.ldexp(a, np.clip(b, -3000, 3000))),
    "v_trunc_f64": ("f64", "f64", np.trunc), "v_floor_f64": ("f64", "f64", np.floor),
    "v_ceil_f64": ("f64", "f64", np.ceil), "v_rndne_f64": ("f64", "f64", np.rint),
    "v_fract_f64": ("f64", "f64", lambda a: np.minimum(a - np.floor(a), 0.9999999999999999)),
    "v_frexp_mant_f64": ("f64", "f64", _frexp_mant), "v_frexp_exp_i32_f64": ("i32", "f64", _frexp_exp),
    "v_div_fixup_f64": ("f64", "f64 f64 f64", lambda q, d, n: n / d),
    "v_div_fmas_f64": ("f64", "f64 f64 f64", lambda a, b, c: a * b + c),
    # float16
    "v_add_f16": ("f16", "f16 f16", lambda a, b: a + b), "v_sub_f16": ("f16", "f16 f16", lambda a, b: a - b),
    "v_subrev_f16": ("f16", "f16 f16", lambda a, b: b - a), "v_mul_f16": ("f16", "f16 f16", lambda a, b: a * b),
    "v_max_f16": ("f16", "f16 f16", np.fmax), "v_min_f16": ("f16", "f16 f16", np.fmin),
    "v_fma_f16": ("f16", "f16 f16 f16", lambda a, b, c: (a.astype(f64) * b + c).astype(f16)),
    "v_fmac_f16": ("f16", "f16 f16 f16", lambda a, b, c: (np.asarray(a, f64) * b + c).astype(f16)),
    "v_ldexp_f16": ("f16", "f16 i32", lambda a, b: np.ldexp(a.astype(f32), np.clip(b, -60, 60)).astype(f16)),
    "v_rcp_f16": ("f16", "f16", _rcp), "v_sqrt_f16": ("f16", "f16", np.sqrt),
    "v_exp_f16": ("f16", "f16", np.exp2), "v_log_f16": ("f16", "f16", np.log2),
    # conversions
    "v_cvt_f32_i32": ("f32", "i32", lambda a: np.asarray(a).astype(f32)),
    "v_cvt_f32_u32": ("f32", "u32", lambda a: np.asarray(a).astype(f32)),
    "v_cvt_i32_f32": ("i32", "f32", lambda a: _cvt_i(a, i32, -2**31, 2**31 - 1)),
    "v_cvt_u32_f32": ("u32", "f32", lambda a: _cvt_i(a, u32, 0, 2**32 - 1)),
    "v_cvt_i32_f64": ("i32", "f64", lambda a: _cvt_i(a, i32, -2**31, 2**31 - 1)),
    "v_cvt_u32_f64": ("u32", "f64", lambda a: _cvt_i(a, u32, 0, 2**32 - 1)),
    "v_cvt_flr_i32_f32": ("i32", "f32", lambda a: _cvt_i(np.floor(a), i32, -2**31, 2**31 - 1)),
    "v_cvt_rpi_i32_f32": ("i32", "f32", lambda a: _cvt_i(np.floor(a + f32(0.5)), i32, -2**31, 2**31 - 1)),
    "v_cvt_f64_f32": ("f64", "f32", lambda a: np.asarray(a).astype(f64)),
    "v_cvt_f32_f64": ("f32", "f64", lambda a: np.asarray(a).astype(f32)),
    "v_cvt_f64_i32": ("f64", "i32", lambda a: np.asarray(a).astype(f64)),
    "v_cvt_f64_u32": ("f64", "u32", lambda a: np.asarray(a).astype(f64)),
    "v_cvt_f16_f32": ("f16", "f32", lambda a: np.asarray(a).astype(f16)),
    "v_cvt_f32_f16": ("f32", "f16", lambda a: np.asarray(a).astype(f32)),
    "v_cvt_f16_u16": ("f16", "u16", lambda a: np.asarray(a).astype(f16)),
    "v_cvt_f16_i16": ("f16", "i16", lambda a: np.asarray(a).astype(f16)),
    "v_cvt_u16_f16": ("u16", "f16", lambda a: _cvt_i(a, u16, 0, 65535)),
    "v_cvt_i16_f16": ("i16", "f16", lambda a: _cvt_i(a, i16, -32768, 32767)),
    "v_cvt_pkrtz_f16_f32": ("u32", "f32 f32", lambda a, b: _pk16(_f16_rtz(a), _f16_rtz(b))),
    "v_cvt_pk_bf16_f32": ("u32", "f32 f32", lambda a, b: _bf16(a) | (_bf16(b) << u32(16))),
    "v_cvt_f32_bf16": ("u32", "bf16", lambda a: np.asarray(a, u32) << u32(16)),   # exact: bf16 is f32's top half
    # LFSR step, the ISA's pseudocode: D = (S << 1) ^ (S[31] ? 197 : 0) [CDNA4 ISA V_PRNG_B32]
    "v_prng_b32": ("u32", "u32", lambda a: (a << u32(1)) ^ np.where(a >> u32(31), u32(197), u32(0))),
    "v_cvt_pk_f16_f32": ("u32", "f32 f32",
                         lambda a, b: _pk16(np.asarray(a, f32).astype(f16), np.asarray(b, f32).astype(f16))),
    "v_cvt_pk_u16_u32": ("u32", "u32 u32", lambda a, b: np.minimum(a, 0xFFFF) | (np.minimum(b, 0xFFFF) << u32(16))),
    "v_cvt_pk_u8_f32": ("u32", "f32 u32 u32", lambda a, s, c: _pk_u8(a, s, c)),
    **{f"v_cvt_f32_ubyte{k}": ("f32", "u32", (lambda k: lambda a: ((a >> u32(8 * k)) & u32(0xFF)).astype(f32))(k))
       for k in range(4)},
    "v_pack_b32_f16": ("u32", "f16 f16", lambda a, b: _pk16(a, b)),
    # integer
    "v_mov_b32": ("u32", "u32", lambda a: a), "v_accvgpr_read_b32": ("u32", "u32", lambda a: a),
    "v_accvgpr_write_b32": ("u32", "u32", lambda a: a), "v_accvgpr_mov_b32": ("u32", "u32", lambda a: a),
    "v_mov_b64": ("u64", "u64", lambda a: a),
    "v_not_b32": ("u32", "u32", np.invert), "v_bfrev_b32": ("u32", "u32", lambda a: _bitrev(a)),
    "v_ffbh_u32": ("u32", "u32", _ffbh),
    "v_ffbh_i32": ("u32", "i32", lambda a: _ffbh((a ^ (a >> 31)).view(u32) if isinstance(a, np.ndarray)
                                                 else u32(a ^ (a >> 31)))),
    "v_ffbl_b32": ("u32", "u32", _ffbl),
    "v_add_u32": ("u32", "u32 u32", np.add), "v_sub_u32": ("u32", "u32 u32", np.subtract),
    "v_subrev_u32": ("u32", "u32 u32", lambda a, b, out=None: np.subtract(b, a, out=out)),
    "v_add_i32": ("i32", "i32 i32", np.add), "v_sub_i32": ("i32", "i32 i32", np.subtract),
    "v_mul_lo_u32": ("u32", "u32 u32", np.multiply),
    "v_mul_hi_u32": ("u32", "u32 u32", lambda a, b: ((np.asarray(a, u64) * b) >> u64(32)).astype(u32)),
    "v_mul_hi_i32": ("i32", "i32 i32", lambda a, b: ((np.asarray(a, i64) * b) >> 32).astype(i32)),
    "v_mul_u32_u24": ("u32", "u32&0xFFFFFF u32&0xFFFFFF", np.multiply),
    "v_mul_hi_u32_u24": ("u32", "u64&0xFFFFFF u64&0xFFFFFF", lambda a, b: ((a * b) >> u64(32)).astype(u32)),
    "v_mul_i32_i24": ("u32", "u32 u32", lambda a, b: (_i24(a) * _i24(b)).astype(u32)),
    "v_mad_u32_u24": ("u32", "u32&0xFFFFFF u32&0xFFFFFF u32", lambda a, b, c, out=None: np.add(a * b, c, out=out)),
    "v_mad_i32_i24": ("u32", "u32 u32 u32", lambda a, b, c: (_i24(a) * _i24(b) + c).astype(u32)),
    "v_lshlrev_b32": ("u32", "u32&31 u32", lambda a, b, out=None: np.left_shift(b, a, out=out)),
    "v_lshrrev_b32": ("u32", "u32&31 u32", lambda a, b, out=None: np.right_shift(b, a, out=out)),
    "v_ashrrev_i32": ("i32", "i32&31 i32", lambda a, b, out=None: np.right_shift(b, a, out=out)),
    "v_lshlrev_b64": ("u64", "u64&63 u64", lambda a, b, out=None: np.left_shift(b, a, out=out)),
    "v_lshrrev_b64": ("u64", "u64&63 u64", lambda a, b, out=None: np.right_shift(b, a, out=out)),
    "v_ashrrev_i64": ("i64", "i64&63 i64", lambda a, b, out=None: np.right_shift(b, a, out=out)),
    "v_lshl_add_u64": ("u64", "u64 u64&7 u64", lambda a, s, c, out=None: np.add(a << s, c, out=out)),
    "v_and_b32": ("u32", "u32 u32", np.bitwise_and), "v_or_b32": ("u32", "u32 u32", np.bitwise_or),
    "v_xor_b32": ("u32", "u32 u32", np.bitwise_xor),
    "v_min_i32": ("i32", "i32 i32", np.minimum), "v_max_i32": ("i32", "i32 i32", np.maximum),
    "v_min_u32": ("u32", "u32 u32", np.minimum), "v_max_u32": ("u32", "u32 u32", np.maximum),
    "v_min3_i32": ("i32", "i32 i32 i32", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_i32": ("i32", "i32 i32 i32", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_u32": ("u32", "u32 u32 u32", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_u32": ("u32", "u32 u32 u32", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_med3_i32": ("i32", "i32 i32 i32", _med3), "v_med3_u32": ("u32", "u32 u32 u32", _med3),
    "v_bfe_u32": ("u32", "u32 u32 u32", _bfe_u), "v_bfe_i32": ("i32", "u32 u32 u32", _bfe_i),
    "v_bfi_b32": ("u32", "u32 u32 u32", lambda a, b, c: (a & b) | (~a & c)),
    "v_bfm_b32": ("u32", "u32&31 u32&31", lambda a, b: ((u32(1) << a) - u32(1)) << b),
    "v_alignbit_b32": ("u32", "u32 u32 u32", _alignbit),
    "v_alignbyte_b32": ("u32", "u32 u32 u32", lambda a, b, c: _alignbit(a, b, (np.asarray(c, u32) & u32(3)) * u32(8))),
    "v_perm_b32": ("u32", "u32 u32 u32", _perm),
    "v_lshl_add_u32": ("u32", "u32 u32&31 u32", lambda a, b, c, out=None: np.add(a << b, c, out=out)),
    "v_add_lshl_u32": ("u32", "u32 u32 u32&31", lambda a, b, c, out=None: np.left_shift(a + b, c, out=out)),
    "v_lshl_or_b32": ("u32", "u32 u32&31 u32", lambda a, b, c, out=None: np.bitwise_or(a << b, c, out=out)),
    "v_and_or_b32": ("u32", "u32 u32 u32", lambda a, b, c, out=None: np.bitwise_or(a & b, c, out=out)),
    "v_or3_b32": ("u32", "u32 u32 u32", lambda a, b, c, out=None: np.bitwise_or(a | b, c, out=out)),
    "v_xad_u32": ("u32", "u32 u32 u32", lambda a, b, c, out=None: np.add(a ^ b, c, out=out)),
    "v_add3_u32": ("u32", "u32 u32 u32", lambda a, b, c, out=None: np.add(a + b, c, out=out)),
    "v_bcnt_u32_b32": ("u32", "u32 u32", lambda a, b: np.bitwise_count(a).astype(u32) + b),
    # 16-bit integer
    "v_add_u16": ("u16", "u16 u16", lambda a, b: a + b), "v_sub_u16": ("u16", "u16 u16", lambda a, b: a - b),
    "v_mul_lo_u16": ("u16", "u16 u16", lambda a, b: a * b),
    "v_lshlrev_b16": ("u16", "u16 u16", lambda a, b: b << (a & u16(15))),
    "v_lshrrev_b16": ("u16", "u16 u16", lambda a, b: b >> (a & u16(15))),
    "v_ashrrev_i16": ("i16", "u16 i16", lambda a, b: b >> (a & u16(15)).astype(i16)),
    "v_max_u16": ("u16", "u16 u16", np.maximum), "v_min_u16": ("u16", "u16 u16", np.minimum),
    "v_max_i16": ("i16", "i16 i16", np.maximum), "v_min_i16": ("i16", "i16 i16", np.minimum),
}


def _bitrev(a):
    """Reverse the 32 bits of each element (scalar operands too, e.g. `v_bfrev_b32 v0, 1`)."""
    a = np.asarray(a, u32)
    bits = np.unpackbits(np.atleast_1d(a).astype("<u4").view(np.uint8), bitorder="little").reshape(-1, 32)
    return np.packbits(bits, bitorder="big").view(">u4").astype(u32).reshape(a.shape)


def _f16_rtz(a):
    a = np.asarray(a, f32)
    h = a.astype(f16)
    back = h.astype(f32)
    over = np.abs(back) > np.abs(a)
    h = np.where(over & np.isfinite(a), np.nextafter(h, f16(0)), h).astype(f16)
    return h


def _pk16(a, b):
    return _bits_u32(a, None) | (_bits_u32(b, None) << u32(16))


def _pk_u8(a, s, c):
    sh = (s & u32(3)) * u32(8)
    v = _cvt_i(np.rint(a), u32, 0, 255)
    return (c & ~(u32(0xFF) << sh)) | (v << sh)


# ---------------------------------------------------------------------------- DPP / SDWA

def _dpp_source(mods, n):
    """Per-lane source lane index (-1 = invalid) of a DPP control on an n-lane wave [ISA §6.5]."""
    l = np.arange(n)
    row_base, r = l & ~15, l & 15
    if "quad_perm" in mods:
        p = mods["quad_perm"]
        return (l & ~3) + np.array(p)[l & 3]
    for k, f in (("row_shl", lambda n: np.where(r + n < 16, l + n, -1)),
                 ("row_shr", lambda n: np.where(r - n >= 0, l - n, -1)),
                 ("row_ror", lambda n: row_base + ((r - n) & 15)),
                 ("row_share", lambda n: row_base + n), ("row_xmask", lambda n: row_base + (r ^ n)),   # gfx10+
                 ("wave_shl", lambda _: np.where(l + 1 < n, l + 1, -1)),
                 ("wave_shr", lambda _: np.where(l - 1 >= 0, l - 1, -1)),
                 ("wave_rol", lambda _: (l + 1) % n), ("wave_ror", lambda _: (l - 1) % n)):
        if k in mods:
            return f(mods[k])
    if "row_mirror" in mods:
        return row_base + 15 - r
    if "row_half_mirror" in mods:
        return (l & ~7) + 7 - (l & 7)
    if "row_bcast" in mods:
        n = mods["row_bcast"]
        if n == 15:   # lane 15 of each row feeds the next row
            return np.where(l >= 16, row_base - 1, -1)
        return np.where(l >= 32, 31, -1)   # row_bcast:31: lane 31 feeds rows 2 and 3
    raise UnsupportedInstruction(f"DPP control in {mods}")


def _dpp_wrap(ins, get, op_index):
    """Getter of DPP-permuted src0 + the lanes the instruction may write."""
    mods = ins.mods
    n = ins.prog.target.wave
    srcl = _dpp_source(mods, n)
    lane = np.arange(n)
    row_mask, bank_mask = mods.get("row_mask", 0xF), mods.get("bank_mask", 0xF)
    bound0 = bool(mods.get("bound_ctrl", 0)) or "bound_ctrl:0" in mods
    writable = ((row_mask >> (lane >> 4)) & 1).astype(bool) & ((bank_mask >> ((lane >> 2) & 3)) & 1).astype(bool)
    if "row_bcast" in mods:     # rows not fed by a broadcast keep their value
        writable &= srcl >= 0
    valid_src = srcl >= 0
    idx = np.where(valid_src, srcl, 0)

    def g(w):
        x = np.asarray(get(w))
        x = np.broadcast_to(x, (n,)) if x.ndim == 0 else x
        ok = valid_src & w.mask[idx]
        y = x[idx]
        if bound0:
            return np.where(ok, y, y.dtype.type(0)), writable
        return y, writable & ok
    return g


_SDWA_SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
             "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32)}


def _sdwa_src(ins, i, ty, sel):
    raw = R.src(ins, i, "u32")
    sh, width = _SDWA_SEL[sel]
    sext = ins.ops[i].sext or ty in ("i32", "i16")
    op = ins.ops[i]

    def g(w):
        x = np.asarray(raw(w), u32) >> u32(sh)
        if width < 32:
            x = x & u32((1 << width) - 1)
            if sext:
                x = ((x << u32(32 - width)).view(i32) >> (32 - width)).view(u32)
        if ty in ("f16", "bf16", "u16", "i16", "b16"):
            v = x.astype(u16).view({"f16": f16, "i16": i16}.get(ty, u16))
        else:
            v = x.view({"f32": f32, "i32": i32}.get(ty, u32))
        if ty in ("f32", "f16"):
            if op.abs:
                v = np.abs(v)
            if op.neg:
                v = -v
        return v
    return g


# ---------------------------------------------------------------------------- generic builder

_INT = {"u32": u32, "i32": i32, "u64": u64, "i64": i64}
# ufuncs whose results do not depend on the layout of out: numpy's strided and contiguous loops
# of fmin/fmax/sqrt/exp2/trunc/... treat signalling NaNs differently, so those never get out=.
_OUT_UFUNCS = (np.add, np.subtract, np.multiply, np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.invert)


def _low_bits(ins, i, get, m, ty):
    """Getter of the low bits (& m) of u32 source i (getter get) as type ty; a constant's is
    folded once. Values come in the flavour of their partners: array & 0-d array and numpy
    scalar & numpy scalar are numpy's fast pairs (a scalar with a 0-d array is slow)."""
    t, op = _INT[ty], ins.ops[i]
    if op.kind in ("const", "fconst"):
        sgpr_partner = any(o.kind in ("s", "scc") for o in ins.ops[1:] if o is not op)
        c = t(const_bits(op, "u32") & m) if sgpr_partner else np.array(const_bits(op, "u32") & m, t)
        return lambda w: c
    mask = np.array(m, u32) if op.kind in ("v", "a") else u32(m)
    if t is u32:
        return lambda w: get(w) & mask
    return lambda w: (get(w) & mask).astype(t)


def _omod_clamp(ins, dty):
    mods = ins.mods
    scale = 2.0 if mods.get("mul") == 2 else 4.0 if mods.get("mul") == 4 else 0.5 if mods.get("div") == 2 else None
    clamp = bool(mods.get("clamp"))
    if dty not in ("f32", "f16", "f64") or (scale is None and not clamp):
        return None
    t = {"f32": f32, "f16": f16, "f64": f64}[dty]

    def post(x):
        if scale is not None:
            x = x * t(scale)
        if clamp:   # clamp to [0, 1]; NaN -> 0 (dx10_clamp)
            x = np.where(np.isnan(x), t(0), np.clip(x, t(0), t(1)))
        return x
    return post


def build_valu(ins, dty, stys, fn, first_src=1):
    """Generic VALU builder: sources ins.ops[first_src:] typed by stys, one result of type dty
    into ins.ops[0]; handles VOP3 op_sel (16-bit), SDWA, DPP, clamp/omod."""
    stys = stys.split() if isinstance(stys, str) else list(stys)
    mods = ins.mods
    op_sel = mods.get("op_sel", [0] * 4)
    gets = []
    for k, ty in enumerate(stys):
        i = first_src + k
        ty, _, m = ty.partition("&")
        rty = "u32" if m else ty
        if ins.enc == "sdwa" and ins.ops[i].kind in ("v", "a", "s"):
            g = _sdwa_src(ins, i, rty, mods.get(f"src{k}_sel", "DWORD"))
        else:
            g = R.src(ins, i, rty, hi=bool(op_sel[k]) if k < len(op_sel) else False)
        gets.append(_low_bits(ins, i, g, int(m, 0), ty) if m else g)
    dpp = None
    if ins.enc == "dpp":
        dpp = _dpp_wrap(ins, gets[0], first_src)
        ins.per_wave = True     # lane permutations within a wave
    post = _omod_clamp(ins, dty)
    hi_dst = dty in ("f16", "u16", "i16") and len(op_sel) > len(stys) and bool(op_sel[-1])
    if dty in ("f16", "u16", "i16") and not hi_dst and ins.enc != "sdwa":
        # 16-bit results write the low half and zero the high half (gfx9 VOP1/2/3 without op_sel)
        put32 = R.dst(ins, 0, "u32")
        put = lambda w, v: put32(w, _bits_u32(v, dty))  # noqa: E731
    else:
        put = R.dst(ins, 0, dty, hi=hi_dst)
    if ins.enc == "sdwa":
        put = _sdwa_dst(ins, dty, put)
    if dpp is not None:
        rest = gets[1:]
        base_put = R.dst(ins, 0, dty)

        def run(w):
            x0, writable = dpp(w)
            r = fn(x0, *[g(w) for g in rest])
            if post:
                r = post(r)
            saved = w.mask
            w.mask, full = saved & writable, w.full
            w.full = False
            try:
                base_put(w, _lanewise(w, r))
            finally:
                w.mask, w.full = saved, full
        return run
    if post is not None:
        inner = fn
        fn = lambda *a: post(inner(*a))  # noqa: E731
    # With EXEC full, an fn that takes out= writes straight into the destination column
    # (sources read, then the destination's race check, as put would do).
    col = (R.dst_col(ins, 0, dty) if post is None and ins.enc != "sdwa" and dty not in ("f16", "u16", "i16")
           and (fn in _OUT_UFUNCS or not isinstance(fn, np.ufunc) and "out" in inspect.signature(fn).parameters)
           else None)
    g0, g1, g2 = (gets + [None] * 3)[:3]
    if len(gets) == 1:
        if col:
            return lambda w: fn(g0(w), out=col(w)) if w.full else put(w, fn(g0(w)))
        return lambda w: put(w, fn(g0(w)))
    if len(gets) == 2:
        if col:
            return lambda w: fn(g0(w), g1(w), out=col(w)) if w.full else put(w, fn(g0(w), g1(w)))
        return lambda w: put(w, fn(g0(w), g1(w)))
    if len(gets) == 3:
        if col:
            return lambda w: fn(g0(w), g1(w), g2(w), out=col(w)) if w.full else put(w, fn(g0(w), g1(w), g2(w)))
        return lambda w: put(w, fn(g0(w), g1(w), g2(w)))
    return lambda w: put(w, fn(*[g(w) for g in gets]))


def _sdwa_dst(ins, dty, put):
    sel = ins.mods.get("dst_sel", "DWORD")
    unused = ins.mods.get("dst_unused", "UNUSED_PAD")
    if sel == "DWORD":
        return put
    sh, width = _SDWA_SEL[sel]
    old = R.src(ins, 0, "u32")
    put32 = R.dst(ins, 0, "u32")
    fmask = u32(((1 << width) - 1) << sh)

    def p(w, v):
        v = (_bits_u32(v, dty) << u32(sh)) & fmask
        if unused == "UNUSED_PRESERVE":
            v = v | (np.asarray(old(w), u32) & ~fmask)
        elif unused == "UNUSED_SEXT" and sh + width < 32:
            top = (v >> u32(sh + width - 1)) & u32(1)
            v = v | np.where(top != 0, ~u32(((1 << (sh + width)) - 1)), u32(0))
        put32(w, v)
    return p


for _n, (_d, _s, _f) in _OPS.items():
    handler(_n)(lambda ins, d=_d, s=_s, f=_f: build_valu(ins, d, s, f))


@handler("v_fmac_f32", "v_mac_f32", "v_fmac_f16", "v_fmac_f64")
def _fmac(ins):
    ins.ops = ins.ops[:3] + [ins.ops[0]]   # accumulate into the destination
    d, s, f = _OPS.get(ins.base, ("f64", "f64 f64 f64", lambda a, b, c: np.float64(np.longdouble(a) * b + c)))
    return build_valu(ins, d, s, f)


@handler("v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32")
def _mbcnt(ins):
    """Count of mask bits below the lane (lanes 0-31 from the low half, 32-63 from the high)."""
    hi = "_hi_" in ins.base
    masks = (_HI_MASKS if hi else _LO_MASKS)[:ins.prog.target.wave]
    sh = u64(32 if hi else 0)
    m, b, put = R.src(ins, 1, "u32"), R.src(ins, 2, "u32"), R.dst(ins, 0, "u32")

    def run(w):
        mk = masks if w.k == 1 else masks[w.lane]
        put(w, np.bitwise_count((np.asarray(m(w), u64) << sh) & mk).astype(u32) + b(w))
    return run


@handler("v_nop")
def _vnop(ins):
    return lambda w: None


@handler("v_swap_b32")
def _swap(ins):
    a, b = R.src(ins, 0), R.src(ins, 1)
    pa, pb = R.dst(ins, 0), R.dst(ins, 1)

    def run(w):
        x, y = a(w).copy(), b(w).copy()
        pa(w, y)
        pb(w, x)
    return run


@handler("v_permlane16_swap_b32", "v_permlane32_swap_b32")
def _permlane_swap(ins):
    """VDST's odd rows of 16 lanes (permlane32: its upper 32 lanes) trade values with SRC0's even
    rows (lower 32 lanes), lane for lane; the other rows keep theirs (CDNA4 ISA; LLVM's
    lowering of amdgpu.permlane_swap relies on it). EXEC masks the writes. Without fi, an active
    lane whose partner is inactive is left undefined by what is public: the emulator raises."""
    span = 16 if ins.base == "v_permlane16_swap_b32" else 32
    vdst, src0 = R.src(ins, 0, "b32"), R.src(ins, 1, "b32")
    put_vdst, put_src0 = R.dst(ins, 0, "b32"), R.dst(ins, 1, "b32")
    fetch_inactive = bool(ins.mods.get("fi"))

    def run(w):
        if span >= w.T.wave:
            raise UnsupportedInstruction(f"{ins.base} on wave{w.T.wave}: no upper half to swap with ({ins.where()})")
        odd = (w.lane // span) % 2 == 1
        partner = np.arange(w.n) + np.where(odd, -span, span)
        if not (fetch_inactive or w.full) and (w.mask & ~w.mask[partner]).any():
            raise EmulatorFault(f"{ins.where()}: an active lane's partner lane is inactive and fi is off; "
                                "the ISA documents no value for it")
        x, y = _lanewise(w, vdst(w)), _lanewise(w, src0(w))   # views of the registers: read both first
        new_vdst, new_src0 = np.where(odd, y[partner], x), np.where(odd, y, x[partner])
        put_vdst(w, new_vdst)
        put_src0(w, new_src0)
    return run


# ---------------------------------------------------------------------------- carries, cndmask, cmp

_U32SH = np.array(32, u64)


def _lanewise(w, x):
    """x (array [w.n] or scalar) as an array [w.n] (np.broadcast_to takes microseconds)."""
    return x if getattr(x, "ndim", 0) else np.full(w.n, x)


def _lanebits(ins, i):
    """Getter of a lane-mask operand (SGPR pair / vcc / constant) as bool [w.n]."""
    g = R.src(ins, i, "u64")

    def get(w):
        x = g(w)
        if x.ndim == 0:
            return R.lanes_of(w, int(x))
        return ((x >> w.lane.astype(u64)) & u64(1)).astype(bool)   # per-wave masks (PerWave SGPRs)
    return get


def _sdst_bits(ins, i):
    """Setter of a lane mask into an SGPR pair from bool [w.n]; inactive lanes write 0."""
    put = R.sdst(ins, i, ins.prog.target.wave)
    return lambda w, b: put(w, R.wave_bits(w, b & w.mask))


@handler("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_addc_co_u32", "v_subb_co_u32",
         "v_subbrev_co_u32")
def _carry(ins):
    base = ins.base
    a, b = R.src(ins, 2, "u32"), R.src(ins, 3, "u32")
    cin = _lanebits(ins, 4) if "addc" in base or "subb" in base else None
    put, cout = R.dst(ins, 0, "u32"), _sdst_bits(ins, 1)
    if "rev" in base:
        a, b = b, a
    add = "add" in base

    def run(w):
        x, y = np.asarray(a(w), u64), np.asarray(b(w), u64)
        r = x + y if add else x - y
        if cin:
            c = cin(w).astype(u64)
            r = r + c if add else r - c
        cout(w, _lanewise(w, (r >> _U32SH) != 0))   # first: it may raise Split
        put(w, r.astype(u32))
    return run


@handler("v_mad_u64_u32", "v_mad_i64_i32")
def _mad64(ins):
    signed = "i64" in ins.base
    a, b = R.src(ins, 2, "i32" if signed else "u32"), R.src(ins, 3, "i32" if signed else "u32")
    c = R.src(ins, 4, "i64" if signed else "u64")
    put, cout = R.dst(ins, 0, "u64"), _sdst_bits(ins, 1)

    def run(w):
        if signed:
            r = np.asarray(a(w), i64) * np.asarray(b(w), i64) + c(w)
            cout(w, np.zeros(w.n, bool))   # overflow flag not modelled (never read in practice)
            put(w, r.view(u64) if isinstance(r, np.ndarray) else np.int64(r).view(u64))
        else:
            x = np.asarray(a(w), u64) * np.asarray(b(w), u64)
            r = x + c(w)
            cout(w, _lanewise(w, r < x))   # first: it may raise Split
            put(w, r)
    return run


@handler("v_cndmask_b32")
def _cndmask(ins):
    # VOP3 neg/abs on v_cndmask act on the f32 sign bit (LLVM folds fneg into it), so read as f32.
    a, b, m = R.src(ins, 1, "f32"), R.src(ins, 2, "f32"), _lanebits(ins, 3)
    put = R.dst(ins, 0, "u32")
    return lambda w: put(w, np.where(m(w), np.asarray(b(w), f32), np.asarray(a(w), f32)).view(u32))


@handler("v_div_scale_f32", "v_div_scale_f64")
def _div_scale(ins):
    # No pre-scaling: v_div_fixup computes the exact quotient, so only VCC (the fmas scale
    # request) is produced, always 0. [ISA: V_DIV_SCALE; simplified]
    ty = "f64" if ins.base.endswith("64") else "f32"
    a, put, vcc = R.src(ins, 2, ty), R.dst(ins, 0, ty), _sdst_bits(ins, 1)

    def run(w):
        put(w, a(w))
        vcc(w, np.zeros(w.n, bool))
    return run


_FCMP = {"f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "lt": np.less, "eq": np.equal,
         "le": np.less_equal, "gt": np.greater, "lg": lambda a, b: (a < b) | (a > b), "ge": np.greater_equal,
         "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)), "u": lambda a, b: np.isnan(a) | np.isnan(b),
         "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
         "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
         "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool)}
_ICMP = {"f": _FCMP["f"], "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
         "ne": np.not_equal, "ge": np.greater_equal, "t": _FCMP["tru"]}


def _class(x, m):
    """v_cmp_class: bit per class: 0 sNaN, 1 qNaN, 2 -inf, 3 -norm, 4 -denorm, 5 -0, 6 +0,
    7 +denorm, 8 +norm, 9 +inf."""
    x = np.asarray(x)
    fi = np.finfo(x.dtype)
    bits = x.view({2: u16, 4: u32, 8: u64}[x.dtype.itemsize])
    quiet_bit = {2: 9, 4: 22, 8: 51}[x.dtype.itemsize]
    nan = np.isnan(x)
    q = nan & (((bits >> type(bits.flat[0])(quiet_bit)) & 1) == 1)
    neg = np.signbit(x)
    ax = np.abs(x)
    inf, zero = np.isinf(x), ax == 0
    den = ~zero & (ax < fi.tiny) & ~nan
    norm = ~nan & ~inf & ~zero & ~den
    classes = [nan & ~q, q, inf & neg, norm & neg, den & neg, zero & neg, zero & ~neg, den & ~neg,
               norm & ~neg, inf & ~neg]
    m = np.asarray(m, u32)
    out = np.zeros(x.shape, bool)
    for k, c in enumerate(classes):
        out |= c & (((m >> u32(k)) & u32(1)) == 1)
    return out


def _build_cmp(ins, f, ty, cmpx):
    a, b = R.src(ins, 1, ty), R.src(ins, 2, "u32" if f is _class else ty)
    if ins.enc == "sdwa":
        sel = ins.mods
        a = _sdwa_src(ins, 1, ty, sel.get("src0_sel", "DWORD"))
        b = _sdwa_src(ins, 2, ty, sel.get("src1_sel", "DWORD"))
    if ins.ops[0].kind != "s":
        raise UnsupportedInstruction("VOPC destination must be an SGPR pair / vcc")
    put = R.sdst(ins, 0, ins.prog.target.wave)

    def run(w):
        r = _lanewise(w, f(a(w), b(w))) & w.mask
        bits = R.wave_bits(w, r)
        if cmpx:
            w.set_exec(bits)
        put(w, bits)
    return run


_CMP_TYPES = {"f16": _FCMP, "f32": _FCMP, "f64": _FCMP, "i16": _ICMP, "u16": _ICMP, "i32": _ICMP,
              "u32": _ICMP, "i64": _ICMP, "u64": _ICMP}
for _t, _tab in _CMP_TYPES.items():
    for _c, _f in list(_tab.items()) + ([("class", _class)] if _t[0] == "f" else []):
        for _x in ("", "x"):
            handler(f"v_cmp{_x}_{_c}_{_t}")(lambda ins, f=_f, t=_t, x=_x: _build_cmp(ins, f, t, bool(x)))


# ---------------------------------------------------------------------------- lane ops

@handler("v_readfirstlane_b32")
def _readfirstlane(ins):
    a, put = R.src(ins, 1, "u32"), R.sdst(ins, 0)

    def run(w):
        x, e = np.asarray(a(w)), w.exec
        if e.__class__ is int:
            put(w, R.wave_value(w, x, (e & -e).bit_length() - 1 if e else 0))
        else:        # EXEC differs between the waves of the unit: each wave's first active lane
            wl = w.T.wave
            put(w, PerWave.of([int(x[i * wl + ((v & -v).bit_length() - 1 if v else 0)]) for i, v in enumerate(e.v)]))
    return run


@handler("v_readlane_b32")
def _readlane(ins):
    a, l, put = R.src(ins, 1, "u32"), R.src(ins, 2, "u32"), R.sdst(ins, 0)

    def run(w):
        put(w, R.wave_value(w, np.asarray(a(w)), R.wave_value(w, l(w), 0) % w.T.wave))
    return run


@handler("v_writelane_b32")
def _writelane(ins):
    a, l = R.src(ins, 1, "u32"), R.src(ins, 2, "u32")
    r = R.vidx(ins, ins.ops[0])

    def run(w):   # ignores EXEC; the lane of every wave of a lockstep unit
        x = a(w)
        w.V[r, R.wave_value(w, l(w), 0) % w.T.wave::w.T.wave] = x if x.ndim == 0 else x[::w.T.wave]
    return run


# ---------------------------------------------------------------------------- packed math

def _pk_src(ins, i, ty, k):
    """Getter -> (lo, hi) operands of a VOP3P source, per op_sel / op_sel_hi / neg_lo / neg_hi."""
    mods = ins.mods
    op_sel = mods.get("op_sel", [0, 0, 0])
    op_sel_hi = mods.get("op_sel_hi", [1, 1, 1])
    neg_lo, neg_hi = mods.get("neg_lo", [0, 0, 0]), mods.get("neg_hi", [0, 0, 0])
    op = ins.ops[i]
    if ty == "f32":   # packed f32: a 64-bit register pair, op_sel picks the dword
        if op.kind in ("v", "a", "s"):
            g0 = R.src(ins, i, "f32")
            hi_op = _shift_op(op)
            ins.ops.append(hi_op)
            g1 = R.src(ins, len(ins.ops) - 1, "f32")
            parts = (g0, g1)
        else:
            c = R.src(ins, i, "f32")
            parts = (c, c)
        lo_g, hi_g = parts[op_sel[k]], parts[op_sel_hi[k]]
    else:
        raw = R.src(ins, i, "u32")
        t = {"f16": f16, "bf16": u16, "u16": u16, "i16": i16}[ty]
        half = lambda g, h: (lambda w: (np.asarray(g(w), u32) >> u32(16 * h)).astype(u16).view(t))  # noqa: E731
        lo_g, hi_g = half(raw, op_sel[k]), half(raw, op_sel_hi[k])
        if op.kind in ("const", "fconst"):   # an inline constant feeds both halves
            c = R.src(ins, i, ty)
            lo_g = hi_g = c
    nl, nh = (k < len(neg_lo) and neg_lo[k]), (k < len(neg_hi) and neg_hi[k])
    lo = (lambda w: -lo_g(w)) if nl else lo_g
    hi = (lambda w: -hi_g(w)) if nh else hi_g
    return lo, hi


def _shift_op(op):
    from .isa import Operand
    o = Operand(op.kind, op.index + 1, 1, text=op.text + "+1")
    return o


_PK = {
    "v_pk_fma_f32": ("f32", 3, fma32), "v_pk_mul_f32": ("f32", 2, lambda a, b: a * b),
    "v_pk_add_f32": ("f32", 2, lambda a, b: a + b), "v_pk_mov_b32": ("f32", 2, None),
    "v_pk_add_f16": ("f16", 2, lambda a, b: a + b), "v_pk_mul_f16": ("f16", 2, lambda a, b: a * b),
    "v_pk_fma_f16": ("f16", 3, lambda a, b, c: (np.asarray(a, f64) * b + c).astype(f16)),
    "v_pk_max_f16": ("f16", 2, np.fmax), "v_pk_min_f16": ("f16", 2, np.fmin),
    "v_pk_add_u16": ("u16", 2, lambda a, b: a + b), "v_pk_sub_u16": ("u16", 2, lambda a, b: a - b),
    "v_pk_mul_lo_u16": ("u16", 2, lambda a, b: a * b),
    "v_pk_lshlrev_b16": ("u16", 2, lambda a, b: b << (a & u16(15))),
    "v_pk_lshrrev_b16": ("u16", 2, lambda a, b: b >> (a & u16(15))),
    "v_pk_max_u16": ("u16", 2, np.maximum), "v_pk_min_u16": ("u16", 2, np.minimum),
    "v_pk_max_i16": ("i16", 2, np.maximum), "v_pk_min_i16": ("i16", 2, np.minimum),
    "v_pk_add_i16": ("i16", 2, lambda a, b: a + b), "v_pk_sub_i16": ("i16", 2, lambda a, b: a - b),
}


def _build_pk(ins, ty, n, fn):
    if ins.base == "v_pk_mov_b32":   # dst.lo = src0[op_sel[0]], dst.hi = src1[op_sel[1]]
        sel = ins.mods.get("op_sel", [0, 0])
        ins.mods["op_sel_hi"] = [sel[1], sel[1], 1]
        ins.mods["op_sel"] = [sel[0], sel[0], 0]
        lo, _ = _pk_src(ins, 1, "f32", 0)
        _, hi = _pk_src(ins, 2, "f32", 1)
        srcs = [(lo, hi)]
        fn = lambda a: a  # noqa: E731
    else:
        srcs = [_pk_src(ins, 1 + k, ty, k) for k in range(n)]
    post = _omod_clamp(ins, ty)
    if ty == "f32":
        put = R.dst(ins, 0, "u64")
        pack = lambda lo, hi: (np.asarray(lo, f32).view(u32).astype(u64)  # noqa: E731
                               | (np.asarray(hi, f32).view(u32).astype(u64) << u64(32)))
    else:
        put, pack = R.dst(ins, 0, "u32"), _pk16

    def run(w):
        lo = fn(*[s[0](w) for s in srcs])
        hi = fn(*[s[1](w) for s in srcs])
        if post:
            lo, hi = post(lo), post(hi)
        put(w, pack(lo, hi))
    return run


for _n, (_t, _k, _f) in _PK.items():
    handler(_n)(lambda ins, t=_t, k=_k, f=_f: _build_pk(ins, t, k, f))


@handler("v_fma_mix_f32", "v_mad_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16")
def _fma_mix(ins):
    """Sources are f32, or f16 (half op_sel[i]) when op_sel_hi[i] = 1 [ISA V_FMA_MIX_F32]."""
    op_sel = ins.mods.get("op_sel", [0, 0, 0])
    op_sel_hi = ins.mods.get("op_sel_hi", [0, 0, 0])
    gets = []
    for k in range(3):
        if op_sel_hi[k]:
            g = R.src(ins, 1 + k, "f16", hi=bool(op_sel[k]))
            gets.append(lambda w, g=g: np.asarray(g(w), f32))
        else:
            gets.append(R.src(ins, 1 + k, "f32"))
    post = _omod_clamp(ins, "f32")
    if ins.base.endswith("f32"):
        put = R.dst(ins, 0, "f32")
        conv = lambda r: r  # noqa: E731
    else:
        put = R.dst(ins, 0, "f16", hi=ins.base.endswith("hi_f16"))
        conv = lambda r: np.asarray(r, f32).astype(f16)  # noqa: E731

    def run(w):
        r = fma32(*[g(w) for g in gets])
        put(w, conv(post(r) if post else r))
    return run


@handler("v_dot2_f32_f16", "v_dot2c_f32_f16", "v_dot2_f32_bf16", "v_dot2c_f32_bf16")
def _dot2(ins):
    bf = "bf16" in ins.base
    if ins.base.startswith("v_dot2c"):
        ins.ops = ins.ops[:3] + [ins.ops[0]]
    a, b, c = R.src(ins, 1, "u32"), R.src(ins, 2, "u32"), R.src(ins, 3, "f32")
    put = R.dst(ins, 0, "f32")

    def halves(x):
        x = np.asarray(x, u32)
        if bf:
            return (x << u32(16)).view(f32).astype(f64), (x & u32(0xFFFF0000)).view(f32).astype(f64)
        return (x & u32(0xFFFF)).astype(u16).view(f16).astype(f64), (x >> u32(16)).astype(u16).view(f16).astype(f64)

    def run(w):
        a0, a1 = halves(a(w))
        b0, b1 = halves(b(w))
        put(w, (a0 * b0 + a1 * b1 + np.asarray(c(w), f64)).astype(f32))
    return run


@handler("v_bitop3_b32", "v_bitop3_b16")
def _bitop3(ins):
    """Bitwise function given by an 8-bit truth table indexed by {S0, S1, S2} bits, S0 the
    most significant (LLVM's bitop3 constants: S0 = 0xF0, S1 = 0xCC, S2 = 0xAA)."""
    tt = ins.mods.get("bitop3", 0)
    ty = "u16" if ins.base.endswith("b16") else "u32"
    t = u16 if ty == "u16" else u32

    def fn(a, b, c):
        a, b, c = np.asarray(a, t), np.asarray(b, t), np.asarray(c, t)
        r = np.zeros(np.broadcast(a, b, c).shape, t)
        for k in range(8):
            if tt >> k & 1:
                r |= (a if k & 4 else ~a) & (b if k & 2 else ~b) & (c if k & 1 else ~c)
        return r
    return build_valu(ins, ty, [ty] * 3, fn)
