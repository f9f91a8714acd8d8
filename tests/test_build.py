"""Registry + build: every registered kernel compiles for its archs; the cache is content-hashed
(a repeat build compiles nothing; editing one source rebuilds only that kernel) and checked (an
entry whose files do not match their recorded sha256 is rebuilt)."""
import pytest

from mxgemm import build, registry, toolchain
from mxgemm.registry import Kernel

HIP_TEMPLATE = """#include "mxgemm/device.h"
MXGEMM_KERNEL({name})(float* out, int n) {{
  uint32_t i = mxgemm::block_x() * 64u + mxgemm::thread_x();
  if (i < (uint32_t)n) out[i] = {value}f * (float)i;
}}
"""


@pytest.fixture
def scratch_kernels(tmp_path, monkeypatch):
    """Two throw-away HIP kernels in a private cache dir, removed from the registry afterwards."""
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "cache"))
    names = []
    for name, value in (("scratch_a", 1.5), ("scratch_b", 2.5)):
        src = tmp_path / f"{name}.hip"
        src.write_text(HIP_TEMPLATE.format(name=name, value=value))
        registry.register(Kernel(name, "hip", str(src), name, ("gfx950", "gfx1250"),
                                 registry.variant_grid(UNROLL=(1, 2))))
        names.append(name)
    yield names, tmp_path
    for n in names:
        registry.KERNELS.pop(n)


def test_compiler_knows_both_archs():
    for arch in toolchain.ARCHS:
        comp = toolchain.find_compiler(arch)
        assert comp.major >= 19


def test_repeat_build_compiles_nothing_and_edit_rebuilds_one_kernel(scratch_kernels):
    names, tmp = scratch_kernels
    first = build.build(kernels=names, progress=False)
    assert len(first) == 2 * 2 * 2 and build.build.last_compiled == 8
    for a in first:
        assert a.asm_path.exists() and a.hsaco_path.read_bytes()[:4] == b"\x7fELF"

    build._MEMO.clear()  # a new process: nothing memoised, only the disk cache
    again = build.build(kernels=names, progress=False)
    assert build.build.last_compiled == 0
    assert [a.hsaco_path for a in again] == [a.hsaco_path for a in first]

    src = tmp / "scratch_a.hip"
    src.write_text(src.read_text().replace("1.5f", "3.5f"))
    build._MEMO.clear()
    edited = build.build(kernels=names, progress=False)
    assert build.build.last_compiled == 4  # scratch_a x 2 variants x 2 archs
    changed = {a.kernel for a, b in zip(edited, first) if a.hsaco_path != b.hsaco_path}
    assert changed == {"scratch_a"}


def test_variant_becomes_a_define(scratch_kernels, tmp_path):
    names, tmp = scratch_kernels
    src = tmp / "scratch_b.hip"
    src.write_text(src.read_text().replace("2.5f * (float)i", "(float)(i + UNROLL * 12345u)"))
    arts = [build.artifact("scratch_b", {"UNROLL": u}, "gfx950") for u in (1, 2)]
    assert arts[0].key != arts[1].key
    assert "0x3039" in arts[0].asm and "0x6072" in arts[1].asm  # 12345 and 24690


def test_unknown_kernel_variant_and_arch_are_clear_errors():
    with pytest.raises(KeyError, match="unknown kernel 'nope'"):
        build.artifact("nope")
    with pytest.raises(ValueError, match="has no gfx950 variant"):
        build.artifact("mxfp8_dequant", {"BOGUS": 1})
    with pytest.raises(ValueError, match="has no gfx1250 variant"):   # per-arch variant grids
        build.artifact("mx_gemm", registry.get("mx_gemm").variants[0], "gfx1250")
    registry.register(Kernel("only950", "hip", "csrc/kernels/mxfp8_dequant.hip", "mxfp8_dequant"))
    try:
        with pytest.raises(ValueError, match="not built for 'gfx1250'"):
            build.artifact("only950", {}, "gfx1250")
    finally:
        registry.KERNELS.pop("only950")


def test_registry_rejects_duplicates_and_bad_language():
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(registry.get("mxfp8_dequant"))
    with pytest.raises(ValueError, match="language must be hip"):
        registry.register(Kernel("x", "cuda", "x.cu", "x"))


def test_every_registered_kernel_builds_for_every_arch():
    arts = build.build(progress=False)
    want = {(n, registry.variant_id(v), a) for n, k in registry.KERNELS.items()
            for a in k.archs for v in k.variants_for(a)}
    assert {(a.kernel, registry.variant_id(a.variant), a.arch) for a in arts} == want


