"""Machine descriptions for the timing model: one table per machine. Every value names its
source in docs/timing_model.md §2 ("measured stand-in": measured on MI300X, taken for MI355X;
"derived": arithmetic on sourced figures under a stated assumption; "assumed": no public figure)."""
from __future__ import annotations

from dataclasses import dataclass

from ..asm_facts import VALU_CYCLES
from ..hardware import ARCH_LIMITS, LIMITS


@dataclass(frozen=True)
class Machine:
    name: str
    arch: str
    cus: int                    # compute units
    xcds: int                   # dies; consecutive workgroups go round-robin over them
    simds: int                  # per CU
    waves_per_simd: int
    wave_size: int              # lanes per wave
    regs_per_simd_lane: int     # unified VGPR + AGPR file per SIMD lane
    lds_bytes: int              # per CU
    clock_ghz: float            # peak engine clock
    loaded_clock_ghz: float     # under sustained matrix load (MFMA pipes busy over half the time)
    valu_cycles: int            # a wave64 VALU instruction
    trans_cycles: int           # transcendental VALU (v_exp, v_rcp, ...)
    smem_latency: int
    lds_latency: int
    lds_bytes_per_clk: int
    line_bytes: int
    ta_cycles: int              # per CU: the address unit's cycles for a wave64 access of a dword or less a lane
    ta_multi_cycles: int        # the same, more than a dword a lane (dwordx2..x4, b64..b128)
    l1_bytes: int               # per CU
    l1_latency: int
    l1_bytes_per_clk: int       # per CU: lines an instruction touches pass at this rate
    l2_bytes: int               # per XCD
    l2_latency: int
    l2_bytes_per_clk: float     # per XCD, split evenly over its channels
    l2_channels: int            # per XCD; a line's channel: engine.l2_channel (assumed hash)
    atomic_cycles: int          # an L2 channel's atomic unit, per lane operation on a line
    mall_bytes: int             # Infinity Cache, whole chip (each XCD gets an equal share)
    mall_latency: int
    mall_bytes_per_s: float     # whole chip: the fabric from the XCDs to the MALL
    hbm_latency: int
    hbm_bytes_per_s: float      # achievable, whole chip
    barrier_latency: int        # s_barrier: the last wave's arrival to the release of all


def _chip(arch: str) -> dict:
    """The facts mxgemm.hardware already holds for ``arch`` (one table): CUs, SIMDs, waves, wave
    size, registers, LDS, clock."""
    occ, lim = ARCH_LIMITS[arch], LIMITS[arch]
    return dict(name=lim["name"], arch=arch, cus=lim["cus"], simds=occ["simds_per_cu"], waves_per_simd=occ["max_waves"],
                wave_size=occ["wave_size"], regs_per_simd_lane=occ["vgprs"], lds_bytes=occ["lds_bytes"],
                clock_ghz=lim["clock_ghz"])


MI355X = Machine(
    **_chip("gfx950"), xcds=8, loaded_clock_ghz=2.0, valu_cycles=VALU_CYCLES, trans_cycles=16,
    smem_latency=48, lds_latency=51, lds_bytes_per_clk=256, line_bytes=128, ta_cycles=4, ta_multi_cycles=16,
    l1_bytes=32 * 1024, l1_latency=116, l1_bytes_per_clk=64,
    l2_bytes=4 * 1024 * 1024, l2_latency=256, l2_bytes_per_clk=1024.0, l2_channels=16, atomic_cycles=1,
    mall_bytes=256 * 1024 * 1024, mall_latency=720, mall_bytes_per_s=8.0e12 * 0.8 * 5.4 / 3.7,
    hbm_latency=900, hbm_bytes_per_s=8.0e12 * 0.8, barrier_latency=16)

MACHINES = {"mi355x": MI355X}
