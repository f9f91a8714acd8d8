"""The GPU launch path, run for real: ops on the hip backend, through the C++ launcher
(csrc/host/mxgemm_host.cpp) and the mock HIP runtime (mxgemm.mock_hip), whose launches run on the
emulator with the kernarg bytes, grid, block and LDS size the launcher passed. Every variant of
every gfx950 kernel must give the same bytes as the emulator path."""
import pytest
import torch

import mxgemm
from mxgemm import build, kernarg, launcher, mock_hip, registry, specs
from mxgemm.emu import EmulatorFault
from mxgemm.launcher import emulator_settings, use_hip_library

CASES = [pytest.param(k, v, id=f"{k}-{registry.variant_id(v)}")
         for k, spec in registry.KERNELS.items() if "gfx950" in spec.archs for v in spec.variants]


def test_every_gfx950_kernel_runs_through_the_hip_path():
    assert not specs.gfx950_kernels_without_spec()


@pytest.mark.parametrize("kernel,variant", CASES)
def test_hip_path_is_bit_identical_to_the_emulator_path(kernel, variant):
    with emulator_settings(race_check=False):   # race mode is the emulator's own business: tested elsewhere
        want = specs.race_outputs(kernel, variant)
        before = len(mock_hip.LAUNCHES)
        with use_hip_library("mock"):
            got = specs.race_outputs(kernel, variant)
    symbol = registry.get(kernel).symbol
    assert any(s == symbol for s, *_ in mock_hip.LAUNCHES[before:]), "no launch reached the mock runtime"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), f"{kernel} {variant}: bytes differ"


def _dequant_inputs(rows=9):
    x, s = mxgemm.quant.quantize_mx(torch.randn(rows, 128, generator=torch.Generator().manual_seed(0)), "e4m3")
    return x, s


def test_plan_takes_the_hip_backend_and_launches_through_the_runtime():
    x, s = _dequant_inputs()
    want = mxgemm.mxfp8_dequantize(x, s)
    with use_hip_library("mock"):
        assert mxgemm.explain("mxfp8_dequantize", x, s).backend == "hip"
        before = len(mock_hip.LAUNCHES)
        got = mxgemm.mxfp8_dequantize(x, s)
        got2 = mxgemm.mxfp8_dequantize(x, s)    # the cached plan's bound launch
        launched = mock_hip.LAUNCHES[before:]
    assert launched == [("mxfp8_dequant", (2, 1, 1), (256, 1, 1), 0)] * 2
    assert torch.equal(got, want) and torch.equal(got2, want)
    assert mxgemm.explain("mxfp8_dequantize", x, s).backend == "emu"   # the plans made inside are gone


def test_mock_runtime_writes_hidden_arguments_from_the_launch():
    """The runtime, not the caller, owns the hidden arguments: the mock rewrites them from the
    grid and block it was given (a caller's garbage there must not matter)."""
    art = build.artifact("mxfp8_dequant", {}, "gfx950")
    slots, size = launcher.layout(art)
    x, s = _dequant_inputs()
    out = torch.zeros(x.shape, dtype=torch.float32)
    grid, block = (2, 1, 1), (256, 1, 1)
    args = [x, s, out, x.shape[0], x.shape[1]]
    packed = bytearray(kernarg.pack(slots, size, args, grid, block))
    for off, n, kind in slots:
        if kind.startswith("hidden_block_count") or kind.startswith("hidden_group_size"):
            packed[off:off + n] = b"\xff" * n
    with use_hip_library("mock"):
        k = launcher.hip_kernel(art, grid, block, 0, bytes(packed))
        mock_hip.run(k, (0,), [x, s, out])
    assert torch.equal(out, mxgemm.mxfp8_dequantize(x, s))


def test_wrong_kernarg_size_is_refused_naming_the_kernel():
    art = build.artifact("mxfp8_dequant", {}, "gfx950")
    slots, size = launcher.layout(art)
    x, s = _dequant_inputs()
    out = torch.zeros(x.shape, dtype=torch.float32)
    packed = kernarg.pack(slots, size, [x, s, out, 9, 128], (2, 1, 1), (256, 1, 1))
    with use_hip_library("mock"):
        k = launcher.hip_kernel(art, (2, 1, 1), (256, 1, 1), 0, packed[:-8])
        with pytest.raises(mock_hip.MockLaunchError, match=rf"mxfp8_dequant.*{size - 8} bytes.*says {size}"):
            mock_hip.run(k, (0,), [x, s, out])
    assert not out.any()


def test_missing_symbol_names_the_kernel():
    art = build.artifact("mxfp8_dequant", {}, "gfx950")
    rt = launcher.hip_runtime("mock")
    with pytest.raises(RuntimeError, match=r"hipModuleGetFunction\(no_such_kernel\).*hipErrorNotFound"):
        rt.function(art.hsaco_path.read_bytes(), "no_such_kernel")


def test_unknown_code_object_is_refused():
    rt = launcher.hip_runtime("mock")
    with pytest.raises(RuntimeError, match=r"hipModuleLoadData\(k\).*hipErrorInvalidImage"):
        rt.function(b"\x7fELF\x02" + bytes(59), "k")


def test_launch_error_code_names_the_kernel():
    """A launch the runtime rejects (an empty grid dimension) raises with the kernel's name."""
    art = build.artifact("mxfp8_dequant", {}, "gfx950")
    slots, size = launcher.layout(art)
    with use_hip_library("mock"):
        k = launcher.hip_kernel(art, (0, 1, 1), (256, 1, 1), 0, bytes(size))
        with pytest.raises(RuntimeError, match=r"hipModuleLaunchKernel\(mxfp8_dequant \(base, gfx950\)\).*"
                                               r"hipErrorInvalidValue"):
            mock_hip.run(k, (0,), [])


