"""Vector memory: global/flat, buffer (V#), direct-to-LDS loads, and LDS (ds_*) ops."""
from __future__ import annotations

import re

import numpy as np

from . import lds, race
from . import regs as R
from .isa import SHARED_BASE, EmulatorFault, PerWave, Split, UnsupportedInstruction, handler, i16, i32, u16, u32, u64

# suffix -> (bytes, sign-extend, d16 half: None | 0 lo | 1 hi)
_SIZES = {"ubyte": (1, False, None), "sbyte": (1, True, None), "ushort": (2, False, None),
          "sshort": (2, True, None), "dword": (4, False, None), "dwordx2": (8, False, None),
          "dwordx3": (12, False, None), "dwordx4": (16, False, None), "byte": (1, False, None),
          "short": (2, False, None), "short_d16": (2, False, 0), "short_d16_hi": (2, False, 1),
          "ubyte_d16": (1, False, 0), "ubyte_d16_hi": (1, False, 1), "sbyte_d16": (1, True, 0),
          "sbyte_d16_hi": (1, True, 1), "byte_d16_hi": (1, False, 1)}


def _widen(data, size, signed):
    """uint8 [lanes, size] -> uint32 [lanes, size // 4] (sub-dword values zero/sign extended)."""
    if size >= 4:
        return data.view(u32)
    v = data.view({1: np.uint8, 2: u16}[size])[:, 0]
    if signed:
        v = v.view({1: np.int8, 2: i16}[size]).astype(i32).view(u32)
    return v.astype(u32)[:, None]


def _narrow(vals, size):
    """uint32 [lanes, n] -> uint8 [lanes, size]."""
    return np.ascontiguousarray(vals).view(np.uint8)[:, :size]


def _load_sink(ins, i, size, signed, d16):
    """Setter (w, uint8 [w.n, size]) for a load destination; race-tracked on counter."""
    if d16 is not None:
        put16 = R.dst(ins, i, "u16", hi=bool(d16))
        return lambda w, data: put16(w, _widen(data, size, signed)[:, 0].astype(u16))
    put = R.dst_vec(ins, i)
    return lambda w, data: put(w, _widen(data, size, signed))


def _data_source(ins, i, size, d16_hi=False):
    """Getter w -> uint8 [w.n, size] of store data."""
    g = R.src_vec(ins, i)
    if d16_hi:
        return lambda w: _narrow(g(w) >> u32(16), size)
    return lambda w: _narrow(g(w), size)


def _split(base, prefix):
    """'global_load_dwordx2' -> ('load', 'dwordx2')."""
    rest = base[len(prefix):]
    kind, _, size = rest.partition("_")
    return kind, size


# ---------------------------------------------------------------------------- global / flat

def _gaddr(ins, vi, si, size=None):
    """Getter w -> uint64 [w.n] address of a global/flat access; with scale_offset (gfx1250) the
    32-bit VGPR offset counts elements of the access size."""
    off = ins.mods.get("offset", 0)
    if si is None or ins.ops[si].kind == "off":
        v = R.src(ins, vi, "u64")
        return lambda w: v(w) + u64(off & 0xFFFFFFFFFFFFFFFF) if off >= 0 else v(w) - u64(-off)
    v, s = R.src(ins, vi, "u32"), R.src(ins, si, "u64")
    if ins.mods.get("scale_offset"):
        v32, sc = v, u64(size)
        v = lambda w: v32(w).astype(u64) * sc  # noqa: E731
    return lambda w: (s(w) + v(w).astype(u64) + u64(off & 0xFFFFFFFF)) if off >= 0 else \
        (s(w) + v(w).astype(u64) - u64(-off))


def _gmem_load(w, addr, size):
    """Flat addresses in the LDS aperture go to LDS [ISA §10.1 flat address spaces]."""
    return w.emu.mem.load(addr, w.mask, size)


@handler(*[f"{p}_load_{s}" for p in ("global", "flat") for s in _SIZES if not s.startswith(("byte", "short"))
           or "d16" in s])
def _global_load(ins):
    prefix = ins.base.split("_")[0]
    size, signed, d16 = _SIZES[ins.base.split("_load_")[1]]
    addr = _gaddr(ins, 1, 2 if prefix == "global" else None, size)
    sink = _load_sink(ins, 0, size, signed, d16)
    keys = R.reg_keys(ins, 0)
    flat = prefix == "flat"

    def run(w):
        a = addr(w)
        if flat and (a >> u64(32) == u64(SHARED_BASE >> 32)).any():
            data = lds.load(w, (a - u64(SHARED_BASE)).astype(np.int64), size)
            sink(w, data)
            race.track_load(w, ins, "lgkm", keys)
            return
        sink(w, _gmem_load(w, a, size))
        race.track_load(w, ins, "vm", keys)
    return run


