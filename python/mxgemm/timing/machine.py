"""Machine descriptions for the timing model: one table per machine. Every value names its
source in docs/timing_model.md §2 ("measured stand-in": measured on MI300X, taken for MI355X;
"derived": arithmetic on sourced figures under a stated assumption; "assumed": no public figure).
``gfx1250-assumed``: gfx1250 with its unpublished figures assumed (docs/timing_model.md §7);
its results carry ``machine_assumed``."""
from __future__ import annotations

import re
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
    atomic_cycles: float        # an L2 channel's atomic unit: clocks per lane operation on a line
    mall_bytes: int             # Infinity Cache, whole chip (each XCD gets an equal share)
    mall_latency: int
    mall_bytes_per_s: float     # whole chip: the fabric from the XCDs to the MALL
    hbm_latency: int
    hbm_bytes_per_s: float      # achievable, whole chip
    barrier_latency: int        # s_barrier: the last wave's arrival to the release of all
    assumed: bool = False       # its core figures (CUs, clock, caches, bandwidths) are assumptions: results say so


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
    l2_bytes=4 * 1024 * 1024, l2_latency=256, l2_bytes_per_clk=1024.0, l2_channels=16, atomic_cycles=0.5,
    mall_bytes=256 * 1024 * 1024, mall_latency=720, mall_bytes_per_s=8.0e12 * 0.8 * 5.4 / 3.7,
    hbm_latency=900, hbm_bytes_per_s=8.0e12 * 0.8, barrier_latency=16)


# gfx1250's matrix pipe (LLVM's GFX125x scheduling model, SISchedule.td; docs/timing_model.md §7):
# the XDL unit is held 8 cycles by a "2-pass" WMMA, 16 by a "4-pass" one.
_WMMA_4PASS = re.compile(r"_(iu8|iu4)(_|$)|^v_wmma_f32_16x16x4_f32")
_F8_FMT = re.compile(r"matrix_[ab]_fmt:MATRIX_FMT_(FP8|BF8)\b")


def wmma_cycles(line: str) -> int:
    """Cycles one gfx1250 WMMA / SWMMAC holds its SIMD's matrix pipe. The scaled 16x16x128
    f8f6f4 form takes 16 when either operand is FP8 / BF8 (an omitted format is FP8), 8 for
    FP6 / FP4; iu8 / iu4 and the f32 16x16x4 form 16; everything else (f16, bf16, fp8 / bf8
    16x16x64 / x128, 32x16x128 f4) 8."""
    text = line.split(";")[0].strip()
    base = text.split()[0]
    if "16x16x128_f8f6f4" in base:
        fmts = re.findall(r"matrix_([ab])_fmt:", text)
        return 16 if _F8_FMT.search(text) or len(set(fmts)) < 2 else 8
    return 16 if _WMMA_4PASS.search(base) else 8


# gfx1250 (MI450-class): the occupancy facts of mxgemm.hardware (wave32, 1024 VGPRs, 16 waves per
# SIMD, 4 SIMDs and 320 KiB LDS per WGP, which the table calls a CU) and LLVM's VALU and WMMA
# rates are sourced; no CU count, clock, cache or memory figure is public (docs/perf_model.md §1),
# so those are **assumed** equal to MI355X's, the address unit's rates are GCN's per-lane rates
# applied to 32 lanes (docs/timing_model.md §7).
GFX1250 = Machine(
    **{**_chip("gfx1250"), "name": "gfx1250 (assumed MI450-class)", "cus": MI355X.cus, "clock_ghz": MI355X.clock_ghz},
    xcds=MI355X.xcds, loaded_clock_ghz=MI355X.loaded_clock_ghz, valu_cycles=1, trans_cycles=4,
    smem_latency=MI355X.smem_latency, lds_latency=MI355X.lds_latency, lds_bytes_per_clk=MI355X.lds_bytes_per_clk,
    line_bytes=MI355X.line_bytes, ta_cycles=2, ta_multi_cycles=8,
    l1_bytes=MI355X.l1_bytes, l1_latency=MI355X.l1_latency, l1_bytes_per_clk=MI355X.l1_bytes_per_clk,
    l2_bytes=MI355X.l2_bytes, l2_latency=MI355X.l2_latency, l2_bytes_per_clk=MI355X.l2_bytes_per_clk,
    l2_channels=MI355X.l2_channels, atomic_cycles=MI355X.atomic_cycles,
    mall_bytes=MI355X.mall_bytes, mall_latency=MI355X.mall_latency, mall_bytes_per_s=MI355X.mall_bytes_per_s,
    hbm_latency=MI355X.hbm_latency, hbm_bytes_per_s=MI355X.hbm_bytes_per_s, barrier_latency=MI355X.barrier_latency,
    assumed=True)

MACHINES = {"mi355x": MI355X, "gfx1250-assumed": GFX1250}
