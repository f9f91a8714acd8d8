"""Waves, workgroups and their scheduling.

The reference order is: each wave runs until it reaches s_barrier (or s_endpgm), wave after
wave in id order; then the barrier epoch advances. To go faster, consecutive waves at the same
instruction with the same outstanding loads run in lockstep as one ``Wave`` of k waves (n = k *
wave size lanes, wave-major). Several workgroups run as one batch (``Workgroups``: one LDS
region each, batch-wide wave ids), so a unit may span workgroups; an SGPR, SCC or EXEC whose
value differs between its waves (the workgroup id, and what scalar code derives from it) is held
as ``PerWave``. This gives the same results as the reference order because, within an epoch,
waves only interact through LDS (race-checked: a correct kernel has no conflicting accesses;
workgroups never share it) and memory (ordered only by atomics; a kernel with global atomics
runs its workgroups one at a time, launch.py). Every wave passes one barrier per release, so
each workgroup's epochs count its own barriers. A scalar-only instruction (``ins.scalar``) that
meets a PerWave value runs once per wave (``scalar_per_wave``). A unit splits, into one unit
per workgroup and then into single waves, before an instruction it cannot run in lockstep
(``Split``): a branch that differs between its waves, an instruction marked per-wave (atomics,
whose order is observable, and cross-lane ops), one that meets a PerWave value it cannot use,
or any error (re-run per wave for an exact report). Waves re-merge at the next barrier. A cluster launch (gfx1250)
runs its workgroups in turn, each up to its next cluster barrier, which every workgroup then
passes together (``run_cluster``)."""
from __future__ import annotations

import numpy as np

from . import race
from .isa import EmulatorError, EmulatorFault, PerWave, RaceError, Split, u16, u32
from .regs import mask_of


class Workgroups:
    """A batch of workgroups that run together: per workgroup an LDS region of ``lds_size``
    bytes and ``nwaves`` waves; wave ids count across the batch (race stamps hold them, so a
    batch has fewer than race.WMASK waves). ids: the workgroup ids, in batch order."""

    def __init__(self, lds_bytes, race, nwaves, lanes, nvgpr, ids=((0, 0, 0),)):
        self.ids, self.nwaves = list(ids), nwaves
        self.lds_size = (lds_bytes + 3) & ~3
        self.lds = np.zeros(self.lds_size * len(self.ids), np.uint8)
        self.lds32 = self.lds.view(np.uint32)
        self.epoch = 0
        self.lw = None
        self.V = np.zeros((nvgpr, len(self.ids) * nwaves * lanes), u32)    # every wave's VGPRs; waves hold views
        self.priv = None     # every lane's private segment, uint8 [lanes, bytes]: made at the first scratch access
        self.cluster = None  # cluster launch: the cluster's workgroups by flat id (this one included)
        self.cluster_signals = 0   # s_barrier_signal -3 of its waves since the last cluster barrier
        self.signals = np.zeros(len(self.ids), np.int64)   # s_barrier_signal -1 of each workgroup's waves, ever
        self.perwave_splits = 0    # splits of units spanning workgroups or holding PerWave values
        if race:
            nd = self.lds.size // 4     # last writer / reader stamps, initially epoch -1
            self.lw = np.full(nd, -1, np.int64)
            self.lr = np.full(nd, -1, np.int64)
            self.wtop = -1        # no stamp in lw exceeds it
            self.reads = []       # race.lds_check: reads of this epoch whose stamps are not yet in lr
            self.scratch = np.zeros(nd, np.int64)   # race.lds_check of lockstep units
            self.bytes = None     # race.lds_check_bytes: per-byte stamps, made at the first sub-dword access

    def where(self, wid):
        """'workgroup (x, y, z), wave w' of batch wave id wid."""
        return f"workgroup {self.ids[wid // self.nwaves]}, wave {wid % self.nwaves}"


PERWAVE_SPLITS = 4    # past this many, a batch merges only waves whose scalar state is identical


