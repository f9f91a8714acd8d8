"""Registers and operands: getters and setters that handlers build once per instruction.

Lane values are numpy arrays of one element per lane (``w.n`` lanes: the target's wave size);
SGPRs and constants are numpy scalars that broadcast against them. Every accessor checks,
in race mode, that no outstanding load still owns the register."""
from __future__ import annotations

from functools import lru_cache
from operator import attrgetter

import numpy as np

from . import race
from .isa import Instr, PerWave, Split, UnsupportedInstruction, const_bits, f16, f32, f64, i16, i32, i64, u16, u32, u64
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
    """Getter of register c of a register-file view (an index of V or V16: a register's lanes)
    as dtype t (None: the view's own), with the race check folded in (keys: the operand's
    registers, () without race checking; what: "reads" or "overwrites")."""
    def get(w):
        if keys and w.pend and not w.pend.keys().isdisjoint(keys):   # C-level test; details only on a hit
            race.check_pending(w, keys, ins, what)
        x = view(w)[c]
        return x if t is None else x.view(t)
    return get


def src(ins: Instr, i: int, ty: str = "b32", hi: bool = False):
    """Getter w -> per-lane value of operand i as numpy type ty (array [w.n], numpy scalar (SGPR)
    or 0-d array (constant: ufuncs take those faster than scalars))."""
    op = ins.ops[i]
    k = op.kind
    if k in ("v", "a"):
        r = vidx(ins, op)
        if ty in _W64:
            t = _W64[ty]

            def pair(w):     # registers r (low half) and r + 1 interleaved into 64-bit lanes
                x = np.empty((w.n, 2), u32)
                x[:, 0], x[:, 1] = w.V[r], w.V[r + 1]
                return x.view(t)[:, 0]
            get = read_checked(ins, i, pair)
        else:
            keys, view, c, _, t = _vcol(ins, i, ty, hi)
            get = _col_getter(ins, keys, view, c, t)
    elif k == "s":
        r = op.index
        if ty in _W64:
            t, c, f = _W64[ty], u64, lambda s: s(r) | (s(r + 1) << 32)
        elif ty in _W16:
            t, c, sh = _W16[ty], u16, 16 if hi else 0
            f = lambda s: (s(r) >> sh) & 0xFFFF  # noqa: E731
        else:
            t, c, f = _W32[ty], u32, None
        get = _sgpr_getter(r, f, c, t)
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


def _sgpr_getter(r, f, c, t):
    """Getter of f(s) (s: register number -> value; None: the value of s<r>) as numpy type c
    viewed as t: a scalar, or one value per lane when the waves of a lockstep unit hold
    different values (PerWave)."""
    direct = f is None
    f = f or (lambda s: s(r))

    def per_lane(w):
        S = w.S
        vals = [f(lambda j: PerWave.at(S[j], i)) for i in range(w.k)]
        return np.repeat(np.array(vals, c), w.T.wave).view(t)

    def get(w):
        try:
            return c(w.S[r]).view(t)
        except Split:
            return per_lane(w)

    def get_f(w):
        try:
            return c(f(w.S.__getitem__)).view(t)
        except Split:
            return per_lane(w)
    return get if direct else get_f


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
    """Setter of register c of a register-file view (an index of V or V16: a register's lanes),
    EXEC-masked, with the overwrite race check folded in."""
    def put(w, val):
        if keys and w.pend and not w.pend.keys().isdisjoint(keys):
            race.check_pending(w, keys, ins, "overwrites")
        if val.__class__ is not np.ndarray or val.dtype != t:
            val = _as(val, t)
        if w.full:
            view(w)[c] = val
        else:
            np.copyto(view(w)[c], val, where=w.mask)
    return put


def _pair_setter(ins, keys, r):
    """Setter of 64-bit lane values into registers r (low half) and r + 1, EXEC-masked."""
    def put(w, val):
        if keys and w.pend and not w.pend.keys().isdisjoint(keys):
            race.check_pending(w, keys, ins, "overwrites")
        x = np.broadcast_to(_as(val, u64), (w.n,))
        halves = (x & u64(0xFFFFFFFF)).astype(u32), (x >> u64(32)).astype(u32)
        if w.full:
            w.V[r], w.V[r + 1] = halves
        else:
            np.copyto(w.V[r], halves[0], where=w.mask)
            np.copyto(w.V[r + 1], halves[1], where=w.mask)
    return put


def _vcol(ins: Instr, i: int, ty: str, hi: bool = False):
    """32- or 16-bit VGPR/AGPR operand i accessed as ty: (race keys, register-file view, index
    of the register's lanes in it, the view's dtype, ty's dtype or None if the same)."""
    op = ins.ops[i]
    r = vidx(ins, op)
    keys = reg_keys(ins, i) if ins.prog.race else ()
    if ty in _W16:     # V16 [nvgpr, 2n]: lane l's low half at 2l, high half at 2l + 1
        view, c, t, own = "V16", (r, slice(1 if hi else 0, None, 2)), _W16[ty], u16
    else:
        view, c, t, own = "V", r, _W32[ty], u32
    return keys, attrgetter(view), c, own, None if t is own else np.dtype(t)


