"""What the emulator core needs to know about an ISA target. One module per target (e.g.
``gfx950``) builds a ``Target`` from its tables; ``launch.TARGETS`` lists them by arch name.
Wave size and LDS size are the chip's facts in ``mxgemm.hardware.ARCH_LIMITS``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..hardware import ARCH_LIMITS
from .isa import HandlerTable


@dataclass(eq=False)
class Target:
    arch: str                        # a key of hardware.ARCH_LIMITS
    sgprs: dict                      # assembler name -> (first scalar register number, count)
    counters: tuple                  # names of the wait counters (race mode keeps one queue each)
    route: Callable                  # (memory class 'vm' | 'lgkm' | 'tensor', kind) -> counter name
    handlers: HandlerTable           # .builder(ins) -> builder or None (gfx1250: a lookup over GFX12 then GFX9)
    vsharp: Callable                 # buffer resource (four SGPRs) -> (base, stride, num_records, add_tid, swizzle)
    decode_waitcnt: Callable = None  # s_waitcnt simm16 -> (vmcnt, lgkmcnt), None = not waited on
    ttmp_ids: bool = False           # workgroup ids in ttmp9 / ttmp7 (architected SGPRs), not user SGPRs
    wave: int = field(init=False)        # lanes per wave; EXEC and VCC are this many bits wide
    lds_bytes: int = field(init=False)   # LDS per workgroup
    lane: np.ndarray = field(init=False)

    def __post_init__(self):
        limits = ARCH_LIMITS[self.arch]
        self.wave, self.lds_bytes = limits["wave_size"], limits["lds_bytes"]
        self.vcc, self.m0, self.exec = (self.sgprs[k][0] for k in ("vcc", "m0", "exec"))
        self.null = self.sgprs["null"][0] if "null" in self.sgprs else None   # reads 0, writes dropped
        # (memory class, kind) -> queue index, looked up by race.track_load
        route = {(c, k): self.route(c, k) for c in ("vm", "lgkm", "tensor")
                 for k in ("load", "store", "smem", "lds_write", "async")}
        self.route = {ck: self.counters.index(n) for ck, n in route.items() if n in self.counters}
        self.full = (1 << self.wave) - 1               # EXEC with every lane on
        self.lane = np.arange(self.wave)               # lane index within the wave
