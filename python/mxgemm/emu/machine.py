"""Waves, memory, scheduling, race tracking and launch."""
from __future__ import annotations

import bisect
import ctypes
import importlib
import struct

import numpy as np

from . import asm as _asm
from .isa import (EXEC, HANDLERS, LANES, SHARED_BASE, EmulatorError, EmulatorFault, Instr, RaceError,
                  UnsupportedInstruction, const_bits, f16, f32, f64, i16, i32, i64, u16, u32, u64)

FULL = (1 << 64) - 1
LDS_MAX = 160 * 1024                       # gfx950 LDS per workgroup
AR = [np.arange(n, dtype=np.int64) for n in range(65)]
_W64 = {"b64": u64, "u64": u64, "i64": i64, "f64": f64}
_W16 = {"b16": u16, "u16": u16, "i16": i16, "f16": f16, "bf16": u16}
_W32 = {"b32": u32, "u32": u32, "i32": i32, "f32": f32}
_FLOAT = ("f32", "f16", "f64")
SKEY = 1000                               # race-tracking key of s<i> is SKEY + i
INFLIGHT = 1 << 30                         # LDS epoch stamp of a direct-to-LDS write not yet retired
WB, WMASK = 8, 255                         # LDS race stamps: epoch << WB | wave (wave < 16)
SEVERAL = WMASK                            # reader "wave" when several waves read in one epoch

_PLUGINS = ("salu", "valu", "vmem", "matrix")  # instruction handler modules (matrix loads its own)
for _m in _PLUGINS:
    importlib.import_module(f"{__package__}.{_m}")


# ---------------------------------------------------------------------------- operand access

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


def _key_name(k):
    return f"s{k - SKEY}" if k >= SKEY else f"v{k}"


_VMEM_LOADS = ("global_load", "buffer_load")


def check_pending(w, keys, ins, what="reads"):
    for k in keys:
        rec = w.pend.get(k)
        if rec is not None:
            if what == "overwrites" and ins.base.startswith(_VMEM_LOADS) and rec.ins.base.startswith(_VMEM_LOADS):
                continue  # vector-memory loads return in issue order: the later load's data lands last
            raise RaceError(f"{ins.where()} {what} {_key_name(k)} while the load at line {rec.ins.line} "
                            f"({rec.ins.text.strip()}) is outstanding (no s_waitcnt retired it)")


def _race_wrap(ins, i, get):
    if not ins.prog.race:
        return get
    keys = reg_keys(ins, i)
    if not keys:
        return get

    def checked(w):
        if not w.pend.keys().isdisjoint(keys):   # C-level test; details only on a hit
            check_pending(w, keys, ins)
        return get(w)
    return checked


def src(ins: Instr, i: int, ty: str = "b32", hi: bool = False):
    """Getter w -> per-lane value of operand i as numpy type ty (array [64] or scalar)."""
    op = ins.ops[i]
    k = op.kind
    if k in ("v", "a"):
        r = vidx(ins, op)
        if ty in _W64:
            t = _W64[ty]
            if r % 2 == 0:
                h = r >> 1
                get = (lambda w: w.V64[:, h]) if t is u64 else (lambda w: w.V64[:, h].view(t))
            else:
                def get(w):
                    return (w.V[:, r].astype(u64) | (w.V[:, r + 1].astype(u64) << u64(32))).view(t)
        elif ty in _W16:
            t, c = _W16[ty], 2 * r + (1 if hi else 0)
            get = lambda w: w.V16[:, c].view(t)  # noqa: E731
        else:
            t = _W32[ty]
            get = (lambda w: w.V[:, r]) if t is u32 else (lambda w: w.V[:, r].view(t))
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
            c = u64(const_bits(op, ty if ty != "u64" else "b64")).view(_W64[ty])
        elif ty in _W16:
            bits = const_bits(op, ty)
            c = u16((bits >> 16 if hi and op.kind == "const" and bits > 0xFFFF else bits) & 0xFFFF).view(_W16[ty])
        else:
            c = u32(const_bits(op, ty)).view(_W32[ty])
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
    return _race_wrap(ins, i, get)


def _as(val, t):
    """Bit pattern of val (numpy array/scalar or Python number) as dtype t."""
    if isinstance(val, np.ndarray) or isinstance(val, np.generic):
        if val.dtype == t:
            return val
        if val.dtype.itemsize == np.dtype(t).itemsize:
            return val.view(t)
        return val.astype(t)
    return np.array(val).astype(t)


