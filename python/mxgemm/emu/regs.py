"""Registers and operands: getters and setters that handlers build once per instruction.

Lane values are numpy arrays of one element per lane (``w.n`` lanes: the target's wave size);
SGPRs and constants are numpy scalars that broadcast against them. Every accessor checks,
in race mode, that no outstanding load still owns the register."""
from __future__ import annotations

from functools import lru_cache
from operator import attrgetter

import numpy as np

from . import race
from .isa import Instr, Split, UnsupportedInstruction, const_bits, f16, f32, f64, i16, i32, i64, u16, u32, u64
from .race import SKEY

_W64 = {"b64": u64, "u64": u64, "i64": i64, "f64": f64}
_W16 = {"b16": u16, "u16": u16, "i16": i16, "f16": f16, "bf16": u16}
_W32 = {"b32": u32, "u32": u32, "i32": i32, "f32": f32}
_FLOAT = ("f32", "f16", "f64")



def vidx(ins: Instr, op) -> int:
    """Column of a VGPR/AGPR operand in the unified register file."""
    return op.index + (ins.prog.meta.accum_offset if op.kind == "a" else 0)


def reg_keys(ins: Instr, i: int) -> tuple:
    op = ins.ops[i]
    if op.kind in ("v", "a"):
        r = vidx(ins, op)
        return tuple(range(r, r + op.count))
    if op.kind == "s":
        return tuple(range(SKEY + op.index, SKEY + op.index + op.count))
    return ()


def read_checked(ins, i, get):
    """Wrap getter get of operand i so that reading it with a load outstanding raises RaceError."""
    if not ins.prog.race:
        return get
    keys = reg_keys(ins, i)
    if not keys:
        return get

    def checked(w):
        if not w.pend.keys().isdisjoint(keys):   # C-level test; details only on a hit
            race.check_pending(w, keys, ins)
        return get(w)
    return checked


def _col_getter(ins, keys, view, c, t, what="reads"):
    """Getter of column c of a register-file view as dtype t (None: the view's own), with the
    race check folded in (keys: the operand's registers, () without race checking; what:
    "reads" or "overwrites")."""
    col = (slice(None), c)

    def get(w):
        if keys and w.pend and not w.pend.keys().isdisjoint(keys):   # C-level test; details only on a hit
            race.check_pending(w, keys, ins, what)
        x = view(w)[col]
        return x if t is None else x.view(t)
    return get


def src(ins: Instr, i: int, ty: str = "b32", hi: bool = False):
    """Getter w -> per-lane value of operand i as numpy type ty (array [w.n], numpy scalar (SGPR)
    or 0-d array (constant: ufuncs take those faster than scalars))."""
    op = ins.ops[i]
    k = op.kind
    if k in ("v", "a"):
        r = vidx(ins, op)
        if ty in _W64 and r % 2:
            t = _W64[ty]
            get = read_checked(ins, i, lambda w: (w.V[:, r].astype(u64)
                                                  | (w.V[:, r + 1].astype(u64) << u64(32))).view(t))
        else:
            keys, view, c, _, t = _vcol(ins, i, ty, hi)
            get = _col_getter(ins, keys, view, c, t)
    elif k == "s":
        r = op.index
        if ty in _W64:
            t = _W64[ty]
            get = lambda w: u64(w.S[r] | (w.S[r + 1] << 32)).view(t)  # noqa: E731
        elif ty in _W16:
            t, sh = _W16[ty], 16 if hi else 0
            get = lambda w: u16((w.S[r] >> sh) & 0xFFFF).view(t)  # noqa: E731
        else:
            t = _W32[ty]
            get = lambda w: u32(w.S[r]).view(t)  # noqa: E731
    elif k == "scc":
        get = lambda w: u32(w.scc)  # noqa: E731
    elif k in ("const", "fconst"):
        if ty in _W64:
            c = np.array(const_bits(op, ty if ty != "u64" else "b64"), u64).view(_W64[ty])
        elif ty in _W16:
            bits = const_bits(op, ty)
            bits = (bits >> 16 if hi and op.kind == "const" and bits > 0xFFFF else bits) & 0xFFFF
            c = np.array(bits, u16).view(_W16[ty])
        else:
            c = np.array(const_bits(op, ty), u32).view(_W32[ty])
        get = lambda w: c  # noqa: E731
    else:
        raise UnsupportedInstruction(f"operand {op.text!r} not readable as {ty}")
    if ty in _FLOAT and (op.abs or op.neg):
        inner, ab, ng = get, op.abs, op.neg

        def get(w):
            x = inner(w)
            if ab:
                x = np.abs(x)
            return -x if ng else x
    return get if k in ("v", "a") else read_checked(ins, i, get)


