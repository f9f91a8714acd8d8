"""mxgemm.asm_facts: static facts of compiled kernels, and the sample kernels' budgets."""
import pytest

from mxgemm import asm_facts, build, registry, toolchain

SAMPLES = ("mxfp8_dequant", "mxfp8_dequant_flydsl")


@pytest.mark.parametrize("arch", toolchain.ARCHS)
@pytest.mark.parametrize("name", SAMPLES)
def test_sample_kernels_compile_without_spills_within_limits(name, arch):
    info = build.artifact(name, {}, arch).isa()
    assert info.arch == arch and info.name == registry.get(name).symbol
    assert info.wave_size == (64 if arch == "gfx950" else 32)
    assert info.spills == 0 and info.scratch_bytes == 0
    assert info.lds_bytes <= asm_facts.ARCH_LIMITS[arch]["lds_bytes"]
    assert 1 <= info.occupancy(256) <= asm_facts.ARCH_LIMITS[arch]["max_waves"]
    assert info.histogram["s_endpgm"] >= 1
    assert [a[".value_kind"] for a in info.args[:5]] == ["global_buffer"] * 3 + ["by_value"] * 2


def test_occupancy_agrees_with_clang_for_register_bound_kernels():
    # clang prints its own occupancy estimate; ours must agree when LDS does not bind.
    info = build.artifact("mxfp8_dequant", {}, "gfx950").isa()
    assert info.compiler_occupancy is not None
    assert info.occupancy(256) == info.compiler_occupancy


def test_occupancy_from_vgprs_agprs_and_lds():
    # Hand-made facts, limits from the comment in mxgemm.asm_facts (512 regs/lane, granule 8, 8 waves).
    k = asm_facts.KernelInfo("k", "gfx950", vgprs=128, agprs=0, sgprs=32, vgpr_spills=0, sgpr_spills=0,
                       scratch_bytes=0, lds_bytes=0, wave_size=64, kernarg_size=0, accum_offset=128)
    assert k.occupancy() == 4
    k.agprs, k.accum_offset = 64, 128          # unified file: 128 + 64 = 192 -> 2 waves
    assert k.occupancy() == 2
    k.agprs, k.vgprs, k.lds_bytes = 0, 32, 64 * 1024  # 2 WGs of 4 waves per CU = 2 waves/SIMD
    assert k.occupancy(256) == 2


def test_kernel_info_parses_a_snippet():
    asm = toolchain.compile_hip_source(
        '#include "mxgemm/device.h"\n'
        "MXGEMM_KERNEL(lds_user)(float* o) {\n"
        "  __shared__ float t[1024];\n"
        "  t[mxgemm::thread_x()] = 1.0f; mxgemm::syncthreads();\n"
        "  o[mxgemm::thread_x()] = t[1023 - mxgemm::thread_x()];\n}\n")
    info = asm_facts.kernel_info(asm)
    assert info.lds_bytes == 4096 and info.count("ds_") >= 2 and info.histogram["s_barrier"] == 1
    assert asm_facts.kernel_names(asm) == ["lds_user"]
    with pytest.raises(ValueError, match="not in assembly"):
        asm_facts.kernel_info(asm, "other")
