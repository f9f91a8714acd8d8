"""What the emulator core needs to know about an ISA target. One module per target (e.g.
``gfx950``) builds a ``Target`` from its tables; ``launch.TARGETS`` lists them by arch name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .isa import HandlerTable


@dataclass(eq=False)
class Target:
    arch: str
    wave: int                        # lanes per wave; EXEC and VCC are this many bits wide
    sgprs: dict                      # assembler name -> (first scalar register number, count)
    lds_bytes: int                   # LDS per workgroup
    decode_waitcnt: Callable         # s_waitcnt simm16 -> (vmcnt, lgkmcnt), None = not waited on
    handlers: HandlerTable           # mnemonic -> builder
    lane: np.ndarray = field(init=False)

    def __post_init__(self):
        self.vcc, self.m0, self.exec = (self.sgprs[k][0] for k in ("vcc", "m0", "exec"))
        self.full = (1 << self.wave) - 1               # EXEC with every lane on
        self.lane = np.arange(self.wave)               # lane index within the wave