def _col_setter(view, c, t):
    """Setter of column c of a register-file view (V, V16 or V64), EXEC-masked."""
    def put(w, val):
        if val.__class__ is not np.ndarray or val.dtype != t:
            val = _as(val, t)
        if w.full:
            view(w)[:, c] = val
        else:
            np.copyto(view(w)[:, c], val, where=w.mask)
    return put


def dst(ins: Instr, i: int, ty: str = "b32", hi: bool = False):
    """Setter (w, value) writing operand i (EXEC-masked for VGPRs)."""
    op = ins.ops[i]
    keys = reg_keys(ins, i) if ins.prog.race else ()
    if op.kind in ("v", "a"):
        r = vidx(ins, op)
        if ty in _W64:
            if r % 2:
                raise UnsupportedInstruction(f"odd 64-bit VGPR tuple {op.text}")
            put = _col_setter(lambda w: w.V64, r >> 1, u64)
        elif ty in _W16:
            put = _col_setter(lambda w: w.V16, 2 * r + (1 if hi else 0), u16)
        else:
            put = _col_setter(lambda w: w.V, r, u32)
    elif op.kind == "s":
        put = sdst(ins, i, 64 if ty in _W64 else 32)
        return put
    else:
        raise UnsupportedInstruction(f"operand {op.text!r} not writable")
    return _checked(put, keys, ins)


def _checked(put, keys, ins):
    """Wrap a setter so that overwriting a register with a load outstanding raises RaceError."""
    if not keys:
        return put

    def checked(w, val):
        if not w.pend.keys().isdisjoint(keys):
            check_pending(w, keys, ins, "overwrites")
        put(w, val)
    return checked


def sdst(ins: Instr, i: int, bits: int = 32):
    """Setter (w, python int) for a scalar destination (exec writes refresh the lane mask)."""
    op = ins.ops[i]
    r = op.index
    keys = reg_keys(ins, i) if ins.prog.race else ()
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
    """Getter w -> uint32 [64, count] copy of a register tuple (or broadcast constant/SGPRs)."""
    op = ins.ops[i]
    if op.kind in ("v", "a"):
        r, n = vidx(ins, op), op.count
        get = lambda w: w.V[:, r:r + n].copy()  # noqa: E731
    elif op.kind == "s":
        r, n = op.index, op.count
        get = lambda w: np.broadcast_to(np.array(w.S[r:r + n], u32), (64, n)).copy()  # noqa: E731
    else:
        c = const_bits(op, "b32")
        get = lambda w: np.full((64, 1), c, u32)  # noqa: E731
    return _race_wrap(ins, i, get)


def dst_vec(ins: Instr, i: int):
    op = ins.ops[i]
    r, n = vidx(ins, op), op.count
    keys = reg_keys(ins, i) if ins.prog.race else ()

    def put(w, val):
        if keys and not w.pend.keys().isdisjoint(keys):
            check_pending(w, keys, ins, "overwrites")
        if w.full:
            w.V[:, r:r + n] = val
        else:
            np.copyto(w.V[:, r:r + n], val, where=w.mask[:, None])
    return put


def mask_of(x: int):
    return ((u64(x) >> LANES) & u64(1)).astype(bool)


def bits_of(b) -> int:
    return int(np.packbits(b, bitorder="little").view(np.uint64)[0])


# ---------------------------------------------------------------------------- race tracking

class _Rec:
    __slots__ = ("keys", "ins", "kind", "lds")

    def __init__(self, keys, ins, kind, lds):
        self.keys, self.ins, self.kind, self.lds = keys, ins, kind, lds


def track_load(w, ins, counter, keys=(), kind="load", lds=None):
    """Record an outstanding memory op (counter 'vm' or 'lgkm'; kind 'load', 'store',
    'smem', 'lds_write' (lds = dword indices written), 'async' (direct-to-LDS))."""
    if not w.race:
        return
    rec = _Rec(keys, ins, kind, lds)
    (w.vmq if counter == "vm" else w.lgkmq).append(rec)
    for k in keys:
        w.pend[k] = rec


def _retire(w, rec):
    for k in rec.keys:
        if w.pend.get(k) is rec:
            del w.pend[k]
    if rec.kind == "async" and rec.lds is not None:
        g = w.wg
        d = rec.lds
        g.lw[d[g.lw[d] == (INFLIGHT << WB) | w.wid]] = (g.epoch << WB) | w.wid


