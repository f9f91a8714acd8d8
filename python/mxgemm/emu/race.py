"""Race tracking: registers read or overwritten while a load is outstanding (no s_waitcnt
retired it), and LDS bytes two waves touch in one barrier epoch.

Registers: a wave keeps the outstanding memory ops per wait counter of its target (``qs``, one
queue per counter, e.g. vmcnt and lgkmcnt on gfx950) and a map ``pend`` register key -> op. LDS: per dword the last
writer and last reader are packed as
epoch << WB | wave; an access conflicts with another wave's access in the same epoch. Reads
while no dword has been written in the epoch (``wtop``, an upper bound of every writer stamp)
cannot conflict; they are logged, and their reader stamps applied only when a write of the
same epoch follows (the only access that looks at them)."""
from __future__ import annotations

import numpy as np

from .isa import RaceError

SKEY = 1000                               # race-tracking key of s<i> is SKEY + i
INFLIGHT = 1 << 30                        # LDS epoch stamp of a direct-to-LDS write not yet retired
WB, WMASK = 8, 255                        # LDS race stamps: epoch << WB | wave (wave < 255)
SEVERAL = WMASK                           # reader "wave" when several waves read in one epoch


def key_name(k):
    return f"s{k - SKEY}" if k >= SKEY else f"v{k}"


# Vector-memory loads counted by the vector-memory counter alone (flat may go to LDS instead)
# return in issue order: a later one may overwrite an earlier one's register with no wait, its
# data lands last. LLVM's SIInsertWaitcnts waits on such a write-after-write only between VMEM
# types that may return out of order (sampler, BVH); docs/gfx950_isa.md §7.
_VMEM_LOADS = ("global_load", "buffer_load", "scratch_load")


def check_pending(w, keys, ins, what="reads"):
    for k in keys:
        rec = w.pend.get(k)
        if rec is not None:
            if what == "overwrites" and ins.base.startswith(_VMEM_LOADS) and rec.ins.base.startswith(_VMEM_LOADS):
                continue
            raise RaceError(f"{ins.where()} {what} {key_name(k)} while the load at line {rec.ins.line} "
                            f"({rec.ins.text.strip()}) is outstanding (no s_waitcnt retired it)")


class _Rec:
    __slots__ = ("keys", "ins", "kind", "lds")

    def __init__(self, keys, ins, kind, lds):
        self.keys, self.ins, self.kind, self.lds = keys, ins, kind, lds


def track_load(w, ins, counter, keys=(), kind="load", lds=None):
    """Record an outstanding memory op (counter: the memory class, 'vm' (vector memory), 'lgkm'
    (LDS, scalar memory) or 'tensor' (tensor data mover); kind 'load', 'store', 'smem',
    'lds_write' (lds = dword indices written), 'async' (direct-to-LDS)); the target routes
    (counter, kind) to one of its wait counters."""
    if not w.race:
        return
    rec = _Rec(keys, ins, kind, lds)
    w.qs[w.T.route[counter, kind]].append(rec)
    for k in keys:
        w.pend[k] = rec


def _retire(w, rec):
    for k in rec.keys:
        if w.pend.get(k) is rec:
            del w.pend[k]
    if rec.kind == "async" and rec.lds is not None:   # direct-to-LDS data now counts as written
        g = w.wg
        d = rec.lds
        k = g.lw[d]
        d, k = d[(k >> WB == INFLIGHT) & _own(w, k)], k[(k >> WB == INFLIGHT) & _own(w, k)]
        g.lw[d] = (g.epoch << WB) | (k & WMASK)


def _own(w, k):
    """Stamps k made by a wave of unit w."""
    x = k & WMASK
    return x == w.wid if w.k == 1 else (x >= w.wid) & (x < w.wid + w.k)


def waitcnt(w, i, n):
    """Wait until counter i of the target counts at most n ops: retire ops in issue order, but
    scalar loads may return out of order, so only a count of 0 is known to cover them
    [ISA §4.4; docs/gfx950_isa.md §7]."""
    q = w.qs[i]
    if len(q) <= n:
        return
    if n == 0:
        for rec in q:
            _retire(w, rec)
        q.clear()
        return
    need = len(q) - n - sum(1 for r in q if r.kind == "smem")
    keep = []
    for rec in q:
        if need > 0 and rec.kind != "smem":
            _retire(w, rec)
            need -= 1
        else:
            keep.append(rec)
    w.qs[i] = keep