class Wave:
    """k consecutive waves (k = 1: one wave) of a batch: V (uint32 [nvgpr, n], register-major,
    so a register's lanes are contiguous however many waves the unit has; VGPRs then AGPRs), S (list of Python ints
    in the target's scalar numbering, shared by the
    k waves), scc, exec (the per-wave int) with mask (bool [n]) and full (EXEC all ones), pc,
    and the race-tracking queues. lane: lane index within its wave [n]; wid: first wave id."""

    def __init__(self, emu, prog, kernel, wg, wid, k=1):
        self.emu, self.prog, self.kernel, self.wg, self.wid, self.k = emu, prog, kernel, wg, wid, k
        self.T = T = prog.target
        self.n = n = k * T.wave
        self.V = wg.V[:, wid * T.wave:wid * T.wave + n]
        first, last = wid // wg.nwaves, (wid + k - 1) // wg.nwaves
        self.spans = first != last     # waves of several workgroups
        # byte offset of each lane's LDS region: an int, or int64 [n] for a unit spanning workgroups
        self.lds_base = first * wg.lds_size if not self.spans else \
            np.repeat((wid + np.arange(k)) // wg.nwaves * wg.lds_size, T.wave)
        self.V16 = self.V.view(u16)     # [nvgpr, 2n]: the low and high halves of lane l at 2l, 2l + 1
        self.lane = T.lane if k == 1 else np.tile(T.lane, k)
        self.S = [0] * 256
        self.scc = 0
        self.pc = 0
        self.stop = self.done = False
        self.race = prog.race
        self.pend, self.qs = {}, [[] for _ in T.counters]
        self.exec = 0
        self.signaled = False     # split barriers (gfx12): s_barrier_signal issued, s_barrier_wait not yet
        self.cluster_wait = False  # stopped at the cluster barrier (s_barrier_wait -3)
        self.set_exec(0)

    def set_exec(self, x):
        """EXEC := x, an int or a PerWave (then mask is the waves' masks in turn)."""
        T = self.T
        if x.__class__ is PerWave:
            x = PerWave.of([v & T.full for v in x.v])
            if x.__class__ is PerWave:
                self.exec, self.full = x, False
                self.S[T.exec] = PerWave.of([v & 0xFFFFFFFF for v in x.v])
                self.S[T.exec + 1] = PerWave.of([v >> 32 for v in x.v])
                self.mask = np.concatenate([mask_of(v, T.wave) for v in x.v])
                return
        x &= T.full
        self.exec = x
        self.S[T.exec], self.S[T.exec + 1] = x & 0xFFFFFFFF, x >> 32
        self.full = x == T.full
        if self.full:
            self.mask = np.ones(self.n, bool)
        else:
            m = mask_of(x, T.wave)
            self.mask = m if self.k == 1 else np.tile(m, self.k)

    def private(self, nbytes):
        """This unit's lanes' private (scratch) segments, uint8 [n, nbytes] (rows of the
        workgroup's, so they survive lockstep splits and merges)."""
        wg, wl = self.wg, self.T.wave
        if wg.priv is None:
            wg.priv = np.zeros((wg.V.shape[1], nbytes), np.uint8)
        return wg.priv[self.wid * wl:self.wid * wl + self.n]

    def lane_name(self, j):
        """'lane j' of this wave, or 'wave w, lane j' inside a lockstep unit."""
        wl = self.T.wave
        return f"lane {j}" if self.k == 1 else f"wave {self.wid + j // wl}, lane {j % wl}"

    # -- lockstep units
    def _state(self):
        return self.pc, self.signaled, self.cluster_wait

    def split(self):
        """This unit as one unit per workgroup if it spans several, else as its k single
        waves (their VGPRs are views of the same rows; PerWave SGPRs take their waves' values)."""
        pw = [j for j, x in enumerate(self.S) if x.__class__ is PerWave]
        if pw or self.spans or self.scc.__class__ is PerWave or self.exec.__class__ is PerWave:
            self.wg.perwave_splits += 1
        if self.spans:
            nw = self.wg.nwaves
            cuts = [self.wid] + list(range((self.wid // nw + 1) * nw, self.wid + self.k, nw)) + [self.wid + self.k]
        else:
            cuts = list(range(self.wid, self.wid + self.k + 1))
        out = []
        for a, b in zip(cuts, cuts[1:]):
            w = Wave(self.emu, self.prog, self.kernel, self.wg, a, b - a)
            w.pc, w.stop, w.done, w.signaled = self.pc, self.stop, self.done, self.signaled
            w.cluster_wait = self.cluster_wait
            lo, hi = a - self.wid, b - self.wid
            w.scc = _slice(self.scc, lo, hi)
            w.S = list(self.S)
            for j in pw:
                w.S[j] = _slice(self.S[j], lo, hi)
            w.set_exec(_slice(self.exec, lo, hi))
            w.pend, w.qs = dict(self.pend), [list(q) for q in self.qs]
            out.append(w)
        return out


def _slice(x, lo, hi):
    """Scalar value x of a unit as seen by its waves lo..hi-1."""
    return x if x.__class__ is not PerWave else PerWave.of(list(x.v[lo:hi]))


def _per_wave_values(x, k):
    return list(x.v) if x.__class__ is PerWave else [x] * k


def _queue_sig(w):
    pos = {id(r): j for j, r in enumerate(r for q in w.qs for r in q)}
    return [[(r.ins, r.kind, r.keys) for r in q] for q in w.qs], {k: pos[id(r)] for k, r in w.pend.items()}


def _mergeable(a, b):
    """b continues unit a: same state but SGPRs, SCC and EXEC, which may differ (held as
    PerWave) until units holding PerWave values have split PERWAVE_SPLITS times in the batch."""
    if b.wid != a.wid + a.k or a.done or b.done or a._state() != b._state() or _queue_sig(a) != _queue_sig(b):
        return False
    return a.wg.perwave_splits < PERWAVE_SPLITS or (PerWave.same(a.scc, b.scc) and PerWave.same(a.exec, b.exec)
                                                    and _same_sgprs(a.S, b.S))


def _same_sgprs(a, b):
    try:
        return a == b
    except Split:        # an int against a PerWave
        return False


def _merge(run):
    """One lockstep unit of the consecutive, identical units run."""
    if len(run) == 1:
        return run[0]
    a = run[0]
    w = Wave(a.emu, a.prog, a.kernel, a.wg, a.wid, sum(u.k for u in run))
    w.pc, w.S, w.signaled, w.cluster_wait = a.pc, list(a.S), a.signaled, a.cluster_wait
    rebuild = {j for j, x in enumerate(a.S) if x.__class__ is PerWave}
    rebuild.update(j for u in run[1:] if not _same_sgprs(u.S, a.S) for j, (x, y) in enumerate(zip(a.S, u.S))
                   if not PerWave.same(x, y))
    for j in rebuild:
        w.S[j] = PerWave.of([v for u in run for v in _per_wave_values(u.S[j], u.k)])
    w.scc = PerWave.of([v for u in run for v in _per_wave_values(u.scc, u.k)])
    w.set_exec(PerWave.of([v for u in run for v in _per_wave_values(u.exec, u.k)]))
    recs = {}
    w.qs = []
    for i in range(len(a.qs)):
        q = []
        for parts in zip(*(u.qs[i] for u in run)):
            r = parts[0]
            if r.lds is not None:   # LDS dwords of every wave of the unit
                r = type(r)(r.keys, r.ins, r.kind, np.concatenate([p.lds.ravel() for p in parts]))
            recs[id(parts[0])] = r
            q.append(r)
        w.qs.append(q)
    w.pend = {k: recs[id(r)] for k, r in a.pend.items()}
    return w


def _merge_all(units):
    out, run = [], []
    for u in units:
        if run and _mergeable(run[-1], u):
            run.append(u)
        else:
            if run:
                out.append(_merge(run))
            run = [u]
    if run:
        out.append(_merge(run))
    return out


def _run_to_stop(units, fns, execs, instrs):
    """Run each unit until it stops (barrier or end); the units still running after."""
    stopped = []
    todo = list(units)
    while todo:
        u = todo.pop(0)
        try:
            run_wave(u, fns, execs, instrs)
        except Split:
            todo[:0] = u.split()
            continue
        stopped.append(u)
    return [u for u in stopped if not u.done]


def _release(units, lockstep):
    for u in units:
        u.stop = u.cluster_wait = False
    race.next_epoch(units[0].wg)
    return _merge_all(units) if lockstep else units


def run_cluster(groups, fns, execs, instrs, lockstep=True):
    """Run the waves of a cluster's workgroups (one list per workgroup; one workgroup outside
    cluster launches) to completion. Each workgroup runs through its own barriers up to the
    cluster barrier (s_barrier_wait -3) or its end; the cluster barrier completes when every
    workgroup has reached it and one of its waves has signalled it (s_barrier_signal -3)."""
    units = [_merge_all(ws) if lockstep else ws for ws in groups]
    while any(units):
        for i, us in enumerate(units):
            while us and not us[0].cluster_wait:
                wg = us[0].wg
                us = _run_to_stop(us, fns, execs, instrs)
                if len({u.cluster_wait for u in us}) > 1:
                    raise RaceError("waves of a workgroup stopped at different barriers (cluster and workgroup)")
                if not us:
                    race.next_epoch(wg)
                elif not us[0].cluster_wait:
                    us = _release(us, lockstep)
            units[i] = us
        if not any(units):
            break
        for us, ws in zip(units, groups):
            if not us or not ws[0].wg.cluster_signals:
                raise RaceError(f"cluster barrier never completes: workgroup {groups.index(ws)} of the cluster "
                                f"{'ended' if not us else 'waits without signalling it'}")
        for i, us in enumerate(units):
            us[0].wg.cluster_signals = 0
            units[i] = _release(us, lockstep)


def run_wave(w, fns, execs, instrs):
    """Run w until it stops (barrier or end); errors get the kernel, line and text. A lockstep
    unit raises Split (pc at the instruction) when it must continue as smaller units."""
    n, k = 0, w.k
    pc = w.pc
    try:
        while not w.stop:
            pc = w.pc
            w.pc = pc + 1
            try:
                fns[pc](w)
            except Split:
                if k == 1 or not instrs[pc].scalar:
                    raise
                scalar_per_wave(w, fns[pc], instrs[pc])
            execs[pc] += k      # per-instruction count of Emulator.last_stats
            n += 1
    except IndexError:
        if w.pc > len(fns):
            raise EmulatorFault(f"kernel {w.kernel!r}: execution ran past the end of the code") from None
        raise
    except Split:
        w.pc = pc
        raise
    except EmulatorError as e:
        if w.k > 1:            # report it from the wave that faults
            w.pc = pc
            raise Split() from None
        ins = instrs[pc]
        if getattr(e, "where", None) is None:
            msg = f"{e} [{ins.where()}]" if ins.where() not in str(e) else str(e)
            e2 = type(e)(msg)
            e2.where = ins
            raise e2 from None
        raise
    finally:
        w.emu.wave_instructions += n * w.k
        if n and k > w.emu.widest_unit:
            w.emu.widest_unit = k


class _ScalarView:
    """One wave of a lockstep unit as a scalar-only instruction sees it (scalar_per_wave)."""
    __slots__ = ("S", "scc", "exec", "pend", "race", "T", "k")

    def set_exec(self, x):
        x &= self.T.full
        self.exec = x
        self.S[self.T.exec], self.S[self.T.exec + 1] = x & 0xFFFFFFFF, x >> 32

    def __getattr__(self, name):   # any other wave state: the instruction is not scalar-only after all
        raise Split()


def scalar_views(w):
    """The scalar state of each wave of unit w, as copies (_ScalarView)."""
    pw = [j for j, x in enumerate(w.S) if x.__class__ is PerWave]
    views = []
    for i in range(w.k):
        v = _ScalarView()
        views.append(v)
        v.S = list(w.S)
        for j in pw:
            v.S[j] = w.S[j].v[i]
        v.scc, v.exec = PerWave.at(w.scc, i), PerWave.at(w.exec, i)
        v.pend, v.race, v.T, v.k = w.pend, w.race, w.T, 1
    return views


def scalar_per_wave(w, fn, ins):
    """Run scalar-only instruction fn once per wave of unit w (some SGPR, SCC or EXEC it reads
    is PerWave) and keep each written SGPR, SCC and EXEC as one value or a PerWave. Raises
    Split, w unchanged, if fn needs more than the unit's scalar state."""
    views = scalar_views(w)
    for v in views:
        fn(v)
    for op in ins.ops:
        for j in range(op.index, op.index + op.count) if op.kind == "s" else ():
            w.S[j] = PerWave.of([v.S[j] for v in views])
    w.scc = PerWave.of([v.scc for v in views])
    execs = PerWave.of([v.exec for v in views])
    if not PerWave.same(execs, w.exec):
        w.set_exec(execs)