def _as(val, t):
    """Bit pattern of val (numpy array/scalar or Python number) as dtype t."""
    if isinstance(val, np.ndarray) or isinstance(val, np.generic):
        if val.dtype == t:
            return val
        if val.dtype.itemsize == np.dtype(t).itemsize:
            return val.view(t)
        return val.astype(t)
    return np.array(val).astype(t)


def _col_setter(ins, keys, view, c, t):
    """Setter of column c of a register-file view (V, V16 or V64), EXEC-masked, with the
    overwrite race check folded in."""
    col = (slice(None), c)

    def put(w, val):
        if keys and w.pend and not w.pend.keys().isdisjoint(keys):
            race.check_pending(w, keys, ins, "overwrites")
        if val.__class__ is not np.ndarray or val.dtype != t:
            val = _as(val, t)
        if w.full:
            view(w)[col] = val
        else:
            np.copyto(view(w)[col], val, where=w.mask)
    return put


def _vcol(ins: Instr, i: int, ty: str, hi: bool = False):
    """VGPR/AGPR operand i accessed as ty: (race keys, register-file view, column, the view's
    dtype, ty's dtype or None if the same)."""
    op = ins.ops[i]
    r = vidx(ins, op)
    keys = reg_keys(ins, i) if ins.prog.race else ()
    if ty in _W64:
        if r % 2:
            raise UnsupportedInstruction(f"odd 64-bit VGPR tuple {op.text}")
        view, c, t, own = "V64", r >> 1, _W64[ty], u64
    elif ty in _W16:
        view, c, t, own = "V16", 2 * r + (1 if hi else 0), _W16[ty], u16
    else:
        view, c, t, own = "V", r, _W32[ty], u32
    return keys, attrgetter(view), c, own, None if t is own else np.dtype(t)


def dst(ins: Instr, i: int, ty: str = "b32", hi: bool = False):
    """Setter (w, value) writing operand i (EXEC-masked for VGPRs)."""
    op = ins.ops[i]
    if op.kind in ("v", "a"):
        keys, view, c, own, _ = _vcol(ins, i, ty, hi)
        return _col_setter(ins, keys, view, c, own)
    if op.kind == "s":
        return sdst(ins, i, 64 if ty in _W64 else 32)
    raise UnsupportedInstruction(f"operand {op.text!r} not writable")


def dst_col(ins: Instr, i: int, ty: str = "b32"):
    """w -> the column of VGPR/AGPR destination i as numpy type ty, after its overwrite race
    check: a view to write every lane into (a ufunc's out=; callers check w.full). None if
    operand i is not a VGPR/AGPR."""
    if ins.ops[i].kind not in ("v", "a"):
        return None
    keys, view, c, _, t = _vcol(ins, i, ty)
    return _col_getter(ins, keys, view, c, t, "overwrites")


def _checked(put, keys, ins):
    """Wrap a setter so that overwriting a register with a load outstanding raises RaceError."""
    if not keys:
        return put

    def checked(w, val):
        if not w.pend.keys().isdisjoint(keys):
            race.check_pending(w, keys, ins, "overwrites")
        put(w, val)
    return checked