def at_barrier(w):
    """A wave arrives at s_barrier: LDS writes it has not waited for are not guaranteed
    visible after the barrier, so they count as written in the next epoch."""
    g = w.wg
    for rec in (r for q in w.qs for r in q):
        if rec.kind == "lds_write":
            d = rec.lds
            k = g.lw[d]
            mine = _own(w, k)
            d, k = d[mine], k[mine]
            g.lw[d] = np.maximum(k, ((g.epoch + 1) << WB) | (k & WMASK))   # same wave: max of epochs
            g.wtop = max(g.wtop, ((g.epoch + 1) << WB) | WMASK)
            if g.bytes is not None:
                g.bytes.subw[d] = False    # its bytes are not known any more: the whole dword counts


def next_epoch(g):
    """Workgroup g passes a barrier. Reads logged in the old epoch can no longer conflict; the
    top writer stamp is recomputed only if a direct-to-LDS write made it INFLIGHT."""
    g.epoch += 1
    if g.lw is not None:
        g.reads.clear()
        if g.wtop >= INFLIGHT << WB:
            g.wtop = int(g.lw.max())


def lds_check(w, d, write, inflight=False, rows=None, alike=None):
    """Race check and stamp of an LDS access. d: dword indices of the active lanes' access, one
    row (first axis) per active lane; rows: their lane numbers (lockstep units, else unused);
    alike: for a write already made, (unchanged, agree) masks shaped like d: the dword kept its
    bytes, and every lane of this access writing it wrote the same bytes (lds.py)."""
    if not d.size:     # no active lane
        return d
    g = w.wg
    EK = g.epoch << WB
    if not write and g.wtop < EK:   # no dword written this epoch or in flight: the read conflicts
        g.reads.append((w, d, rows))   # with nothing yet; its reader stamps matter only to a
        if len(g.reads) >= 256:        # later write of this epoch, which applies them first
            _stamp_reads(g)            # (or now: a bounded log)
        return d
    _stamp_reads(g)
    return _check(w, d, write, inflight, rows, alike)


def _stamp_reads(g):
    reads, g.reads = g.reads, []
    for w, d, rows in reads:
        _check(w, d, False, False, rows)