def waitcnt(w, vm, lgkm):
    """Retire outstanding ops: vmcnt in order; LDS ops in order but scalar loads may return out
    of order, so only lgkmcnt(0) is known to cover them [ISA §4.4 s_waitcnt]."""
    if vm is not None:
        while len(w.vmq) > vm:
            _retire(w, w.vmq.pop(0))
    if lgkm is not None and len(w.lgkmq) > lgkm:
        q = w.lgkmq
        if lgkm == 0:
            for rec in q:
                _retire(w, rec)
            q.clear()
            return
        need = len(q) - lgkm - sum(1 for r in q if r.kind == "smem")
        keep = []
        for rec in q:
            if need > 0 and rec.kind != "smem":
                _retire(w, rec)
                need -= 1
            else:
                keep.append(rec)
        w.lgkmq = keep


def at_barrier(w):
    """A wave arrives at s_barrier: LDS writes it has not waited for are not guaranteed
    visible after the barrier, so they count as written in the next epoch."""
    g = w.wg
    for rec in w.lgkmq:
        if rec.kind == "lds_write":
            d = rec.lds
            k = g.lw[d]
            d = d[(k & WMASK) == w.wid]
            g.lw[d] = np.maximum(g.lw[d], ((g.epoch + 1) << WB) | w.wid)   # same wave: max of epochs


# ---------------------------------------------------------------------------- LDS access

def _lds_addr(w, addr, nbytes, wrap=False):
    """Bounds-checked int64 LDS byte addresses (inactive lanes -> 0); wrap: 32-bit address
    math, applied only when some address is out of range (in-range ones are unchanged by it)."""
    a = addr if isinstance(addr, np.ndarray) and addr.dtype == np.int64 else np.asarray(addr).astype(np.int64)
    lim = w.wg.lds.size
    if w.full:
        f = a.ravel()
        if f[f.argmin()] >= 0 and f[f.argmax()] + nbytes <= lim:   # argmin/argmax: cheaper than min/max
            return a
        if wrap:
            return _lds_addr(w, a & 0xFFFFFFFF, nbytes)
        bad = (a < 0) | (a + nbytes > lim)
    else:
        if wrap:
            a = a & 0xFFFFFFFF
        m = w.mask if a.ndim == 1 else w.mask[:, None]
        bad = m & ((a < 0) | (a + nbytes > lim))
    if np.count_nonzero(bad):
        j = int(np.argmax(bad))
        raise EmulatorFault(f"LDS access outside the {lim}-byte allocation: lane {j // (a.size // 64)}, "
                            f"address {int(a.ravel()[j]):#x}")
    return np.where(m, a, 0)


def _lds_race(w, d, write, inflight=False):
    """d: dword indices of the active lanes' access. Per dword the last writer and last reader
    are packed as epoch << WB | wave (reader wave SEVERAL = more than one); an access conflicts
    with another wave's access in the same barrier epoch."""
    if not d.size:     # no active lane
        return d
    g = w.wg
    X, EK = w.wid, g.epoch << WB
    k = g.lw[d]
    if k.ravel()[k.argmax()] >= EK:    # some dword written this epoch (or still in flight)
        bad = (k >= EK) & (((k & WMASK) != X) | (k >= INFLIGHT << WB))
        if np.count_nonzero(bad):
            _lds_race_error(w, d, bad, write)
    r = g.lr[d]
    other = (r >= EK) & (r != EK | X)   # read this epoch by another wave (reader epochs never exceed E)
    if write:
        if np.count_nonzero(other):
            _lds_race_error(w, d, other, write)
        g.lw[d] = ((INFLIGHT << WB) if inflight else EK) | X
    else:
        g.lr[d] = np.where(other, EK | SEVERAL, EK | X)
    return d


def _lds_race_error(w, d, bad, write):
    g, X, EK = w.wg, w.wid, w.wg.epoch << WB
    j = int(d.ravel()[np.argmax(bad)])
    k = int(g.lw[j])
    if k >> WB == INFLIGHT:
        what = "direct-to-LDS data not yet retired by s_waitcnt vmcnt + s_barrier"
    else:
        other = (k if k >= EK else int(g.lr[j])) & WMASK
        what = (f"{'written' if write else 'read'} here while wave {other if other != SEVERAL else '(several)'} "
                f"accesses it without an s_barrier (and s_waitcnt) in between")
    raise RaceError(f"LDS race at byte {j * 4:#x} (wave {X}): {what}")


