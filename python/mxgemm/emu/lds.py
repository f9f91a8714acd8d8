"""LDS (workgroup shared memory): bounds-checked addressing, loads and stores, with the
cross-wave race checks of ``race``."""
from __future__ import annotations

import numpy as np

from . import race
from .isa import EmulatorFault

AR = [np.arange(n, dtype=np.int64) for n in range(65)]   # byte offsets 0..n-1 of an n-byte access


def addresses(w, addr, nbytes, wrap=False):
    """Bounds-checked int64 byte addresses into the batch's LDS (inactive lanes -> their
    region's start) of workgroup LDS addresses addr; wrap: 32-bit address math, applied only
    when some address is out of range (in-range ones are unchanged by it)."""
    a = addr if isinstance(addr, np.ndarray) and addr.dtype == np.int64 else np.asarray(addr).astype(np.int64)
    if w.emu.tracer is not None:
        w.emu.tracer.lds(a, w.mask, nbytes)
    lim = w.wg.lds_size
    if w.full:
        f = a.ravel()
        if f[f.argmin()] >= 0 and f[f.argmax()] + nbytes <= lim:   # argmin/argmax: cheaper than min/max
            return _in_batch(w, a)
        if wrap:
            return addresses(w, a & 0xFFFFFFFF, nbytes)
        bad = (a < 0) | (a + nbytes > lim)
    else:
        if wrap:
            a = a & 0xFFFFFFFF
        m = w.mask if a.ndim == 1 else w.mask[:, None]
        bad = m & ((a < 0) | (a + nbytes > lim))
    if np.count_nonzero(bad):
        j = int(np.argmax(bad))
        raise EmulatorFault(f"LDS access outside the {lim}-byte allocation: {w.lane_name(j // (a.size // w.n))}, "
                            f"address {int(a.ravel()[j]):#x}")
    return _in_batch(w, np.where(m, a, 0))


def _in_batch(w, a):
    """Workgroup LDS addresses a [n] or [n, k] as addresses into the batch's LDS."""
    b = w.lds_base
    if b.__class__ is int:
        return a + b if b else a
    return a + (b if a.ndim == 1 else b[:, None])


def _dwords(w, a, nbytes):
    """Dword indices [..., n] of an access of nbytes per address if every address is dword
    aligned (None otherwise)."""
    if nbytes & 3 or np.count_nonzero(a & 3):
        return None
    d = a >> 2
    return d[..., None] if nbytes == 4 else d[..., None] + AR[nbytes >> 2]


def _rows(w):
    """Lane numbers of the active lanes (what race.lds_check needs for a lockstep unit)."""
    return None if w.k == 1 else np.nonzero(w.mask)[0]


def _bytes_race(w, a, nbytes, write, inflight=False):
    """Race check of an unaligned or sub-dword access (a: addresses of the active lanes): per
    byte, except direct-to-LDS data in flight (dword stamps)."""
    if inflight:
        if w.k > 1:
            d = (a.reshape(a.shape[0], -1)[:, :, None] + AR[nbytes]).reshape(a.shape[0], -1) >> 2
            return race.lds_check(w, d, write, inflight, _rows(w))
        return race.lds_check(w, np.unique(((a.reshape(-1)[:, None] + AR[nbytes]) >> 2).ravel()), write, inflight)
    return race.lds_check_bytes(w, a, nbytes, write)


def load(w, addr, nbytes, wrap=False):
    """uint8 [w.n, nbytes * k] of LDS read at addr int [w.n] (or [w.n, k]: k accesses per lane, in
    address order); inactive lanes read address 0."""
    a = addresses(w, addr, nbytes, wrap)
    d = _dwords(w, a, nbytes)
    if d is not None:     # aligned dwords: gather 32-bit words
        if w.race:
            race.lds_check(w, d if w.full else d[w.mask], False, rows=_rows(w))
        return w.wg.lds32[d].reshape(w.n, -1).view(np.uint8)
    if w.race:
        _bytes_race(w, a if w.full else a[w.mask], nbytes, False)
    return w.wg.lds[a[..., None] + AR[nbytes]].reshape(w.n, -1)


def store(w, addr, data, ins=None, inflight=False, wrap=False):
    """data: uint8 [w.n, nbytes]. Returns the written dword indices in race mode."""
    nbytes = data.shape[1]
    a = addresses(w, addr, nbytes, wrap)
    am = a if w.full else a[w.mask]
    d = None
    if w.race:
        d = _dwords(w, am, nbytes)
        if d is None:
            d = _bytes_race(w, am, nbytes, True, inflight)
        elif not inflight:
            return _checked_store(w, a, am, d, data, nbytes)
        else:
            d = race.lds_check(w, d.ravel() if w.k == 1 else d, True, inflight, _rows(w))
    if w.full:
        w.wg.lds[a[:, None] + AR[nbytes]] = data
    else:
        w.wg.lds[am[:, None] + AR[nbytes]] = data[w.mask]
    return d


def _checked_store(w, a, am, d, data, nbytes):
    """An aligned store in race mode, checked after writing: a lane that writes the bytes the
    dword already holds changes nothing another wave can see, and lanes of one instruction that
    write one dword alike leave it as each of them wrote it (Triton's reductions store a value
    replicated across waves that way), so neither is a race."""
    idx = am[:, None] + AR[nbytes]
    new = data if w.full else data[w.mask]
    old = w.wg.lds[idx]
    unchanged = (old == new).all(axis=1)
    w.wg.lds[idx] = new
    agree = (w.wg.lds[idx] == new).all(axis=1)
    ndw = d.shape[-1]
    try:
        if w.k == 1:
            return race.lds_check(w, d.ravel(), True, False, None, (np.repeat(unchanged, ndw), np.repeat(agree, ndw)))
        return race.lds_check(w, d, True, False, _rows(w), (unchanged[:, None], agree[:, None]))
    except BaseException:
        w.wg.lds[idx] = old   # undone: the emulator may run the instruction again wave by wave
        raise