@handler(*[f"{p}_store_{s}" for p in ("global", "flat") for s in
           ("byte", "short", "dword", "dwordx2", "dwordx3", "dwordx4", "byte_d16_hi", "short_d16_hi")])
def _global_store(ins):
    prefix = ins.base.split("_")[0]
    sz = ins.base.split("_store_")[1]
    size = _SIZES[sz][0]
    addr = _gaddr(ins, 0, 2 if prefix == "global" else None, size)
    data = _data_source(ins, 1, size, sz.endswith("d16_hi"))
    flat = prefix == "flat"

    def run(w):
        a = addr(w)
        if flat and (a >> u64(32) == u64(SHARED_BASE >> 32)).any():
            lds.store(w, (a - u64(SHARED_BASE)).astype(np.int64), data(w))
            return
        w.emu.mem.store(a, w.mask, data(w))
        race.track_load(w, ins, "vm", (), "store")
    return run


@handler("global_load_dword_addtid", "global_store_dword_addtid")
def _global_addtid(ins):
    """A dword per lane at saddr (0 when off) + offset + 4 * the lane's index in its wave: the
    saddr operand of LLVM's syntax pages for global_{load,store}_addtid (docs/gfx1250_emulator.md §5)."""
    load = "_load_" in ins.base
    si = ins.ops[1]
    base = (lambda w: u64(0)) if si.kind == "off" else R.src(ins, 1, "u64")
    off = u64(ins.mods.get("offset", 0) & 0xFFFFFFFFFFFFFFFF)     # a negative offset wraps
    keys = R.reg_keys(ins, 0) if load else ()
    sink = _load_sink(ins, 0, 4, False, None) if load else None
    data = None if load else _data_source(ins, 0, 4)

    def run(w):
        a = base(w) + u64(4) * w.lane.astype(u64) + off
        if load:
            sink(w, _gmem_load(w, a, 4))
            race.track_load(w, ins, "vm", keys)
        else:
            w.emu.mem.store(a, w.mask, data(w))
            race.track_load(w, ins, "vm", (), "store")
    return run


# atomics: name -> (dtype, fn(old, src) -> new)
_ATOMIC = {
    "add": (u32, lambda o, s: o + s), "sub": (u32, lambda o, s: o - s),
    "smin": (i32, np.minimum), "smax": (i32, np.maximum), "umin": (u32, np.minimum), "umax": (u32, np.maximum),
    "and": (u32, lambda o, s: o & s), "or": (u32, lambda o, s: o | s), "xor": (u32, lambda o, s: o ^ s),
    "swap": (u32, lambda o, s: s), "add_f32": (np.float32, lambda o, s: o + s),
    "inc": (u32, lambda o, s: np.where(o >= s, u32(0), o + u32(1))),
    "dec": (u32, lambda o, s: np.where((o == 0) | (o > s), s, o - u32(1))),
    "add_x2": (u64, lambda o, s: o + s), "swap_x2": (u64, lambda o, s: s),
    "smax_x2": (np.int64, np.maximum), "umax_x2": (u64, np.maximum),
    "sub_x2": (u64, lambda o, s: o - s), "smin_x2": (np.int64, np.minimum), "umin_x2": (u64, np.minimum),
    "and_x2": (u64, lambda o, s: o & s), "or_x2": (u64, lambda o, s: o | s), "xor_x2": (u64, lambda o, s: o ^ s),
    "inc_x2": (u64, lambda o, s: np.where(o >= s, u64(0), o + u64(1))),
    "dec_x2": (u64, lambda o, s: np.where((o == 0) | (o > s), s, o - u64(1))),
    # data = [src, cmp]: MEM = (MEM == cmp) ? src : MEM, bitwise (ISA ATOMIC_CMPSWAP)
    "cmpswap": (u32, lambda o, s, c: np.where(o == c, s, o)),
    "cmpswap_x2": (u64, lambda o, s, c: np.where(o == c, s, o)),
    # float64 RNE add; min / max and gfx12's *_num forms return the non-NaN operand (IEEE minNum/maxNum)
    "add_f64": (np.float64, lambda o, s: o + s), "min_f64": (np.float64, np.fmin), "max_f64": (np.float64, np.fmax),
    "max_num_f32": (np.float32, np.fmax), "min_num_f32": (np.float32, np.fmin),
    # gfx12 ATOMIC_COND_SUB_U32: subtract only when it does not wrap
    "cond_sub_u32": (u32, lambda o, s: np.where(o >= s, o - s, o)),
}
_FLOAT_ATOMICS = ("cmpswap",)   # global_ / buffer_ forms of these live in float_atomics


