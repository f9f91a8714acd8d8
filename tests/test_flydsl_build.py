"""FlyDSL compile-only path: the sample MXFP8 dequant kernel for gfx950 (wave64) and gfx1250 (wave32)."""
import re
import time
from pathlib import Path

import pytest

from mxgemm import toolchain
from mxgemm.flydsl_build import compile_flydsl, elf_machine, elf_sections

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "flydsl_kernels" / "mxfp8_dequant.py"
SYMBOL = "mxfp8_dequant"
# The documented ABI (module docstring): (offset, size, value_kind) per argument.
ABI = [(0, 8, "global_buffer"), (8, 8, "global_buffer"), (16, 8, "global_buffer"),
       (24, 4, "by_value"), (28, 4, "by_value")]


@pytest.fixture(scope="module", params=["gfx950", "gfx1250"])
def built(request, tmp_path_factory):
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    s, h = d / "k.s", d / "k.hsaco"
    t0 = time.perf_counter()
    compile_flydsl(SRC, arch, {}, s, h, SYMBOL)
    print(f"flydsl {arch}: {time.perf_counter() - t0:.1f}s")
    return arch, s, h


def _metadata_args(asm, symbol):
    meta = asm[asm.index(".amdgpu_metadata"):asm.index(".end_amdgpu_metadata")]
    assert re.search(rf"\.name:\s+{symbol}\n", meta)  # one kernel per FlyDSL module
    args = re.search(r"\.args:\n(.*?)\n    \.\w", meta, re.S).group(1)
    out = []
    for item in re.split(r"\n      - ", "\n" + args.strip("\n"))[1:]:
        f = dict(re.findall(r"\.(\w+):\s+(\S+)", "." + item.strip()))
        out.append((int(f["offset"]), int(f["size"]), f["value_kind"]))
    return out


def test_asm_kernel_and_abi(built):
    arch, s, _ = built
    asm = s.read_text()
    assert f"\n{SYMBOL}:" in asm and f".amdhsa_kernel {SYMBOL}" in asm
    assert f'.amdgcn_target "amdgcn-amd-amdhsa--{arch}"' in asm
    assert _metadata_args(asm, SYMBOL) == ABI
    assert re.search(r"\.kernarg_segment_size:\s+32\b", asm)
    wave = 64 if arch == "gfx950" else 32
    assert re.search(rf"\.wavefront_size:\s+{wave}\b", asm)
    assert "v_cvt_f32_fp8" in asm and "v_ldexp_f32" in asm  # exact hardware decode + scale


def test_hsaco_is_amdgpu_elf(built):
    _, _, h = built
    data = h.read_bytes()
    assert data[:4] == b"\x7fELF" and elf_machine(data) == 0xE0
    assert SYMBOL.encode() in data


def test_asm_reassembles_to_same_code(built, tmp_path):
    """The .s is the code object's assembly: clang re-assembles it to identical .text bytes."""
    arch, s, h = built
    out = tmp_path / "re.hsaco"
    if arch == "gfx1250" and "instprefsize" in s.read_text():
        # FlyDSL's LLVM is newer than clang 22: its gfx1250 kernel descriptor uses
        # `instprefsize(...)`, which clang 22 cannot parse; the hsaco comes from FlyDSL anyway.
        with pytest.raises(toolchain.ToolchainError):
            toolchain.assemble(s, arch, out)
        return
    toolchain.assemble(s, arch, out)
    assert elf_sections(out.read_bytes())[".text"] == elf_sections(h.read_bytes())[".text"]


def test_compile_error_is_toolchain_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def compile_for_build(arch, symbol, **v):\n"
                   "    raise RuntimeError('boom from kernel module')\n")
    with pytest.raises(toolchain.ToolchainError, match="boom from kernel module"):
        compile_flydsl(bad, "gfx950", {}, tmp_path / "k.s", tmp_path / "k.hsaco", "x")