def _check(w, d, write, inflight, rows, alike=None):
    g = w.wg
    EK = g.epoch << WB
    if w.k == 1:
        X = w.wid
    else:                          # wave id per row, broadcast over the row's dwords
        X = (w.wid + rows // w.T.wave).reshape((-1,) + (1,) * (d.ndim - 1))
    unchanged, agree = alike if alike is not None else (np.False_, np.False_)
    k = g.lw[d]
    if k.ravel()[k.argmax()] >= EK:    # some dword written this epoch (or still in flight)
        bad = (k >= EK) & (((k & WMASK) != X) | (k >= INFLIGHT << WB))
        bad &= ~unchanged | (k >= INFLIGHT << WB)   # rewriting what another wave wrote: invisible
        if np.count_nonzero(bad):
            _error(w, d, bad, write, X)
    r = g.lr[d]
    other = (r >= EK) & (r != EK | X)   # read this epoch by another wave (reader epochs never exceed E)
    if write:
        other &= ~unchanged                        # a reader saw these bytes either way
        if w.k > 1:     # two waves of this access write one dword: stamp each element's wave into
            g.scratch[d] = X                       # scratch; an element not reading its own back
            other |= (g.scratch[d] != X) & ~agree  # shares the dword with another wave
        if np.count_nonzero(other):
            _error(w, d, other, write, X)
        if g.bytes is not None:
            g.bytes.subw[d] = False
        g.lw[d] = ((INFLIGHT << WB) if inflight else EK) | X
        g.wtop = max(g.wtop, ((INFLIGHT << WB) if inflight else EK) | WMASK)
    else:
        if g.bytes is not None:
            g.bytes.subr[d] = False
        s = np.where(other, EK | SEVERAL, EK | X)
        g.lr[d] = s
        if w.k > 1:     # a dword two waves of this access read: the stamp read back differs
            mixed = g.lr[d] != s
            if np.count_nonzero(mixed):
                g.lr[d[mixed]] = EK | SEVERAL
    return d


class _ByteStamps:
    """Per-byte writer / reader stamps of sub-dword LDS accesses, and per dword whether every
    write / read of the current epoch was sub-dword (then its dword stamp says little: another
    wave may have touched only other bytes)."""

    def __init__(self, g):
        n = g.lds.size
        self.w, self.r, self.scratch = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.int64)
        self.subw, self.subr = np.zeros(n // 4, bool), np.zeros(n // 4, bool)


def lds_check_bytes(w, a, nbytes, write):
    """Race check and stamp of a sub-dword or unaligned LDS access at byte granularity (a: byte
    addresses of the active lanes, rows of a lockstep unit first): waves touching different
    bytes of one dword do not race (a byte histogram keeps per-thread byte counters that way).
    Returns the dword indices touched."""
    g = w.wg
    b = g.bytes = g.bytes or _ByteStamps(g)
    _stamp_reads(g)
    EK = g.epoch << WB
    B = (a.reshape(a.shape[0], -1)[:, :, None] + np.arange(nbytes)).reshape(a.shape[0], -1)
    X = np.full(B.shape, w.wid) if w.k == 1 else \
        np.broadcast_to((w.wid + np.nonzero(w.mask)[0] // w.T.wave)[:, None], B.shape)
    D = B >> 2
    kw, kwb = g.lw[D], b.w[B]
    other_w = (kw >= EK) & ((kw & WMASK) != X)
    bad = (other_w & (~b.subw[D] | (kw >= INFLIGHT << WB))) | ((kwb >= EK) & ((kwb & WMASK) != X))
    if write:
        kr, krb = g.lr[D], b.r[B]
        bad |= ((kr >= EK) & (kr != EK | X) & ~b.subr[D]) | ((krb >= EK) & (krb != EK | X))
        if w.k > 1:                       # two waves of this access write one byte
            b.scratch[B] = X
            bad |= b.scratch[B] != X
    if np.count_nonzero(bad):
        i = int(np.argmax(bad.ravel()))
        j, me = int(B.ravel()[i]), int(X.ravel()[i])
        raise RaceError(f"LDS race at byte {j % max(g.lds_size, 4):#x} ({g.where(me)}): "
                        f"{'written' if write else 'read'} here while another wave accesses that byte without an "
                        "s_barrier (and s_waitcnt) in between")
    stamps, dstamps, sub = (b.w, g.lw, b.subw) if write else (b.r, g.lr, b.subr)
    if not write:
        _stamp(stamps, B, np.where((stamps[B] >= EK) & (stamps[B] != EK | X), EK | SEVERAL, EK | X))
    else:
        _stamp(stamps, B, EK | X)
    k = dstamps[D]
    sub[D] = (k < EK) | sub[D]            # an epoch's first access starts the dword's sub-dword run
    _stamp(dstamps, D, np.where((k >= EK) & ((k & WMASK) != X), EK | SEVERAL, EK | X))
    if write:
        g.wtop = max(g.wtop, EK | WMASK)
    return np.unique(D)


def _stamp(stamps, idx, s):
    """stamps[idx] = s, where an index given two different stamps (two waves of one access)
    gets the SEVERAL stamp of their epoch."""
    s = np.broadcast_to(s, idx.shape)
    stamps[idx] = s
    mixed = stamps[idx] != s
    if np.count_nonzero(mixed):
        stamps[idx[mixed]] = (s[mixed] >> WB << WB) | SEVERAL


def _error(w, d, bad, write, X):
    g, EK = w.wg, w.wg.epoch << WB
    i = int(np.argmax(bad.ravel()))
    j = int(d.ravel()[i])
    me = int(np.broadcast_to(X, d.shape).ravel()[i])
    k = int(g.lw[j])
    if k >> WB == INFLIGHT:
        what = "direct-to-LDS data not yet retired by its counter wait (s_waitcnt vmcnt / s_wait_tensorcnt) + barrier"
    else:
        other = (k if k >= EK else int(g.lr[j])) & WMASK
        wave = other % g.nwaves if other != SEVERAL else "(several)"
        what = (f"{'written' if write else 'read'} here while wave {wave} "
                f"accesses it without an s_barrier (and s_waitcnt) in between")
    raise RaceError(f"LDS race at byte {j * 4 % max(g.lds_size, 4):#x} ({g.where(me)}): {what}")