def _atomic_rmw(ins, get_addr, data_i, ret, apply):
    """Shared atomic runner: apply(w, addr, mask, fn) performs the RMW and returns old [w.n]."""
    name = ins.base.split("_atomic_")[1]
    if name not in _ATOMIC:
        raise UnsupportedInstruction(f"atomic {ins.mnemonic}")
    dt, fn = _ATOMIC[name]
    data = R.src_vec(ins, data_i)
    put = R.dst_vec(ins, 0) if ret else None
    keys = R.reg_keys(ins, 0) if ret else ()
    width = np.dtype(dt).itemsize // 4
    nsrc = 2 if name.startswith("cmpswap") else 1     # cmpswap's data: src, then cmp

    def run(w):
        d = np.ascontiguousarray(data(w)[:, :width * nsrc]).view(dt)
        srcs = [d[:, i] for i in range(nsrc)]
        old = apply(w, get_addr(w), lambda o, lanes: fn(o, *[s[lanes] for s in srcs]), dt)
        if ret:
            put(w, np.ascontiguousarray(old).view(u32).reshape(w.n, width))
        race.track_load(w, ins, "vm", keys, "load" if ret else "store")
    return run


@handler(*[f"global_atomic_{n}" for n in _ATOMIC if n not in _FLOAT_ATOMICS] + [f"flat_atomic_{n}" for n in _ATOMIC],
         per_wave=True)
def _global_atomic(ins):
    ret = len(ins.ops) == (4 if ins.base.startswith("global") else 3)
    if ins.base.startswith("flat") and len(ins.ops) == 2:
        ret = False
    a0 = 1 if ret else 0
    addr = _gaddr(ins, a0, a0 + 2 if ins.base.startswith("global") else None,
                  np.dtype(_ATOMIC.get(ins.base.split("_atomic_")[1], (u32,))[0]).itemsize)
    return _atomic_rmw(ins, addr, a0 + 1, ret, lambda w, a, f, dt: w.emu.mem.atomic(a, w.mask, dt, f))


# ---------------------------------------------------------------------------- buffer (V#)

def vsharp_gfx9(s):
    """(base, stride, num_records, add_tid, swizzle) of a V# in four SGPR values [ISA Table 48]."""
    base = s[0] | ((s[1] & 0xFFFF) << 32)
    stride = (s[1] >> 16) & 0x3FFF
    return base, stride, s[2], (s[3] >> 23) & 1, (s[1] >> 31) & 1


