"""gfx950 (CDNA4, MI355X): gfx9 scalar register numbering, vmcnt / lgkmcnt; the wave and LDS sizes
are mxgemm.hardware.ARCH_LIMITS's."""
from __future__ import annotations

from . import float_atomics, lds_transpose, matrix, mxcvt, salu, valu, vmem  # noqa: F401  (fill GFX9)
from .isa import GFX9
from .target import Target

# Scalar register numbers of named registers (gfx9 encoding).
SGPRS = {"vcc": (106, 2), "vcc_lo": (106, 1), "vcc_hi": (107, 1), "m0": (124, 1),
         "exec": (126, 2), "exec_lo": (126, 1), "exec_hi": (127, 1),
         "flat_scratch": (102, 2), "flat_scratch_lo": (102, 1), "flat_scratch_hi": (103, 1)}


def decode_waitcnt(v):
    """s_waitcnt simm16: vmcnt in bits [3:0] and [15:14], lgkmcnt in [11:8] [ISA §4.4]."""
    vm, lgkm = (v & 0xF) | ((v >> 14) & 3) << 4, (v >> 8) & 0xF
    return (None if vm == 63 else vm), (None if lgkm == 15 else lgkm)


TARGET = Target("gfx950", sgprs=SGPRS, counters=("vm", "lgkm"), route=lambda counter, kind: counter,
                handlers=GFX9, vsharp=vmem.vsharp_gfx9, decode_waitcnt=decode_waitcnt)