def dst(ins: Instr, i: int, ty: str = "b32", hi: bool = False):
    """Setter (w, value) writing operand i (EXEC-masked for VGPRs)."""
    op = ins.ops[i]
    if op.kind in ("v", "a"):
        if ty in _W64:
            r = vidx(ins, op)
            if r % 2:
                raise UnsupportedInstruction(f"odd 64-bit VGPR tuple {op.text}")
            return _pair_setter(ins, reg_keys(ins, i) if ins.prog.race else (), r)
        keys, view, c, own, _ = _vcol(ins, i, ty, hi)
        return _col_setter(ins, keys, view, c, own)
    if op.kind == "s":
        return sdst(ins, i, 64 if ty in _W64 else 32)
    raise UnsupportedInstruction(f"operand {op.text!r} not writable")


def dst_col(ins: Instr, i: int, ty: str = "b32"):
    """w -> the lanes of 32-bit VGPR/AGPR destination i as numpy type ty, after its overwrite
    race check: a view to write every lane into (a ufunc's out=; callers check w.full). None if
    operand i is not a VGPR/AGPR or ty is not 32-bit."""
    if ins.ops[i].kind not in ("v", "a") or ty not in _W32:
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
    """Setter (w, python int or PerWave) for a scalar destination (exec writes refresh the
    lane mask; a PerWave written to EXEC here splits the unit, scalar_per_wave writes it)."""
    op = ins.ops[i]
    r = op.index
    if r == ins.prog.target.null:
        return lambda w, val: None
    keys = reg_keys(ins, i) if ins.prog.race else ()
    EXEC = ins.prog.target.exec
    touches_exec = r <= EXEC + 1 and r + op.count > EXEC
    nregs = 2 if bits == 64 or op.count == 2 else 1

    def put_per_wave(w, val):
        if touches_exec:
            raise Split()
        for j in range(nregs):
            w.S[r + j] = PerWave.of([(x >> 32 * j) & 0xFFFFFFFF for x in val.v])
    if nregs == 2:
        def put(w, val):
            if val.__class__ is PerWave:
                return put_per_wave(w, val)
            val = int(val)
            w.S[r] = val & 0xFFFFFFFF
            w.S[r + 1] = (val >> 32) & 0xFFFFFFFF
    else:
        def put(w, val):
            if val.__class__ is PerWave:
                return put_per_wave(w, val)
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
        get = lambda w: w.V[r:r + n].T.copy()  # noqa: E731
    elif op.kind == "s":
        r, n = op.index, op.count
        get = lambda w: np.broadcast_to(np.array(w.S[r:r + n], u32), (w.n, n)).copy()  # noqa: E731
    else:
        c = const_bits(op, "b32")
        get = lambda w: np.full((w.n, 1), c, u32)  # noqa: E731
    return read_checked(ins, i, get)


def src_rows(ins: Instr, i: int):
    """Getter w -> uint32 [count, w.n] of a register tuple, one row per register (a view of
    the register file: use it before writing), or broadcast constant/SGPRs."""
    op = ins.ops[i]
    if op.kind in ("v", "a"):
        r, n = vidx(ins, op), op.count
        return read_checked(ins, i, lambda w: w.V[r:r + n])
    get = src_vec(ins, i)
    return lambda w: get(w).T


def dst_vec(ins: Instr, i: int):
    """Setter (w, uint32 [w.n, count]) of a register tuple, EXEC-masked."""
    op = ins.ops[i]
    r, n = vidx(ins, op), op.count
    keys = reg_keys(ins, i) if ins.prog.race else ()

    def put(w, val):
        if keys and not w.pend.keys().isdisjoint(keys):
            race.check_pending(w, keys, ins, "overwrites")
        if w.full:
            w.V[r:r + n] = val.T
        else:
            np.copyto(w.V[r:r + n], val.T, where=w.mask)
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


def wave_bits(w, b):
    """Per-wave lane mask of bool [w.n]: an int, or a PerWave when the waves of a unit disagree."""
    on = np.count_nonzero(b)
    if on == 0 or on == w.n:   # the usual carry-out / compare results, without packing bits
        return on and w.T.full
    x = bits_of(b)
    if w.k == 1:
        return x
    wl = w.T.wave
    x0 = x & w.T.full
    if x != x0 * (((1 << (wl * w.k)) - 1) // w.T.full):   # x0 repeated k times
        return PerWave([(x >> (wl * i)) & w.T.full for i in range(w.k)])
    return x0


def wave_value(w, x, lane):
    """Python int of per-lane value x (array or scalar) in lane `lane` of each wave, or a
    PerWave when the waves of a unit disagree."""
    if np.ndim(x) == 0:
        return int(x)
    if w.k == 1:
        return int(x[lane])
    v = x[lane::w.T.wave]
    if np.count_nonzero(v != v[0]):
        return PerWave(v.tolist())
    return int(v[0])