def _lds_dwords(w, a, nbytes):
    """Dword indices [..., n] of an access of nbytes per address if every address is dword
    aligned (None otherwise)."""
    if nbytes & 3 or np.count_nonzero(a & 3):
        return None
    d = a >> 2
    return d[..., None] if nbytes == 4 else d[..., None] + AR[nbytes >> 2]


def _lds_bytes_race(w, a, nbytes, write, inflight=False):
    """Race check of an unaligned or sub-dword access (a: addresses of the active lanes)."""
    return _lds_race(w, np.unique(((a.reshape(-1)[:, None] + AR[nbytes]) >> 2).ravel()), write, inflight)


def lds_load(w, addr, nbytes, wrap=False):
    """uint8 [64, nbytes * k] of LDS read at addr int [64] (or [64, k]: k accesses per lane, in
    address order); inactive lanes read address 0."""
    a = _lds_addr(w, addr, nbytes, wrap)
    d = _lds_dwords(w, a, nbytes)
    if d is not None:     # aligned dwords: gather 32-bit words
        if w.race:
            _lds_race(w, d if w.full else d[w.mask], False)
        return w.wg.lds32[d].reshape(64, -1).view(np.uint8)
    if w.race:
        _lds_bytes_race(w, a if w.full else a[w.mask], nbytes, False)
    return w.wg.lds[a[..., None] + AR[nbytes]].reshape(64, -1)


def lds_store(w, addr, data, ins=None, inflight=False, wrap=False):
    """data: uint8 [64, nbytes]. Returns the written dword indices in race mode."""
    nbytes = data.shape[1]
    a = _lds_addr(w, addr, nbytes, wrap)
    am = a if w.full else a[w.mask]
    d = None
    if w.race:
        d = _lds_dwords(w, am, nbytes)
        d = _lds_race(w, d.ravel(), True, inflight) if d is not None else \
            _lds_bytes_race(w, am, nbytes, True, inflight)
    if w.full:
        w.wg.lds[a[:, None] + AR[nbytes]] = data
    else:
        w.wg.lds[am[:, None] + AR[nbytes]] = data[w.mask]
    return d


# ---------------------------------------------------------------------------- memory

class SparseBuffer:
    """Lazily paged device buffer (may exceed 4 GB); unwritten pages read as zero."""
    PAGE = 1 << 16

    def __init__(self, nbytes: int, address: int):
        self.nbytes, self.address, self.pages = int(nbytes), int(address), {}

    def _page(self, p, create):
        pg = self.pages.get(p)
        if pg is None and create:
            pg = self.pages[p] = np.zeros(self.PAGE, np.uint8)
        return pg

    def write(self, off: int, data):
        b = _bytes_of(data)
        if off < 0 or off + b.size > self.nbytes:
            raise EmulatorFault(f"sparse buffer write [{off}, {off + b.size}) outside {self.nbytes} bytes")
        self.scatter(off + np.arange(b.size, dtype=np.int64), b)

    def read(self, off: int, n: int):
        import torch
        if off < 0 or off + n > self.nbytes:
            raise EmulatorFault(f"sparse buffer read [{off}, {off + n}) outside {self.nbytes} bytes")
        return torch.from_numpy(self.gather(off + np.arange(n, dtype=np.int64)).copy())

    def gather(self, idx):
        out = np.zeros(idx.shape, np.uint8)
        pages = idx >> 16
        for p in np.unique(pages):
            pg = self._page(int(p), False)
            if pg is not None:
                sel = pages == p
                out[sel] = pg[idx[sel] & 0xFFFF]
        return out

    def scatter(self, idx, vals):
        pages = idx >> 16
        for p in np.unique(pages):
            sel = pages == p
            self._page(int(p), True)[idx[sel] & 0xFFFF] = vals[sel]


def _bytes_of(data):
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    import torch
    if isinstance(data, torch.Tensor):
        t = data.detach().contiguous().cpu()
        return t.reshape(-1).view(torch.uint8).numpy()
    return np.frombuffer(bytes(data), np.uint8)