def test_registry_workgroup_size_is_the_one_each_artefact_requires():
    """The launch block comes from the registry (threads_for); the runtime and the emulator
    refuse any other size than a kernel's .reqd_workgroup_size."""
    wrong = {(a.kernel, a.arch, a.isa().workgroup_size) for a in build.build(progress=False)
             if a.isa().workgroup_size not in (None, registry.get(a.kernel).threads_for(a.arch, a.variant))}
    assert not wrong


def test_cmake_kernel_list_is_the_registry():
    path = registry.source_root() / "csrc" / "kernels.cmake"
    assert path.read_text() == build.cmake_list(), (
        "csrc/kernels.cmake is stale: regenerate it with\n  PYTHONPATH=python python -c "
        "\"from mxgemm.build import cmake_list; print(cmake_list(), end='')\" > csrc/kernels.cmake")


def test_cmake_builds_every_hip_variant_with_its_defines(tmp_path):
    """Configure CMakeLists.txt (no compile) and read the outputs and -D flags it would build."""
    import re
    import shutil
    import subprocess
    assert shutil.which("cmake"), "cmake is needed to check the C++ build (CI machines have it)"
    root = registry.source_root()
    p = subprocess.run(["cmake", "-S", str(root), "-B", str(tmp_path), "-G", "Unix Makefiles"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    rules = (tmp_path / "CMakeFiles" / "mxgemm_kernels.dir" / "build.make").read_text()
    got = set(re.findall(r"-mcpu=(gfx\w+) -c \S+/([\w]+)-(\w+)\.s ", rules))
    want = {(a, n, registry.variant_id(v)) for n, v, a in build.plan()
            if registry.get(n).language == "hip"}
    assert got == want
    for n, v, a in build.plan():
        if registry.get(n).language == "hip" and v:
            defines = " ".join(f"-D{k}={x}" for k, x in sorted(v.items()))
            assert f"{defines} -S {root}/{registry.get(n).source}" in rules, (n, v)


@pytest.fixture
def tiny_kernel(tmp_path, monkeypatch):
    """One throw-away HIP kernel (one variant, gfx950) in a private cache dir."""
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "scratch_tiny.hip"
    src.write_text(HIP_TEMPLATE.format(name="scratch_tiny", value=4.5))
    registry.register(Kernel("scratch_tiny", "hip", str(src), "scratch_tiny"))
    yield "scratch_tiny"
    registry.KERNELS.pop("scratch_tiny")


def _flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


DAMAGE = {   # what happens to which file of a cached entry
    "truncated .s": (".s", lambda data: data[:len(data) // 2]),
    "truncated .hsaco": (".hsaco", lambda data: data[:len(data) // 2]),
    "deleted .sha256": (".sha256", None),
    "one byte of .s changed": (".s", _flip_last_byte),
    "one byte of .hsaco changed": (".hsaco", _flip_last_byte),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_cache_entry_is_rebuilt(tiny_kernel, damage, capsys):
    first = build.artifact(tiny_kernel)
    suffix, edit = DAMAGE[damage]
    victim = first.hsaco_path.with_suffix(suffix)
    if edit is None:
        victim.unlink()
    else:
        victim.write_bytes(edit(victim.read_bytes()))

    build._MEMO.clear()  # a new process: only the disk cache
    (art,) = build.build(kernels=[tiny_kernel])
    assert build.build.last_compiled == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"[1/1] rebuilt  {tiny_kernel} [base] gfx950 ("), line
    assert line.endswith(f"): the cached files did not match their recorded hash ({victim} "
                         + ("is missing)" if edit is None else "differs)")), line
    assert art.hsaco_path.read_bytes()[:4] == b"\x7fELF" and ".amdgpu_metadata" in art.asm
    art.isa()                                          # the kernel's metadata parses
    build._MEMO.clear()
    build.build(kernels=[tiny_kernel], progress=False)
    assert build.build.last_compiled == 0              # and passes the check


def test_intact_entry_records_its_hashes_and_is_not_recompiled(tiny_kernel, monkeypatch):
    import hashlib
    first = build.artifact(tiny_kernel)
    assert first.sums_path.read_text() == "".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in (first.asm_path, first.hsaco_path))

    def no_compile(*a, **kw):
        raise AssertionError("an intact cache entry was recompiled")
    monkeypatch.setattr(toolchain, "compile_hip_asm", no_compile)
    build._MEMO.clear()
    again = build.artifact(tiny_kernel)
    assert again.seconds == 0 and again.rebuilt is None and again.asm == first.asm
