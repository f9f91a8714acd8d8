"""The chips' facts, one table per target, with no dependency: occupancy limits (ARCH_LIMITS)
and the performance limits of the whole chip (LIMITS). The planners, the assembly checks of
mxgemm.asm_facts, the emulator's targets (wave and LDS size), the performance model and the
timing model all read them here.
"""

# Per-SIMD limits used for occupancy, from LLVM's AMDGPUBaseInfo / GCNSubtarget and AMD's
# CDNA3/CDNA4 ISA guides (docs/gfx950_isa.md §8):
#  gfx950 (CDNA4): unified VGPR+AGPR file of 512 regs per lane per SIMD, allocated in granules
#    of 8; at most 8 waves per SIMD; 800 SGPRs per SIMD in granules of 16; 160 KiB LDS per CU
#    (4 SIMDs per CU).
#  gfx1250 (wave32): 1024 VGPRs per lane per SIMD (granule 8 in wave32), 16 waves per SIMD,
#    SGPRs not occupancy-limiting (gfx10+), LDS 320 KiB per WGP (docs/gfx1250_isa.md §1).
# lds_bytes is also the most one workgroup may allocate.
ARCH_LIMITS = {
    "gfx950": dict(vgprs=512, vgpr_granule=8, max_waves=8, sgprs=800, sgpr_granule=16,
                   lds_bytes=160 * 1024, simds_per_cu=4, wave_size=64),
    "gfx1250": dict(vgprs=1024, vgpr_granule=8, max_waves=16, sgprs=None, sgpr_granule=None,
                    lds_bytes=320 * 1024, simds_per_cu=4, wave_size=32),
}


# The chip's limits, sources in docs/perf_model.md §1 (LDS, SIMDs and wave size are the occupancy
# facts of ARCH_LIMITS above).
_OCC = ARCH_LIMITS
LIMITS = {
    "gfx950": dict(name="MI355X", cus=256, clock_ghz=2.4, hbm_tbps=8.0,
                   peak_tflops={"fp8": 5000.0, "mxfp6": 10100.0, "mxfp4": 10100.0, "bf16": 2500.0,
                                "fp8_legacy": 2500.0},
                   mem_latency_ns=430.0,    # MI300X's measured HBM latency as a stand-in (§1)
                   lds_kib_per_cu=_OCC["gfx950"]["lds_bytes"] // 1024, simds_per_cu=_OCC["gfx950"]["simds_per_cu"],
                   wave_size=_OCC["gfx950"]["wave_size"]),
    # gfx1250: no public CU count, clock, bandwidth or peak rates were found (docs/perf_model.md §1)
    "gfx1250": dict(name="MI450-class", cus=None, clock_ghz=None, hbm_tbps=None, peak_tflops={},
                    mem_latency_ns=None, lds_kib_per_cu=_OCC["gfx1250"]["lds_bytes"] // 1024,
                    simds_per_cu=_OCC["gfx1250"]["simds_per_cu"], wave_size=_OCC["gfx1250"]["wave_size"]),
}