class _Region:
    __slots__ = ("base", "size", "arr", "sparse")

    def __init__(self, base, size, arr=None, sparse=None):
        self.base, self.size, self.arr, self.sparse = base, size, arr, sparse

    def gather(self, idx):
        return self.arr[idx] if self.sparse is None else self.sparse.gather(idx)

    def scatter(self, idx, vals):
        if self.sparse is None:
            self.arr[idx] = vals
        else:
            self.sparse.scatter(idx, vals)


class Memory:
    """Registered global memory regions addressed by real (or fake, for sparse) addresses."""

    def __init__(self):
        self.regions, self.bases = [], []

    def add(self, base, size, arr=None, sparse=None):
        for r in self.regions:
            if r.base <= base and base + size <= r.base + r.size:
                return
        i = bisect.bisect(self.bases, base)
        self.regions.insert(i, _Region(base, size, arr, sparse))
        self.bases.insert(i, base)

    def add_host(self, ptr, size):
        if size:
            arr = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
            self.add(ptr, size, arr)

    def _find(self, lo, hi):
        i = bisect.bisect(self.bases, lo) - 1
        if i >= 0:
            r = self.regions[i]
            if hi <= r.base + r.size:
                return r
        return None

    def _split(self, addr, mask, nbytes):
        """Yield (region, lane mask) for the active lanes; faults on unmapped lanes."""
        a = addr[mask]
        if a.size == 0:
            return
        r = self._find(int(a.min()), int(a.max()) + nbytes)
        if r is not None:
            yield r, mask
            return
        left = mask.copy()
        for lane in np.nonzero(mask)[0]:
            if not left[lane]:
                continue
            r = self._find(int(addr[lane]), int(addr[lane]) + nbytes)
            if r is None:
                raise EmulatorFault(f"global access outside any registered buffer: lane {int(lane)}, "
                                    f"address {int(addr[lane]):#x}, {nbytes} bytes")
            sel = left & (addr >= u64(r.base)) & (addr + u64(nbytes) <= u64(r.base + r.size))
            left &= ~sel
            yield r, sel

    def load(self, addr, mask, nbytes):
        """uint8 [64, nbytes]; inactive lanes read 0."""
        addr = np.asarray(addr, u64)
        out = None
        for r, sel in self._split(addr, mask, nbytes):
            off = np.where(sel, addr - u64(r.base), 0).astype(np.int64)
            data = r.gather(off[:, None] + AR[nbytes])
            if out is None and sel is mask:
                return data
            if out is None:
                out = np.zeros((64, nbytes), np.uint8)
            out[sel] = data[sel]
        return out if out is not None else np.zeros((64, nbytes), np.uint8)

    def store(self, addr, mask, data):
        addr = np.asarray(addr, u64)
        nbytes = data.shape[1]
        for r, sel in self._split(addr, mask, nbytes):
            off = (addr[sel] - u64(r.base)).astype(np.int64)
            r.scatter(off[:, None] + AR[nbytes], data[sel])

    def atomic(self, addr, mask, dtype, fn):
        """Lane-ordered read-modify-write: new = fn(old, lanes) on the lanes' elements of
        dtype; lanes hitting the same address apply one after another. Returns old [64]."""
        dt = np.dtype(dtype)
        n = dt.itemsize
        addr = np.asarray(addr, u64)
        old = np.zeros(64, dt)
        act = np.nonzero(mask)[0]
        if act.size == 0:
            return old
        groups = [act] if np.unique(addr[act]).size == act.size else [np.array([l]) for l in act]
        for lanes in groups:
            m = np.zeros(64, bool)
            m[lanes] = True
            cur = self.load(addr, m, n)[lanes].reshape(-1).view(dt)
            old[lanes] = cur
            new = np.asarray(fn(cur, lanes), dt)
            buf = np.zeros((64, n), np.uint8)
            buf[lanes] = new.view(np.uint8).reshape(-1, n)
            self.store(addr, m, buf)
        return old


# ---------------------------------------------------------------------------- waves

class Workgroup:
    def __init__(self, lds_bytes, race):
        self.lds = np.zeros((lds_bytes + 3) & ~3, np.uint8)
        self.lds32 = self.lds.view(np.uint32)
        self.epoch = 0
        if race:
            nd = (lds_bytes + 3) // 4     # last writer / reader stamps, initially epoch -1
            self.lw = np.full(nd, -1, np.int64)
            self.lr = np.full(nd, -1, np.int64)


