"""Float read-modify-write semantics of the global/buffer atomics (ISA §9.2, ch.12).

All float atomic adds round to nearest even and keep denormals (in L2; docs/gfx950_isa.md §5). Each
add is computed in float64 and rounded once to the memory format; for bf16/f16/fp32 operands
float64 (53 bits >= 2p + 2) makes that equal to the correctly rounded add.
"""
from __future__ import annotations

import numpy as np

from . import race
from . import regs as R
from .isa import UnsupportedInstruction, handler
from .mxcvt import bf16_round, bf16_value, f16_round, f16_value, u32_of_f32


def _pk_add(old, val, decode, encode):
    old, val = np.asarray(old, np.uint32), np.asarray(val, np.uint32)
    lo = encode(decode(old & 0xFFFF) + decode(val & 0xFFFF))
    hi = encode(decode(old >> 16) + decode(val >> 16))
    return ((hi << np.uint32(16)) | lo).astype(np.uint32)


def pk_add_bf16(old, val):
    """Two bf16 adds, each RNE to bf16."""
    with np.errstate(invalid="ignore"):
        return _pk_add(old, val, bf16_value, bf16_round)


def pk_add_f16(old, val):
    """Two f16 adds, each RNE to f16."""
    with np.errstate(invalid="ignore"):
        return _pk_add(old, val, f16_value, f16_round)


def add_f32(old, val):
    o = np.asarray(old, np.uint32).view(np.float32).astype(np.float64)
    v = np.asarray(val, np.uint32).view(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return u32_of_f32(o + v)


def cmpswap(old, src, cmp):
    """MEM = (MEM == cmp) ? src : MEM (bitwise compare); returns the new value."""
    return np.where(np.asarray(old) == np.asarray(cmp), src, old)


ADD_OPS = {"pk_add_bf16": pk_add_bf16, "pk_add_f16": pk_add_f16, "add_f32": add_f32}


# ---- emulator handlers: global_atomic_* and buffer_atomic_* for add_f32 / pk_add_bf16 /
# pk_add_f16 / cmpswap. With sc0 the first operand is the returned pre-op value (ISA §9.2;
# docs/gfx950_isa.md §5).

def _rmw(ins, op):
    if op == "cmpswap":
        return lambda data: (lambda old, lanes: cmpswap(old, data[lanes, 0], data[lanes, 1]))
    f = ADD_OPS[op]
    return lambda data: (lambda old, lanes: f(old, data[lanes, 0]))


def _returning(ins):
    ret = bool(ins.mods.get("sc0") or ins.mods.get("glc"))
    return ret, (1 if ret else 0)


def _finish(ins, ret):
    put = R.dst(ins, 0, "b32") if ret else None
    keys = R.reg_keys(ins, 0) if ret else ()

    def done(w, old):
        if ret:
            put(w, old)
        race.track_load(w, ins, "vm", keys, kind="load" if ret else "store")
    return done


def _build_global(ins):
    op = ins.base[len("global_atomic_"):]
    ret, o = _returning(ins)
    vaddr, sop = ins.ops[o], ins.ops[o + 2]
    data = R.src_vec(ins, o + 1)
    off = int(ins.mods.get("offset", 0))
    if sop.kind == "off":
        get_addr = R.src(ins, o, "u64")
        addr = lambda w: get_addr(w).astype(np.uint64) + np.uint64(off % (1 << 64))  # noqa: E731
    else:
        voff = R.src(ins, o, "u32")
        sb = sop.index
        addr = lambda w: (np.uint64(w.S[sb] | (w.S[sb + 1] << 32)) + voff(w).astype(np.uint64)  # noqa: E731
                          + np.uint64(off % (1 << 64)))
    del vaddr
    make, done = _rmw(ins, op), _finish(ins, ret)

    def run(w):
        done(w, w.emu.mem.atomic(addr(w), w.mask, np.uint32, make(data(w))))
    return run


def _build_buffer(ins):
    """Raw buffer atomics (offen / no idxen): address = base + soffset + voffset + offset;
    a lane with inst_offset + voffset + 4 > num_records is out of range: dropped and returns
    0 (atomics are all-or-nothing; docs/gfx950_isa.md §6)."""
    op = ins.base[len("buffer_atomic_"):]
    ret, o = _returning(ins)
    if ins.mods.get("idxen"):
        raise UnsupportedInstruction(f"structured buffer atomics: {ins.where()}")
    data = R.src_vec(ins, o)
    voff = R.src(ins, o + 1, "u32") if ins.mods.get("offen") else (lambda w: np.zeros(w.n, np.uint32))
    rs = ins.ops[o + 2].index
    soff = R.src(ins, o + 3, "u32")
    off = int(ins.mods.get("offset", 0))
    make, done = _rmw(ins, op), _finish(ins, ret)

    def run(w):
        base = w.S[rs] | ((w.S[rs + 1] & 0xFFFF) << 32)
        nrec = w.S[rs + 2]
        rel = voff(w).astype(np.uint64) + np.uint64(off)
        ok = w.mask & (rel + np.uint64(4) <= np.uint64(nrec))
        addr = np.uint64(base) + np.asarray(soff(w)).astype(np.uint64) + rel
        old = w.emu.mem.atomic(addr, ok, np.uint32, make(data(w)))
        done(w, np.where(ok, old, 0).astype(np.uint32))
    return run


_OPS = ("add_f32", "pk_add_bf16", "pk_add_f16", "cmpswap")
handler(*[f"global_atomic_{o}" for o in _OPS], per_wave=True)(_build_global)
handler(*[f"buffer_atomic_{o}" for o in _OPS], per_wave=True)(_build_buffer)
