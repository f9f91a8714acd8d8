"""Host extension: kernarg packing follows the kernel's metadata; the Launcher picks backends."""
import struct

import pytest
import torch

from mxgemm import build, launcher


@pytest.fixture(scope="module")
def art():
    return build.artifact("mxfp8_dequant", {}, "gfx950")


def _pack(art, args, grid=(3, 1, 1), block=(256, 1, 1)):
    layout, size = launcher._layout(art)
    return layout, launcher.host_ext().pack_kernarg(layout, size, args, list(grid), list(block), 0)


def test_pointers_and_scalars_land_at_metadata_offsets(art):
    x, s, o = torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8), torch.zeros(4, 32)
    view = o[1:]  # storage offset must be honoured
    layout, kb = _pack(art, [x, s, view, 3, -7])
    offs = {i: off for i, (off, _, _) in enumerate(layout)}
    assert struct.unpack_from("<Q", kb, offs[0])[0] == x.data_ptr()
    assert struct.unpack_from("<Q", kb, offs[2])[0] == view.data_ptr() == o.data_ptr() + 32 * 4
    assert struct.unpack_from("<ii", kb, offs[3]) == (3, -7)
    hidden = {k: off for off, _, k in layout if k.startswith("hidden_")}
    if "hidden_block_count_x" in hidden:  # code object v5+ runtime args
        assert struct.unpack_from("<I", kb, hidden["hidden_block_count_x"])[0] == 3
        assert struct.unpack_from("<H", kb, hidden["hidden_group_size_x"])[0] == 256


def test_argument_count_and_type_mismatches_raise(art):
    x = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="more arguments"):
        _pack(art, [x, x, x, 1])
    with pytest.raises(RuntimeError, match="5 arguments, 6 given"):
        _pack(art, [x, x, x, 1, 2, 3])
    with pytest.raises(RuntimeError, match="must be a tensor"):
        _pack(art, [1, x, x, 1, 2])
    with pytest.raises(RuntimeError, match="does not fit"):
        _pack(art, [x, x, x, 1 << 40, 2])


def test_hip_backend_absent_without_rocm(art):
    ext = launcher.host_ext()
    assert ext.has_hip() == bool(torch.version.hip)
    if not ext.has_hip():
        with pytest.raises(RuntimeError, match="compiled without ROCm"):
            ext.launch("hip", b"", "k", [1, 1, 1], [64, 1, 1], b"", [], 0, 0)


def test_emulator_settings_validate_names():
    with pytest.raises(TypeError, match="unknown emulator settings"):
        with launcher.emulator_settings(racecheck=False):
            pass


def test_hip_backend_source_compiles():
    """The hip Launcher cannot run here, but its code must stay compilable: build the host
    source with MXGEMM_WITH_HIP (the HIP runtime is dlopen'ed, so no HIP headers are needed)."""
    import subprocess
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    from mxgemm.registry import source_root
    src = source_root() / "csrc" / "host" / "mxgemm_host.cpp"
    inc = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    p = subprocess.run(["g++", "-fsyntax-only", "-std=c++17", "-w", "-DMXGEMM_WITH_HIP",
                        "-DTORCH_EXTENSION_NAME=mxgemm_host_hip", *inc, str(src)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
