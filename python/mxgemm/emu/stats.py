"""Per-launch instruction counters (``Emulator.last_stats``) and workgroup windows.

Each instruction's class and bytes per lane are fixed when it is decoded; a launch wraps the
decoded closures once so that executing one adds to a per-instruction tally (and, for memory
instructions, the active-lane count), and the tallies become a dict when the launch ends."""
from __future__ import annotations

import functools
import re

import numpy as np

# bytes per lane of a memory mnemonic's size suffix (first match in the mnemonic wins)
_VMEM_BYTES = (("dwordx4", 16), ("dwordx3", 12), ("dwordx2", 8), ("_x2", 8), ("f64", 8), ("dword", 4),
               ("short", 2), ("byte", 1))
_DS_BYTES = (("b128", 16), ("b96", 12), ("b64", 8), ("u64", 8), ("f64", 8), ("b32", 4), ("u32", 4),
             ("i32", 4), ("f32", 4), ("u16", 2), ("i16", 2), ("b16", 2), ("u8", 1), ("i8", 1), ("b8", 1))
_VMEM = ("global_", "flat_", "buffer_", "scratch_")
_MFMA_SHAPE = re.compile(r"_(\d+x\d+x\d+)")


def _bytes(name, table):
    for sfx, n in table:
        if sfx in name:
            return n
    return 4


@functools.lru_cache(maxsize=None)
def classify(base: str, to_lds: bool = False):
    """(class, bytes per active lane or 0) of an instruction's bare mnemonic (to_lds: a buffer
    load with the lds modifier)."""
    if base.startswith(("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")):
        return "mfma", 0
    if base.startswith(_VMEM):
        n = _bytes(base, _VMEM_BYTES)
        if to_lds or base.startswith("global_load_lds"):
            return "vmem_load_lds", n
        space = "scratch" if base.startswith("scratch_") else "vmem"     # scratch: spills, private arrays
        for kind in ("atomic", "store", "load"):
            if f"_{kind}" in base:
                return f"{space}_{kind}", n
        return "vmem_cache", 0          # buffer_inv, buffer_wbl2, ...
    if base.startswith("ds_"):
        n = _bytes(base, _DS_BYTES)
        if base.startswith(("ds_read2", "ds_write2")):
            n *= 2
        if base.startswith(("ds_read", "ds_load")):
            return "lds_load", n
        if base.startswith(("ds_write", "ds_store")):
            return "lds_store", n
        if base.startswith(("ds_swizzle", "ds_permute", "ds_bpermute", "ds_nop")):
            return "lds_xlane", 0
        return "lds_atomic", n
    if base.startswith("tensor_"):          # tensor data mover: one descriptor-driven tile per wave
        return ("tdm_store" if "store" in base else "tdm_load"), 0
    if base.startswith(("s_waitcnt", "s_wait_")):
        return "waitcnt", 0
    if base in ("s_barrier", "s_barrier_wait"):     # gfx12: s_barrier_signal + s_barrier_wait, one barrier
        return "barrier", 0
    if base.startswith(("s_load", "s_buffer_load", "s_store", "s_buffer_store", "s_dcache", "s_memtime",
                        "s_memrealtime")):
        return "smem", 0
    if base.startswith(("s_cbranch", "s_branch", "s_setpc", "s_swappc", "s_getpc", "s_set_pc", "s_swap_pc",
                        "s_get_pc", "s_add_pc", "s_rfe")):
        return "branch", 0
    return ("salu" if base.startswith("s_") else "valu"), 0


class LaunchCounter:
    """Tallies of one kernel's instructions; ``wrap(fns)`` returns lane-counting closures."""

    def __init__(self, instrs):
        self.cls = [classify(i.base, bool(i.mods.get("lds"))) for i in instrs]
        self.names = [i.base for i in instrs]
        self.execs = [0] * len(instrs)
        self.lanes = [0] * len(instrs)

    def wrap(self, fns):
        """fns with the lane-counting ones wrapped; run_wave counts ``execs`` itself."""
        lanes = self.lanes

        # a lockstep unit (w.k waves, one EXEC) counts k wave-instructions; counted after fn
        # returns, since a unit that splits re-runs the instruction wave by wave
        def counted(pc, fn):
            def run(w):
                n = w.exec.bit_count() * w.k if w.exec.__class__ is int else int(np.count_nonzero(w.mask))
                fn(w)
                lanes[pc] += n
            return run
        return [counted(pc, fn) if self.cls[pc][1] > 0 else fn for pc, fn in enumerate(fns)]

    def stats(self, workgroups: int, waves: int) -> dict:
        """Counts by class; MFMA also by mnemonic and by shape; memory classes also in bytes
        (bytes per lane x active lanes at issue, out-of-range buffer lanes included)."""
        out = {"workgroups": workgroups, "waves": waves, "wave_instructions": sum(self.execs),
               "mfma_by_mnemonic": {}, "mfma_by_shape": {}}
        for (c, nb), name, n, l in zip(self.cls, self.names, self.execs, self.lanes):
            if not n:
                continue
            out[c] = out.get(c, 0) + n
            if nb:
                out[c + "_bytes"] = out.get(c + "_bytes", 0) + nb * l
            if c == "mfma":
                out["mfma_by_mnemonic"][name] = out["mfma_by_mnemonic"].get(name, 0) + n
                m = _MFMA_SHAPE.search(name)
                shape = m.group(1) if m else name
                out["mfma_by_shape"][shape] = out["mfma_by_shape"].get(shape, 0) + n
        out["lds_bytes"] = sum(out.get(c + "_bytes", 0) for c in ("lds_load", "lds_store", "lds_atomic",
                                                                 "vmem_load_lds"))
        return out


def select_workgroups(grid, workgroups):
    """Workgroup ids (x, y, z) of ``workgroups`` in linear launch order, each once; faults on an
    id outside the grid."""
    want = set()
    for g in workgroups:
        t = tuple(int(v) for v in g)
        t = t + (0,) * (3 - len(t))
        if len(t) != 3 or not all(0 <= v < n for v, n in zip(t, grid)):
            raise ValueError(f"workgroup id {tuple(g)} is outside the grid {tuple(grid)}")
        want.add(t)
    return sorted(want, key=lambda t: (t[2], t[1], t[0]))
