"""Fault messages for global accesses that hit no buffer of the launch."""
from __future__ import annotations

from .isa import EmulatorFault


def outside_buffers(regions, lane: int, addr: int, nbytes: int) -> EmulatorFault:
    """Fault naming the lane, the address and the nearest registered buffer (regions: objects
    with .base and .size; the kernel and line are added by the wave runner)."""
    msg = f"global access outside every buffer of the launch: lane {lane}, address {addr:#x}, {nbytes} bytes"
    if regions:
        r = min(regions, key=lambda r: max(r.base - addr, addr - (r.base + r.size), 0))
        end = r.base + r.size
        where = f"{addr + nbytes - end} bytes past its end" if addr >= r.base else f"{r.base - addr} bytes before it"
        msg += f"; nearest buffer: {r.size} bytes at {r.base:#x} (access reaches {where})"
    return EmulatorFault(msg)
