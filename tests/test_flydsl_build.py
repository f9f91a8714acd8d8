"""FlyDSL compile-only path: the sample MXFP8 dequant kernel for gfx950 (wave64) and gfx1250 (wave32)."""
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("flydsl")
pytest.importorskip("ziglang")

from mxgemm import toolchain  # noqa: E402
from mxgemm.flydsl_build import compile_flydsl, elf_machine, elf_sections, flydsl_kernel_symbol  # noqa: E402

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
    compile_flydsl(SRC, arch, {}, s, h)
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


def test_symbol():
    assert flydsl_kernel_symbol(SRC, {}) == SYMBOL
    assert flydsl_kernel_symbol(SRC, {"THREADS": 128, "VEC": 4}) != SYMBOL


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
    try:
        toolchain.find_compiler(arch)
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    out = tmp_path / "re.hsaco"
    try:
        toolchain.assemble(s, arch, out)
    except toolchain.ToolchainError as e:
        # FlyDSL's LLVM is newer than clang 22: its gfx1250 kernel descriptor uses
        # `instprefsize(...)`, which clang 22 cannot parse. The hsaco comes from FlyDSL anyway.
        if arch == "gfx1250" and "instprefsize" in s.read_text():
            pytest.skip(f"clang {toolchain.find_compiler(arch).version} cannot re-assemble FlyDSL's gfx1250 .s")
        raise
    assert elf_sections(out.read_bytes())[".text"] == elf_sections(h.read_bytes())[".text"]


def test_compile_error_is_toolchain_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def kernel_symbol(**v):\n    return 'x'\n\ndef compile_for_build(arch, **v):\n"
                   "    raise RuntimeError('boom from kernel module')\n")
    with pytest.raises(toolchain.ToolchainError, match="boom from kernel module"):
        compile_flydsl(bad, "gfx950", {}, tmp_path / "k.s", tmp_path / "k.hsaco")


# ---- execution on the gfx950 emulator (skipped until mxgemm.emu / the launcher exist) -------

SCALES = (0, 1, 100, 126, 127, 128, 200, 254, 255)


def _reference(x: "np.ndarray", scale: "np.ndarray", K: int):
    import ml_dtypes
    import numpy as np
    ks = (K + 31) // 32
    s = np.repeat(scale.reshape(-1, ks).astype(np.int64), 32, axis=1)[:, :K]
    v = x.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.exp2(s - 127.0)  # exact in f64
    v = v.astype(np.float32)  # the single RNE rounding (denormals kept, overflow -> inf)
    v[s == 255] = np.nan
    return v


def _launch_emu(M, K, x, scale):
    import torch
    launcher = pytest.importorskip("mxgemm.launcher")
    build = pytest.importorskip("mxgemm.build")
    try:
        import mxgemm.emu as emu
        emu.Emulator  # noqa: B018
    except (ImportError, AttributeError) as e:
        pytest.skip(f"emulator not available: {e}")
    art = build.artifact("mxfp8_dequant_flydsl", {}, "gfx950")
    out = torch.full((M, K), -1.0, dtype=torch.float32)
    grid = ((M * K + 1023) // 1024, 1, 1)
    try:
        launcher.launch(art, grid, (256, 1, 1), [torch.from_numpy(x), torch.from_numpy(scale), out, M, K])
    except emu.UnsupportedInstruction as e:  # the emulator is growing; run once it covers the kernel
        pytest.skip(f"emulator: {e}")
    return out.numpy()


@pytest.mark.parametrize("K", [256, 48])  # 48: partial last scale block and a ragged tail
def test_emulated_dequant_matches_reference(K):
    import numpy as np
    pytest.importorskip("ml_dtypes")
    M = len(SCALES)
    x = (np.arange(M * K, dtype=np.int64) % 256).astype(np.uint8).reshape(M, K)  # every code, per row
    ks = (K + 31) // 32
    scale = np.repeat(np.array(SCALES, dtype=np.uint8)[:, None], ks, axis=1).copy()
    got = _launch_emu(M, K, x, scale)
    ref = _reference(x, scale, K)
    nan_ref, nan_got = np.isnan(ref), np.isnan(got)
    assert (nan_ref == nan_got).all(), np.argwhere(nan_ref != nan_got)[:8]
    bad = np.argwhere(~nan_ref & (got.view(np.int32) != ref.view(np.int32)))  # bit-exact, signed zeros too
    assert bad.size == 0, [(tuple(i), int(x[tuple(i)]), int(scale[i[0], i[1] // 32]),
                            float(got[tuple(i)]), float(ref[tuple(i)])) for i in bad[:8]]