def sdst(ins: Instr, i: int, bits: int = 32):
    """Setter (w, python int) for a scalar destination (exec writes refresh the lane mask)."""
    op = ins.ops[i]
    r = op.index
    if r == ins.prog.target.null:
        return lambda w, val: None
    keys = reg_keys(ins, i) if ins.prog.race else ()
    EXEC = ins.prog.target.exec
    touches_exec = r <= EXEC + 1 and r + op.count > EXEC
    if bits == 64 or op.count == 2:
        def put(w, val):
            val = int(val)
            w.S[r] = val & 0xFFFFFFFF
            w.S[r + 1] = (val >> 32) & 0xFFFFFFFF
    else:
        def put(w, val):
            w.S[r] = int(val) & 0xFFFFFFFF
    if touches_exec:
        inner = put

        def put(w, val):
            inner(w, val)
            w.set_exec(w.S[EXEC] | (w.S[EXEC + 1] << 32))
    return _checked(put, keys, ins)


def src_vec(ins: Instr, i: int):
    """Getter w -> uint32 [w.n, count] copy of a register tuple (or broadcast constant/SGPRs)."""
    op = ins.ops[i]
    if op.kind in ("v", "a"):
        r, n = vidx(ins, op), op.count
        get = lambda w: w.V[:, r:r + n].copy()  # noqa: E731
    elif op.kind == "s":
        r, n = op.index, op.count
        get = lambda w: np.broadcast_to(np.array(w.S[r:r + n], u32), (w.n, n)).copy()  # noqa: E731
    else:
        c = const_bits(op, "b32")
        get = lambda w: np.full((w.n, 1), c, u32)  # noqa: E731
    return read_checked(ins, i, get)


def dst_vec(ins: Instr, i: int):
    op = ins.ops[i]
    r, n = vidx(ins, op), op.count
    keys = reg_keys(ins, i) if ins.prog.race else ()

    def put(w, val):
        if keys and not w.pend.keys().isdisjoint(keys):
            race.check_pending(w, keys, ins, "overwrites")
        if w.full:
            w.V[:, r:r + n] = val
        else:
            np.copyto(w.V[:, r:r + n], val, where=w.mask[:, None])
    return put


_LANE_BITS = {n: np.arange(n, dtype=u64) for n in (32, 64)}


def mask_of(x: int, n: int):
    """bool [n] of the lane mask x (bit l = lane l)."""
    return ((u64(x) >> _LANE_BITS[n]) & u64(1)).astype(bool)


def bits_of(b) -> int:
    """Lane mask (int, bit l = lane l) of bool [n]."""
    return int.from_bytes(np.packbits(b, bitorder="little").tobytes(), "little")


def lanes_of(w, x: int):
    """bool [w.n] of the per-wave lane mask x (the same in every wave of a lockstep unit);
    read-only, shared by every caller with the same mask."""
    return _lanes(x, w.T.wave, w.k)


@lru_cache(maxsize=1024)
def _lanes(x, wave, k):
    m = mask_of(x, wave)
    m = m if k == 1 else np.tile(m, k)
    m.flags.writeable = False
    return m


def wave_bits(w, b) -> int:
    """Per-wave lane mask of bool [w.n]; raises Split when the waves of a unit disagree."""
    on = np.count_nonzero(b)
    if on == 0 or on == w.n:   # the usual carry-out / compare results, without packing bits
        return on and w.T.full
    x = bits_of(b)
    if w.k == 1:
        return x
    wl = w.T.wave
    x0 = x & w.T.full
    if x != x0 * (((1 << (wl * w.k)) - 1) // w.T.full):   # x0 repeated k times
        raise Split()
    return x0


def wave_value(w, x, lane):
    """Python int of per-lane value x (array or scalar) in lane `lane` of each wave; raises
    Split when the waves of a unit disagree."""
    if np.ndim(x) == 0:
        return int(x)
    if w.k == 1:
        return int(x[lane])
    v = x[lane::w.T.wave]
    if np.count_nonzero(v != v[0]):
        raise Split()
    return int(v[0])