class Wave:
    def __init__(self, emu, prog, kernel, wg, wid, nvgpr):
        self.emu, self.prog, self.kernel, self.wg, self.wid = emu, prog, kernel, wg, wid
        self.V = np.zeros((64, nvgpr), u32)
        self.V16, self.V64 = self.V.view(u16), self.V.view(u64)
        self.S = [0] * 256
        self.scc = 0
        self.pc = 0
        self.stop = self.done = False
        self.race = prog.race
        self.pend, self.vmq, self.lgkmq = {}, [], []
        self.set_exec(0)

    def set_exec(self, x):
        x &= FULL
        self.exec = x
        self.S[EXEC], self.S[EXEC + 1] = x & 0xFFFFFFFF, x >> 32
        self.full = x == FULL
        self.mask = np.ones(64, bool) if self.full else mask_of(x)


# ---------------------------------------------------------------------------- programs

class Program:
    def __init__(self, text, race):
        self.text, self.race = text, race
        self.codes, self.metas = _asm.parse(text)
        self.kernels = [k for k in self.metas if k in self.codes]
        self._decoded = {}
        self.meta = None

    def kernel_meta(self, name):
        if name not in self.metas:
            raise KeyError(f"kernel {name!r} not in program (has {self.kernels})")
        return self.metas[name]

    def decoded(self, name):
        """Closures of the kernel's instructions (built once; raises UnsupportedInstruction)."""
        if name in self._decoded:
            return self._decoded[name]
        code = self.codes[name]
        view = _KernelView(self, name)
        fns = []
        for i, ins in enumerate(code.instrs):
            ins.prog, ins.index = view, i
            for op in ins.ops:
                if op.kind == "label":
                    if op.text not in code.labels:
                        raise UnsupportedInstruction(f"unknown label {op.text} at {ins.where()}")
                    ins.target = code.labels[op.text]
            b = HANDLERS.get(ins.base) or HANDLERS.get(ins.mnemonic)
            if b is None:
                raise UnsupportedInstruction(f"unsupported instruction {ins.mnemonic!r} in {ins.where()}")
            try:
                fns.append(b(ins))
            except EmulatorError:
                raise
            except Exception as e:
                raise UnsupportedInstruction(f"cannot decode {ins.where()}: {e!r}") from e
        self._decoded[name] = (fns, code.instrs)
        return self._decoded[name]


class _KernelView:
    """What a builder sees as ins.prog: the program's race flag and the kernel's metadata."""

    def __init__(self, prog, name):
        self.race, self.meta, self.program = prog.race, prog.metas[name], prog


# ---------------------------------------------------------------------------- emulator

_HIDDEN = {"hidden_block_count_x": lambda g, b, d: g[0], "hidden_block_count_y": lambda g, b, d: g[1],
           "hidden_block_count_z": lambda g, b, d: g[2], "hidden_group_size_x": lambda g, b, d: b[0],
           "hidden_group_size_y": lambda g, b, d: b[1], "hidden_group_size_z": lambda g, b, d: b[2],
           "hidden_grid_dims": lambda g, b, d: 1 + (g[1] * b[1] > 1 or g[2] * b[2] > 1) + (g[2] * b[2] > 1),
           "hidden_dynamic_lds_size": lambda g, b, d: d,
           "hidden_shared_base": lambda g, b, d: SHARED_BASE >> 32}


