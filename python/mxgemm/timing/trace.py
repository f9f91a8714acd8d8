"""What the timing model needs of an emulator run, recorded while it runs: per wave, the
instructions it issued in order and, for memory instructions, the cache lines (global) or LDS
cycles (bank conflicts) of each. The emulator calls it only when timing is on
(``Emulator(timing=...)``), running every wave on its own (no lockstep units)."""
from __future__ import annotations

import numpy as np

LINE = 128          # cache line bytes (L1 / L2) on CDNA (docs/timing_model.md §2)
LDS_BANKS = 64      # 4-byte banks, 256 bytes per clock on gfx950 (docs/timing_model.md §2)
LDS_MEMO = 1 << 16   # address patterns whose bank cycles a Tracer remembers (a launch's loops repeat a few)
BUFFER_SHIFT = 40   # a line's key: (the buffer's rank by address << BUFFER_SHIFT) + its line in the buffer


class WaveTrace:
    __slots__ = ("mem", "pcs", "wave", "wg")

    def __init__(self, wg, wave):
        self.wg, self.wave = wg, wave
        self.pcs: list = []      # instruction indices, in issue order
        self.mem: dict = {}      # position in pcs -> ("vmem", lines, lanes per line) | ("lds", cycles)


class Tracer:
    def __init__(self):
        self.waves: list = []
        self.cur: WaveTrace | None = None
        self.lds_cycles: dict = {}     # (bytes a lane, active lanes' addresses) -> bank cycles

    def start_wave(self, w, wg_id, wave_index) -> None:
        w.trace = WaveTrace(wg_id, wave_index)
        self.waves.append(w.trace)

    def wrap(self, fns):
        """fns recording each executed instruction into its wave's trace."""
        def traced(pc, fn):
            def run(w):
                t = self.cur = w.trace
                t.pcs.append(pc)
                fn(w)
            return run
        return [traced(pc, fn) for pc, fn in enumerate(fns)]

    def vmem(self, addr, mask, bases) -> None:
        """A global access of the current instruction: its distinct cache lines and the lanes
        on each (an atomic unit applies them lane by lane). Lines are counted from the start of
        each buffer (``bases``: the mapped buffers' sorted starts), as if every buffer were line
        aligned, as GPU allocations are: host tensors are not, and their addresses change from
        run to run. The emulator may report an instruction's lanes in several calls (an atomic:
        all lanes, then lane groups): a line keeps its most lanes of any call."""
        t = self.cur
        if t is not None:
            a = np.asarray(addr)[mask].astype(np.int64)
            b = np.asarray(bases, np.int64)
            i = np.searchsorted(b, a, side="right") - 1
            lines, lanes = np.unique((i << BUFFER_SHIFT) + (a - b[i]) // LINE, return_counts=True)
            prev = t.mem.get(len(t.pcs) - 1)
            if prev is not None:
                lines, at = np.unique(np.concatenate([prev[1], lines]), return_inverse=True)
                most = np.zeros(lines.size, np.int64)
                np.maximum.at(most, at, np.concatenate([prev[2], lanes]))
                lanes = most
            t.mem[len(t.pcs) - 1] = ("vmem", lines, lanes)

    def lds(self, addr, mask, nbytes) -> None:
        """An LDS access of the current instruction (addr: per lane, a row per lane where a lane
        has several; mask: the active lanes): the cycles its bank conflicts cost, memoised per
        address pattern (a loop's waves repeat theirs every iteration). The LDS write of a
        global -> LDS DMA load keeps the load's record: its lines are what the engine times (its
        LDS part: the LDS latency, docs/timing_model.md §1)."""
        t = self.cur
        if t is None:
            return
        prev = t.mem.get(len(t.pcs) - 1)
        if prev is not None and prev[0] == "vmem":
            return
        a = np.asarray(addr, np.int64)[mask]
        key = (nbytes, a.tobytes())
        cycles = self.lds_cycles.get(key)
        if cycles is None:
            if len(self.lds_cycles) >= LDS_MEMO:
                self.lds_cycles.clear()
            cycles = self.lds_cycles[key] = bank_cycles(a.reshape(-1), nbytes)
        t.mem[len(t.pcs) - 1] = ("lds", cycles + (prev[1] if prev else 0))


def bank_cycles(a, nbytes) -> int:
    """Cycles of an LDS access at byte addresses ``a`` (the active lanes in order), each lane
    ``nbytes``: lanes go in phases of 256 bytes (64 banks x 4 bytes; ds_read_b128: 16 lanes a
    phase); a phase takes as many cycles as the most distinct dwords any one bank serves in it."""
    per_phase = max(1, 256 // max(4, nbytes))
    cycles = 0
    for p in range(0, a.size, per_phase):
        dw = np.unique(((a[p:p + per_phase, None] + np.arange(0, max(4, nbytes), 4)) // 4).ravel())
        cycles += int(np.bincount(dw % LDS_BANKS, minlength=LDS_BANKS).max())
    return cycles