def _buffer_addr(ins, vi, ri, oi, size):
    """Getter w -> (addr u64[64], ok bool[64, ndw]) for a MUBUF access: address = base +
    soffset + voffset + inst_offset + stride * index; raw buffers are out of range per dword
    when voffset + inst_offset + 4j >= num_records (soffset excluded), structured buffers when
    index >= num_records [docs/buffer_oob.md, ISA §9.1.5-9.1.7]."""
    mods = ins.mods
    offen, idxen = bool(mods.get("offen")), bool(mods.get("idxen"))
    inst = mods.get("offset", 0)
    rs = R.read_checked(ins, ri, lambda w, r=ins.ops[ri].index: w.S[r:r + 4])
    so = R.src(ins, oi, "u32")
    vop = ins.ops[vi] if vi is not None else None
    if vop is not None and vop.kind != "off":
        vv = R.src_vec(ins, vi)
    else:
        vv = None
    ndw = max(1, (size + 3) // 4)
    steps = np.arange(ndw, dtype=u64) * u64(4)
    vsharp = ins.prog.target.vsharp

    def get(w):
        base, stride, nrec, add_tid, swz = _resource(w, vsharp, rs(w))
        v = vv(w) if vv is not None else np.zeros((w.n, 2), u32)
        index = v[:, 0].astype(u64) if idxen else np.zeros(w.n, u64)
        voff = (v[:, 1 if idxen else 0].astype(u64)) if offen else np.zeros(w.n, u64)
        if add_tid:
            index = index + w.lane.astype(u64)
        off = voff + u64(inst)
        soff = np.asarray(so(w)).astype(u64)
        addr = u64(base) + soff + off + u64(stride) * index
        nrec = u64(nrec) if nrec.__class__ is int else nrec[:, None]
        if idxen or add_tid:
            ok = np.broadcast_to(index[:, None] < nrec, (w.n, ndw))
        else:
            ok = (off[:, None] + steps[None, :]) < nrec
            if w.emu.strict_buffer_oob and soff.any():
                _soffset_decides(w, ins, ok, (off + soff)[:, None] + steps[None, :] < nrec, off, soff, nrec)
        return addr, ok
    return get


def _soffset_decides(w, ins, without, with_soffset, off, soff, nrec):
    """Strict mode: an active lane's dword in range or not depending on whether soffset is part
    of the raw buffer range check, which the sources leave open (docs/buffer_oob.md)."""
    differ = (without != with_soffset) & w.mask[:, None]
    if differ.any():
        lane = int(np.argmax(differ.any(axis=1)))
        n = int(np.broadcast_to(nrec, differ.shape)[lane, 0])
        so = int(np.broadcast_to(soff, (w.n,))[lane])
        raise EmulatorFault(f"{ins.where()}: lane {lane % w.T.wave}: voffset + inst_offset = {int(off[lane])} is "
                            f"{'inside' if without[lane].any() else 'outside'} num_records = {n}, with soffset "
                            f"{so} {'inside' if with_soffset[lane].any() else 'outside'}: the result depends on "
                            "whether soffset is range checked, which the sources leave open (strict_buffer_oob)")


def _resource(w, vsharp, regs):
    """vsharp of four SGPR values; when some are PerWave, base, stride and num_records per lane
    (uint64 [n]) -- the flags must agree between the waves."""
    try:
        return vsharp(regs)
    except Split:
        per = [vsharp([PerWave.at(x, i) for x in regs]) for i in range(w.k)]
        if any(p[3:] != per[0][3:] for p in per):
            raise
        lanes = [np.repeat(np.array([p[j] for p in per], u64), w.T.wave) for j in range(3)]
        return (*lanes, *per[0][3:])


def _buffer_read(w, ao, size):
    """uint8 [w.n, size] of a MUBUF load: each dword of a lane whose range check fails reads 0
    (and touches no memory), every size alike."""
    a, ok = ao
    mem = w.emu.mem
    if ok.all():
        return mem.load(a, w.mask, size)
    data = np.zeros((w.n, size), np.uint8)
    if ok.shape[1] == 1 or (ok == ok[:, :1]).all():     # whole lanes in or out
        m = w.mask & ok[:, 0]
        data[m] = mem.load(a, m, size)[m]
        return data
    for j in range(ok.shape[1]):   # raw multi-dword access straddling num_records
        m = w.mask & ok[:, j]
        n = min(4, size - 4 * j)
        data[m, 4 * j:4 * j + n] = mem.load(a + u64(4 * j), m, n)[m]
    return data


def _buffer_ops(ins):
    """Operand indices (vdata, vaddr, srsrc, soffset); vaddr None for 'off'/absent."""
    ops = ins.ops
    if ins.mods.get("lds") and len(ops) == 3:      # buffer_load_dword vaddr, s[..], soff ... lds
        return None, 0, 1, 2
    if ins.mods.get("lds") and len(ops) == 2:
        return None, None, 0, 1
    return 0, 1, 2, 3


@handler(*[f"buffer_load_{s}" for s in _SIZES if s not in ("byte", "short", "byte_d16_hi")])
def _buffer_load(ins):
    sz = ins.base[len("buffer_load_"):]
    size, signed, d16 = _SIZES[sz]
    di, vi, ri, oi = _buffer_ops(ins)
    if vi is not None and ins.ops[vi].kind == "off":
        vi = None
    addr = _buffer_addr(ins, vi, ri, oi, size)
    if di is None:
        return _to_lds(ins, addr, size, signed)
    sink = _load_sink(ins, di, size, signed, d16)
    keys = R.reg_keys(ins, di)

    def run(w):
        sink(w, _buffer_read(w, addr(w), size))
        race.track_load(w, ins, "vm", keys)
    return run


@handler(*[f"buffer_store_{s}" for s in ("byte", "short", "dword", "dwordx2", "dwordx3", "dwordx4",
                                         "byte_d16_hi", "short_d16_hi")])
def _buffer_store(ins):
    sz = ins.base[len("buffer_store_"):]
    size = _SIZES[sz][0]
    vi = None if ins.ops[1].kind == "off" else 1
    addr = _buffer_addr(ins, vi, 2, 3, size)
    data = _data_source(ins, 0, size, sz.endswith("d16_hi"))

    def run(w):
        a, ok = addr(w)
        d = data(w)
        mem = w.emu.mem
        if ok.all():
            mem.store(a, w.mask, d)
        else:   # dropped per dword
            for j in range(ok.shape[1]):
                n = min(4, size - 4 * j)
                mem.store(a + u64(4 * j), w.mask & ok[:, j], np.ascontiguousarray(d[:, 4 * j:4 * j + n]))
        race.track_load(w, ins, "vm", (), "store")
    return run


@handler(*[f"buffer_atomic_{n}" for n in _ATOMIC if n not in _FLOAT_ATOMICS], per_wave=True)
def _buffer_atomic(ins):
    ret = bool(ins.mods.get("sc0") or ins.mods.get("glc"))
    vi = None if ins.ops[1].kind == "off" else 1
    addr = _buffer_addr(ins, vi, 2, 3, 4)

    def apply(w, ao, fn, dt):
        a, ok = ao
        return w.emu.mem.atomic(a, w.mask & ok.all(axis=1), dt, fn)   # atomics are all-or-nothing
    return _atomic_rmw(ins, addr, 0, ret, apply)


def _to_lds(ins, addr, size, signed):
    """Direct-to-LDS: LDS address = M0[17:2]*4 + inst_offset + TID*4 (TID*16 for x3/x4);
    out-of-range reads write 0 [docs/gfx950_isa.md §4, docs/buffer_oob.md]."""
    inst = ins.mods.get("offset", 0)
    per = 16 if size > 8 else 4

    def run(w):
        data = _buffer_read(w, addr(w), size)
        data = _narrow(_widen(data, size, signed), max(size, 4))
        m0 = w.S[w.T.m0]          # each wave's LDS base (PerWave: one per wave of the unit)
        m0 = m0 & 0x3FFFC if m0.__class__ is int else np.repeat(np.array(m0.v, np.int64) & 0x3FFFC, w.T.wave)
        to = m0 + inst + w.lane * per
        d = lds.store(w, to, data, inflight=w.race)
        race.track_load(w, ins, "vm", (), "async", lds=d)
    return run


@handler("global_load_lds_dword", "global_load_lds_dwordx3", "global_load_lds_dwordx4",
         "global_load_lds_ubyte", "global_load_lds_sbyte", "global_load_lds_ushort", "global_load_lds_sshort")
def _global_lds(ins):
    size, signed, _ = _SIZES[ins.base[len("global_load_lds_"):]]
    ga = _gaddr(ins, 0, 1)
    return _to_lds(ins, lambda w: (ga(w), np.ones((w.n, 4), bool)), size, signed)


# ---------------------------------------------------------------------------- private (scratch)

def _priv_offsets(ins, vi, si):
    """Getter w -> (int64 [w.n] byte offsets into each lane's private segment, the segment
    uint8 [w.n, bytes]); address = vaddr + saddr + inst_offset, per lane (the hardware swizzles
    lanes apart, so a lane only ever sees its own bytes) [ISA §10 scratch instructions]."""
    off = ins.mods.get("offset", 0)
    v = R.src(ins, vi, "u32") if ins.ops[vi].kind != "off" else None
    s = R.src(ins, si, "u32") if ins.ops[si].kind != "off" else None
    size = ins.prog.meta.d("private_segment_fixed_size", 0)

    def get(w):
        o = np.full(w.n, off, np.int64)
        if v is not None:
            o = o + np.asarray(v(w)).astype(np.int64)
        if s is not None:
            o = o + np.asarray(s(w)).astype(np.int64)
        return o, w.private(size)
    return get


def _priv_index(w, o, seg, nbytes):
    """(lanes [w.n, 1], byte columns [w.n, nbytes]) of the active lanes' accesses (others read 0)."""
    bad = w.mask & ((o < 0) | (o + nbytes > seg.shape[1]))
    if bad.any():
        j = int(np.argmax(bad))
        raise EmulatorFault(f"private (scratch) access outside the kernel's {seg.shape[1]}-byte private "
                            f"segment: {w.lane_name(j)}, offset {int(o[j])}, {nbytes} bytes")
    return np.arange(w.n)[:, None], np.where(w.mask, o, 0)[:, None] + lds.AR[nbytes]


@handler(*[f"scratch_load_{s}" for s in _SIZES if not s.startswith(("byte", "short")) or "d16" in s])
def _scratch_load(ins):
    size, signed, d16 = _SIZES[ins.base[len("scratch_load_"):]]
    addr = _priv_offsets(ins, 1, 2)
    sink = _load_sink(ins, 0, size, signed, d16)
    keys = R.reg_keys(ins, 0)

    def run(w):
        o, seg = addr(w)
        sink(w, seg[_priv_index(w, o, seg, size)])
        race.track_load(w, ins, "vm", keys)
    return run


@handler(*[f"scratch_store_{s}" for s in
           ("byte", "short", "dword", "dwordx2", "dwordx3", "dwordx4", "byte_d16_hi", "short_d16_hi")])
def _scratch_store(ins):
    sz = ins.base[len("scratch_store_"):]
    size = _SIZES[sz][0]
    addr = _priv_offsets(ins, 0, 2)
    data = _data_source(ins, 1, size, sz.endswith("d16_hi"))

    def run(w):
        o, seg = addr(w)
        lanes, cols = _priv_index(w, o, seg, size)
        m = w.mask
        seg[lanes[m], cols[m]] = data(w)[m]
        race.track_load(w, ins, "vm", (), "store")
    return run


# ---------------------------------------------------------------------------- LDS

_DS_READ = {"b32": (4, False), "b64": (8, False), "b96": (12, False), "b128": (16, False),
            "u8": (1, False), "i8": (1, True), "u16": (2, False), "i16": (2, True)}
_DS_WRITE = {"b32": 4, "b64": 8, "b96": 12, "b128": 16, "b8": 1, "b16": 2}


def _ds_addr(ins, i, off_key="offset"):
    a = R.src(ins, i, "u32")
    off = ins.mods.get(off_key, 0)
    return lambda w: np.asarray(a(w)).astype(np.int64) + off   # 32-bit wrap: lds_* wrap=True


@handler(*[f"ds_read_{k}" for k in _DS_READ], "ds_read_u16_d16", "ds_read_u16_d16_hi", "ds_read_u8_d16",
         "ds_read_u8_d16_hi", "ds_read_i8_d16", "ds_read_i8_d16_hi")
def _ds_read(ins):
    sfx = ins.base[len("ds_read_"):]
    d16 = None
    if "_d16" in sfx:
        d16 = 1 if sfx.endswith("_hi") else 0
        sfx = sfx.split("_d16")[0]
    size, signed = _DS_READ[sfx]
    addr = _ds_addr(ins, 1)
    sink = _load_sink(ins, 0, size, signed, d16)
    keys = R.reg_keys(ins, 0)

    def run(w):
        sink(w, lds.load(w, addr(w), size, wrap=True))
        race.track_load(w, ins, "lgkm", keys)
    return run


def _ds2(ins, ai):
    """(element size, address getter, byte offset0, byte offset1) of a read2/write2."""
    size = 8 if ins.base.endswith("64") else 4
    unit = size * (64 if "st64" in ins.base else 1)
    return size, R.src(ins, ai, "u32"), ins.mods.get("offset0", 0) * unit, ins.mods.get("offset1", 0) * unit


@handler("ds_read2_b32", "ds_read2_b64", "ds_read2st64_b32", "ds_read2st64_b64")
def _ds_read2(ins):
    size, a, o0, o1 = _ds2(ins, 1)
    put = R.dst_vec(ins, 0)
    keys = R.reg_keys(ins, 0)
    offs = np.array([o0, o1], np.int64)

    def run(w):   # both halves in one access: same result and race bookkeeping as two reads
        put(w, lds.load(w, np.asarray(a(w)).astype(np.int64)[:, None] + offs, size, wrap=True).view(u32))
        race.track_load(w, ins, "lgkm", keys)
    return run


def _ds_track_write(w, ins, d):
    race.track_load(w, ins, "lgkm", (), "lds_write", lds=d)


@handler(*[f"ds_write_{k}" for k in _DS_WRITE], "ds_write_b8_d16_hi", "ds_write_b16_d16_hi")
def _ds_write(ins):
    sfx = ins.base[len("ds_write_"):]
    hi = sfx.endswith("_d16_hi")
    size = _DS_WRITE[sfx.split("_d16")[0]]
    addr = _ds_addr(ins, 0)
    data = _data_source(ins, 1, size, hi)

    def run(w):
        _ds_track_write(w, ins, lds.store(w, addr(w), data(w), wrap=True))
    return run


@handler("ds_write2_b32", "ds_write2_b64", "ds_write2st64_b32", "ds_write2st64_b64")
def _ds_write2(ins):
    size, a, o0, o1 = _ds2(ins, 0)
    d0, d1 = _data_source(ins, 1, size), _data_source(ins, 2, size)

    def run(w):
        base = np.asarray(a(w)).astype(np.int64)
        x = lds.store(w, base + o0, d0(w), wrap=True)
        y = lds.store(w, base + o1, d1(w), wrap=True)
        _ds_track_write(w, ins, None if x is None else np.concatenate([x, y]))
    return run


def _condxchg32(old, data):
    """DS_CONDXCHG32_RTN_B64, per 32-bit half: data's low 31 bits (bit 31 cleared) when its bit 31
    is set, else the old half (docs/gfx1250_emulator.md §5)."""
    old, data = int(old), int(data)
    new = 0
    for sh in (0, 32):
        d = (data >> sh) & 0xFFFFFFFF
        new |= ((d & 0x7FFFFFFF) if d >> 31 else (old >> sh) & 0xFFFFFFFF) << sh
    return u64(new)


_DS_ATOMIC = {"add_u32": (u32, lambda o, s: o + s), "sub_u32": (u32, lambda o, s: o - s),
              "add_f32": (np.float32, lambda o, s: o + s), "min_i32": (i32, np.minimum),
              "max_i32": (i32, np.maximum), "min_u32": (u32, np.minimum), "max_u32": (u32, np.maximum),
              "and_b32": (u32, lambda o, s: o & s), "or_b32": (u32, lambda o, s: o | s),
              "xor_b32": (u32, lambda o, s: o ^ s), "min_f32": (np.float32, np.fmin),
              "max_f32": (np.float32, np.fmax), "wrxchg_rtn_b32": (u32, lambda o, s: s),
              "add_u64": (u64, lambda o, s: o + s), "and_b64": (u64, lambda o, s: o & s),
              "inc_u32": _ATOMIC["inc"], "dec_u32": _ATOMIC["dec"], "inc_u64": _ATOMIC["inc_x2"],
              "dec_u64": _ATOMIC["dec_x2"],
              # gfx11+ DS_CMPSTORE: DATA0 is the new value, DATA1 the compare value (gfx9's
              # ds_cmpst had them the other way round)
              "cmpstore_b32": _ATOMIC["cmpswap"], "cmpstore_b64": _ATOMIC["cmpswap_x2"],
              "condxchg32_b64": (u64, _condxchg32)}


@handler(*[f"ds_{k}" for k in _DS_ATOMIC], *[f"ds_{k.replace('_', '_rtn_', 1)}" for k in _DS_ATOMIC], per_wave=True)
def _ds_atomic(ins):
    name = ins.base[3:].replace("_rtn", "")
    ret = "_rtn_" in ins.base
    dt, fn = _DS_ATOMIC[name]
    first = 1 if ret else 0
    addr = _ds_addr(ins, first)
    if name == "condxchg32_b64":                  # the pseudocode clears address bits 2:0: a qword pair
        byte_addr = addr
        addr = lambda w: byte_addr(w) & ~7  # noqa: E731
    datas = [R.src_vec(ins, i) for i in range(first + 1, len(ins.ops))]   # cmpstore: new, cmp
    put = R.dst_vec(ins, 0) if ret else None
    keys = R.reg_keys(ins, 0) if ret else ()
    n = np.dtype(dt).itemsize

    def run(w):
        # LDS atomics are exempt from the cross-wave race check: they are atomic by design.
        a = lds.addresses(w, addr(w), n, wrap=True)
        srcs = [np.ascontiguousarray(d(w)[:, :n // 4]).view(dt)[:, 0] for d in datas]
        out = np.zeros(w.n, dt)
        mem = w.wg.lds
        for l in np.nonzero(w.mask)[0]:   # lane order matters when lanes share an address
            cur = mem[a[l]:a[l] + n].view(dt)[0]
            out[l] = cur
            mem[a[l]:a[l] + n] = np.asarray(fn(cur, *[s[l] for s in srcs]), dt).reshape(1).view(np.uint8)
        if ret:
            put(w, out.view(u32).reshape(w.n, n // 4))
        race.track_load(w, ins, "lgkm", keys)
    return run


@handler("ds_append", "ds_consume", per_wave=True)
def _ds_append(ins):
    """Add (append) or subtract (consume) the number of active lanes to the dword of LDS at the
    instruction offset, once for the wave; every active lane gets the value before [CDNA4 ISA
    DS_APPEND / DS_CONSUME: LDS address instr_offset, the pre-operation value to VGPRs]."""
    off = ins.mods.get("offset", 0) & ~3
    put, keys = R.dst(ins, 0, "u32"), R.reg_keys(ins, 0)
    sign = 1 if ins.base == "ds_append" else -1

    def run(w):
        lanes = np.flatnonzero(w.mask)
        if lanes.size == 0:
            return
        a = int(lds.addresses(w, np.full(w.n, off, np.int64), 4)[lanes[0]])   # inactive lanes point elsewhere
        cell = w.wg.lds[a:a + 4].view(u32)
        old = u32(cell[0])
        cell[0] = u32((int(old) + sign * int(w.mask.sum())) & 0xFFFFFFFF)
        put(w, np.full(w.n, old, u32))
        race.track_load(w, ins, "lgkm", keys)
    return run


def _swizzle_offset(v):
    """Decode ds_swizzle offset: an int or LLVM's swizzle(...) macro [ISA §11.3 DS_SWIZZLE]."""
    if isinstance(v, int):
        return v
    m = re.match(r"swizzle\((\w+)(?:,(.*))?\)", v)
    if not m:
        raise UnsupportedInstruction(f"ds_swizzle offset {v!r}")
    mode, args = m.group(1), [a.strip() for a in (m.group(2) or "").split(",") if a.strip()]
    if mode == "QUAD_PERM":
        p = [int(x) for x in args]
        return 0x8000 | p[0] | p[1] << 2 | p[2] << 4 | p[3] << 6
    if mode == "SWAP":
        return (int(args[0]) << 10) | 0x1F
    if mode == "REVERSE":
        return ((int(args[0]) - 1) << 10) | 0x1F
    if mode == "BROADCAST":
        size, lane = int(args[0]), int(args[1])
        return ((0x1F & ~(size - 1)) | (lane << 5) & 0x3E0)
    if mode == "BITMASK_PERM":
        s = args[0].strip('"')
        andm = orm = xorm = 0
        for k, ch in enumerate(reversed(s)):
            if ch == "1":
                orm |= 1 << k
            elif ch == "p":
                andm |= 1 << k
            elif ch == "i":
                andm |= 1 << k
                xorm |= 1 << k
        return andm | orm << 5 | xorm << 10
    raise UnsupportedInstruction(f"ds_swizzle mode {mode}")


@handler("ds_swizzle_b32", per_wave=True)
def _ds_swizzle(ins):
    off = _swizzle_offset(ins.mods.get("offset", 0))
    l = ins.prog.target.lane
    if off & 0x8000:
        srcl = (l & ~3) + ((off >> (2 * (l & 3))) & 3)
    else:
        andm, orm, xorm = off & 0x1F, (off >> 5) & 0x1F, (off >> 10) & 0x1F
        srcl = (l & ~31) + ((((l & 31) & andm) | orm) ^ xorm)
    a = R.src(ins, 1, "u32")
    put = R.dst(ins, 0, "u32")
    keys = R.reg_keys(ins, 0)

    def run(w):
        x = np.broadcast_to(a(w), (w.n,))
        put(w, np.where(w.mask[srcl], x[srcl], u32(0)))   # inactive source lanes read 0
        race.track_load(w, ins, "lgkm", keys)
    return run


@handler("ds_permute_b32", "ds_bpermute_b32", per_wave=True)
def _ds_permute(ins):
    a, d = R.src(ins, 1, "u32"), R.src(ins, 2, "u32")
    off = ins.mods.get("offset", 0)
    put = R.dst(ins, 0, "u32")
    keys = R.reg_keys(ins, 0)
    back = ins.base == "ds_bpermute_b32"

    def run(w):
        lane = ((np.broadcast_to(a(w), (w.n,)).astype(np.int64) + off) >> 2) % w.n
        x = np.broadcast_to(d(w), (w.n,))
        if back:   # dst[l] = src[lane[l]]
            r = x[lane]
        else:      # dst[lane[l]] = src[l]; later lanes win; unwritten lanes read 0
            r = np.zeros(w.n, u32)
            m = w.mask
            r[lane[m]] = x[m]
        put(w, r)
        race.track_load(w, ins, "lgkm", keys)
    return run


@handler("ds_nop")
def _ds_nop(ins):
    return lambda w: None