def test_emulator_fault_under_the_mock_is_raised_as_itself():
    """A kernel fault on the mock GPU surfaces as the emulator's own exception: an output buffer
    too small for the grid (a launcher bug this path exists to catch)."""
    art = build.artifact("mxfp8_dequant", {}, "gfx950")
    slots, size = launcher.layout(art)
    x, s = _dequant_inputs()
    small = torch.zeros(4, dtype=torch.float32)
    packed = kernarg.pack(slots, size, [x, s, small, 9, 128], (2, 1, 1), (256, 1, 1))
    with use_hip_library("mock"):
        k = launcher.hip_kernel(art, (2, 1, 1), (256, 1, 1), 0, packed)
        with pytest.raises(EmulatorFault):
            mock_hip.run(k, (0,), [x, s, small])


def test_missing_hip_runtime_names_the_kernel():
    x, s = _dequant_inputs()
    with use_hip_library("/nonexistent/libamdhip64.so"), pytest.raises(
            RuntimeError, match=r"cannot launch mxfp8_dequant \(base, gfx950\) on the hip backend: cannot load "
                                r"the HIP runtime /nonexistent/libamdhip64.so"):
        launcher.launch_variant("mxfp8_dequant", {}, "gfx950", "hip", x=x, scale=s, out=torch.zeros(9, 128), M=9,
                                K=128, elements=9 * 128)


def test_bound_launch_writes_only_pointers_per_call():
    """A plan's launch is bound once: a second call with other tensors of the same shapes must
    read and write the new tensors (the template's pointers are rewritten per call)."""
    x1, s1 = _dequant_inputs()
    x2, s2 = mxgemm.quant.quantize_mx(torch.randn(9, 128, generator=torch.Generator().manual_seed(1)), "e4m3")
    want1, want2 = mxgemm.mxfp8_dequantize(x1, s1), mxgemm.mxfp8_dequantize(x2, s2)
    with use_hip_library("mock"):
        o1, o2 = torch.full_like(want1, 7.0), torch.full_like(want2, 7.0)
        mxgemm.mxfp8_dequantize(x1, s1, out=o1)
        mxgemm.mxfp8_dequantize(x2, s2, out=o2)
    assert torch.equal(o1, want1) and torch.equal(o2, want2)
    assert not torch.equal(want1, want2)


def test_host_extension_builds_without_rocm_or_torch_headers():
    ext = launcher.host_ext()
    assert {"Runtime", "Kernel"} <= set(dir(ext))
    with pytest.raises(OSError, match="cannot load the HIP runtime"):
        ext.Runtime("/nonexistent/libamdhip64.so")


def test_hot_path_creates_no_tensors_and_calls_no_torch_op():
    """What HIP graph capture needs of a cached call with ``out`` given: no host sync, no
    allocation, no tensor op besides the launch. The profiler sees every op and allocation of the
    call (it sends the call through torch's dispatcher, which runs the same bound launch)."""
    from mxgemm.tools import bench
    with use_hip_library("mock-noop"):
        for name, call in bench.host_calls().items():
            call()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                        profile_memory=True) as prof:
                call()
            ops = {e.name for e in prof.events() if "::" in e.name}
            allocated = [e for e in prof.events() if e.cpu_memory_usage]
            assert ops <= {f"mxgemm::{name}", f"mxgemm::{name}_out"}, (name, ops)
            assert not allocated, (name, [e.name for e in allocated])


def _mx_gemm_gfx1250(v, backend):
    """mx_gemm's gfx1250 build (a partial tile both ways, or the last workgroup of a whole
    cluster), launched as a registry variant."""
    cluster = v["CLUSTER_M"] * v["CLUSTER_N"] > 1
    M, N = (v["BM"] * v["CLUSTER_M"] - 5, v["BN"] * v["CLUSTER_N"] - 32) if cluster else (67, 96)
    K, splits = 128 * (v["NUM_BUFFERS"] + 1), 2 if v["SPLITK"] else 1
    g = torch.Generator().manual_seed(3)
    a, sa = mxgemm.quant.quantize_mx(torch.randn(M, K, generator=g), v["A_FMT"])
    b, sb = mxgemm.quant.quantize_mx(torch.randn(N, K, generator=g), v["B_FMT"])
    out = torch.zeros(M, N, dtype={"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[v["OUT"]])
    launcher.launch_variant("mx_gemm", v, "gfx1250", backend, writes=(out,), a=a, a_scale=sa, b=b, b_scale=sb,
                            out=out, M=M, N=N, K=K, splits=splits)
    return out


def _dequant_gfx1250(kernel):
    def run(v, backend):
        x, s = _dequant_inputs()
        out = torch.zeros(x.shape, dtype=torch.float32)
        launcher.launch_variant(kernel, v, "gfx1250", backend, writes=(out,), x=x, scale=s, out=out, M=9, K=128,
                                elements=9 * 128)
        return out
    return run


GFX1250 = {"mx_gemm": _mx_gemm_gfx1250, "mxfp8_dequant": _dequant_gfx1250("mxfp8_dequant"),
           "mxfp8_dequant_flydsl": _dequant_gfx1250("mxfp8_dequant_flydsl")}


@pytest.mark.parametrize("kernel,variant", [
    pytest.param(k, v, id=f"{k}-{registry.variant_id(v)}")
    for k, spec in registry.KERNELS.items() if "gfx1250" in spec.archs for v in spec.variants_for("gfx1250")])
def test_gfx1250_builds_through_the_hip_path_are_bit_identical(kernel, variant):
    with emulator_settings(race_check=False):
        want = GFX1250[kernel](variant, "emu")
        with use_hip_library("mock"):
            got = GFX1250[kernel](variant, "hip")
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