class Emulator:
    def __init__(self, arch="gfx950", race_check=True, wg_order="linear", seed=0):
        if arch != "gfx950":
            raise ValueError(f"only gfx950 is emulated, not {arch}")
        if wg_order not in ("linear", "shuffled"):
            raise ValueError("wg_order must be 'linear' or 'shuffled'")
        self.arch, self.race, self.wg_order, self.seed = arch, race_check, wg_order, seed
        # Sparse buffers live in [2^47, 2^48): a buffer resource holds a 48-bit base (as the GPU's
        # virtual addresses), and x86-64 user space (host tensors) stays below 2^47.
        self._next_sparse = 1 << 47
        self.wave_instructions = 0
        self.mem = None

    def load(self, asm_text: str) -> Program:
        return Program(asm_text, self.race)

    @staticmethod
    def unsupported_mnemonics(asm_text: str) -> set:
        codes, _ = _asm.parse(asm_text)
        return {i.mnemonic for c in codes.values() for i in c.instrs
                if i.base not in HANDLERS and i.mnemonic not in HANDLERS}

    def sparse_buffer(self, nbytes: int) -> SparseBuffer:
        b = SparseBuffer(nbytes, self._next_sparse)
        self._next_sparse += (int(nbytes) + (1 << 32) + 0xFFFF) & ~0xFFFF   # 4 GB guard gap
        return b

    # -- kernarg packing
    def pack_kernarg(self, prog, kernel, grid, block, args, dynamic_lds=0) -> bytes:
        import torch
        meta = prog.kernel_meta(kernel)
        explicit = [a for a in meta.args if not a.value_kind.startswith("hidden_")]
        if len(args) != len(explicit):
            raise TypeError(f"kernel {kernel!r} takes {len(explicit)} arguments, got {len(args)}")
        buf = bytearray(max(meta.kernarg_size, 1))
        for n, (a, v) in enumerate(zip(explicit, args)):
            if isinstance(v, torch.Tensor):
                if v.device.type != "cpu":
                    raise TypeError(f"argument {n}: only CPU tensors can be emulated")
                v, kind = v.data_ptr(), "ptr"
            elif isinstance(v, SparseBuffer):
                v, kind = v.address, "ptr"
            else:
                kind = "float" if isinstance(v, float) else "int"
            if a.value_kind == "global_buffer" and kind == "float":
                raise TypeError(f"argument {n} of {kernel!r} is a pointer, got {v!r}")
            if kind == "float":
                fmt = {2: "<e", 4: "<f", 8: "<d"}.get(a.size)
                if fmt is None:
                    raise TypeError(f"argument {n}: cannot pack a float into {a.size} bytes")
                raw = struct.pack(fmt, v)
            else:
                raw = (int(v) & ((1 << (8 * a.size)) - 1)).to_bytes(a.size, "little")
            buf[a.offset:a.offset + a.size] = raw
        for a in meta.args:
            f = _HIDDEN.get(a.value_kind)
            if f is not None and a.offset + a.size <= len(buf):
                buf[a.offset:a.offset + a.size] = int(f(grid, block, dynamic_lds)).to_bytes(a.size, "little")
        return bytes(buf)

    def launch(self, prog, kernel, grid=(1, 1, 1), block=(64, 1, 1), args=(), dynamic_lds=0):
        grid, block = _dim3(grid), _dim3(block)
        kernarg = self.pack_kernarg(prog, kernel, grid, block, list(args), dynamic_lds)
        import torch
        bufs = [a for a in args if isinstance(a, (torch.Tensor, SparseBuffer))]
        self.launch_kernarg(prog, kernel, grid, block, kernarg, bufs, dynamic_lds)

    def launch_kernarg(self, prog, kernel, grid, block, kernarg: bytes, buffers, dynamic_lds=0):
        import torch
        grid, block = _dim3(grid), _dim3(block)
        meta = prog.kernel_meta(kernel)
        fns, instrs = prog.decoded(kernel)
        mem = self.mem = Memory()
        for b in buffers:
            if isinstance(b, SparseBuffer):
                mem.add(b.address, b.nbytes, sparse=b)
            elif isinstance(b, torch.Tensor):
                st = b.untyped_storage()
                mem.add_host(st.data_ptr(), st.nbytes())
            else:
                raise TypeError(f"buffers: expected torch tensors or sparse buffers, got {type(b)}")
        karg = np.frombuffer(bytearray(kernarg) + bytes(64), np.uint8).copy()
        mem.add(karg.ctypes.data, karg.size, karg)
        packet = np.zeros(64, np.uint8)   # hsa_kernel_dispatch_packet: sizes at 4..23
        struct.pack_into("<HHHHIII", packet, 2, 0, block[0], block[1], block[2], 0,
                         grid[0] * block[0], grid[1] * block[1])
        struct.pack_into("<I", packet, 20, grid[2] * block[2])
        mem.add(packet.ctypes.data, packet.size, packet)
        lds_bytes = meta.group_segment_fixed_size + dynamic_lds
        if lds_bytes > LDS_MAX:
            raise EmulatorFault(f"kernel {kernel!r} needs {lds_bytes} bytes of LDS; gfx950 has {LDS_MAX}")
        order = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
        if self.wg_order == "shuffled":
            np.random.default_rng(self.seed).shuffle(order)
        ctx = (meta, fns, instrs, block, grid, karg.ctypes.data, packet.ctypes.data, lds_bytes)
        with np.errstate(all="ignore"):  # GPUs raise no FP exceptions: inf/NaN results are data
            for wgid in order:
                self._run_workgroup(prog, kernel, ctx, wgid)
        self._keep = (karg, packet)

    def _init_wave(self, w, meta, block, grid, wgid, karg_ptr, pkt_ptr, wid):
        d = meta.d
        s = 0
        user = []
        if d("user_sgpr_private_segment_buffer"):
            user += [0, 0, 0, 0]
        if d("user_sgpr_dispatch_ptr"):
            user += [pkt_ptr & 0xFFFFFFFF, pkt_ptr >> 32]
        if d("user_sgpr_queue_ptr"):
            user += [0, 0]
        if d("user_sgpr_kernarg_segment_ptr"):
            user += [karg_ptr & 0xFFFFFFFF, karg_ptr >> 32]
        if d("user_sgpr_dispatch_id"):
            user += [0, 0]
        if d("user_sgpr_flat_scratch_init"):
            user += [0, 0]
        if d("user_sgpr_private_segment_size"):
            user += [0]
        npre = d("user_sgpr_kernarg_preload_length")
        if npre:   # preloaded kernargs follow the other user SGPRs [LLVM AMDGPUUsage, preload]
            kb = self.mem.load(np.full(64, karg_ptr + 4 * d("user_sgpr_kernarg_preload_offset"), u64),
                               np.eye(1, 64, dtype=bool)[0], 4 * npre)[0].view(u32)
            user += [int(x) for x in kb]
        s = d("user_sgpr_count", len(user))
        w.S[:len(user)] = user
        for axis, key in enumerate(("x", "y", "z")):
            if d(f"system_sgpr_workgroup_id_{key}", 1 if key == "x" else 0):
                w.S[s] = wgid[axis]
                s += 1
        if d("system_sgpr_workgroup_info"):
            s += 1
        if d("enable_private_segment") or d("system_sgpr_private_segment_wavefront_offset"):
            w.S[s] = 0
        nthreads = block[0] * block[1] * block[2]
        t = np.arange(wid * 64, wid * 64 + 64)
        tx, ty, tz = t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1])
        comp = d("system_vgpr_workitem_id")
        # gfx90a+ pack the work-item ids into v0: x | y << 10 | z << 20
        w.V[:, 0] = (tx | ((ty << 10) if comp >= 1 else 0) | ((tz << 20) if comp >= 2 else 0)).astype(u32)
        n = min(64, nthreads - wid * 64)
        w.set_exec((1 << n) - 1)

    def _run_workgroup(self, prog, kernel, ctx, wgid):
        meta, fns, instrs, block, grid, karg_ptr, pkt_ptr, lds_bytes = ctx
        wg = Workgroup(lds_bytes, prog.race)
        nthreads = block[0] * block[1] * block[2]
        nv = 512 if meta.agpr_count or meta.d("accum_offset", 0) else max(8, ((meta.vgpr_count + 7) // 8) * 8)
        nv = max(nv, meta.d("next_free_vgpr", 0) + 2)
        waves = []
        for wid in range((nthreads + 63) // 64):
            w = Wave(self, prog, kernel, wg, wid, nv + (nv & 1))
            self._init_wave(w, meta, block, grid, wgid, karg_ptr, pkt_ptr, wid)
            waves.append(w)
        active = waves
        while active:
            for w in active:
                self._run_wave(w, fns, instrs)
            active = [w for w in active if not w.done]
            for w in active:
                w.stop = False
            wg.epoch += 1

    def _run_wave(self, w, fns, instrs):
        n = 0
        pc = w.pc
        try:
            while not w.stop:
                pc = w.pc
                w.pc = pc + 1
                fns[pc](w)
                n += 1
        except IndexError:
            if w.pc > len(fns):
                raise EmulatorFault(f"kernel {w.kernel!r}: execution ran past the end of the code") from None
            raise
        except EmulatorError as e:
            ins = instrs[pc]
            if getattr(e, "where", None) is None:
                msg = f"{e} [{ins.where()}]" if ins.where() not in str(e) else str(e)
                e2 = type(e)(msg)
                e2.where = ins
                raise e2 from None
            raise
        finally:
            self.wave_instructions += n


def _dim3(d):
    d = tuple(int(x) for x in (d if isinstance(d, (tuple, list)) else (d,)))
    return (d + (1, 1, 1))[:3]
