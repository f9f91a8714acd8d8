"""Launch path: kernarg packing follows the kernel's metadata; one backend decision; the HIP
launcher exists only with ROCm and its source stays compilable."""
import os
import struct
import subprocess
import sys

import pytest
import torch

from mxgemm import build, guards, kernarg, launcher


@pytest.fixture(scope="module")
def art():
    return build.artifact("mxfp8_dequant", {}, "gfx950")


def _pack(art, args, grid=(3, 1, 1), block=(256, 1, 1)):
    slots, size = launcher.layout(art)
    return slots, kernarg.pack(slots, size, args, grid, block, 0)


def test_pointers_and_scalars_land_at_metadata_offsets(art):
    x, s, o = torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8), torch.zeros(4, 32)
    view = o[1:]  # storage offset must be honoured
    slots, kb = _pack(art, [x, s, view, 3, -7])
    offs = {i: off for i, (off, _, _) in enumerate(slots)}
    assert struct.unpack_from("<Q", kb, offs[0])[0] == x.data_ptr()
    assert struct.unpack_from("<Q", kb, offs[2])[0] == view.data_ptr() == o.data_ptr() + 32 * 4
    assert struct.unpack_from("<ii", kb, offs[3]) == (3, -7)


def test_hidden_arguments_of_code_object_v5():
    """Layout of LLVM AMDGPUUsage's code object v5 hidden arguments: block counts (4 bytes),
    group sizes (2), remainders (2), grid dims (2) at offset 64 of the hidden block."""
    slots = [(0, 8, "global_buffer")] + [(8 + o, n, k) for o, n, k in (
        (0, 4, "hidden_block_count_x"), (4, 4, "hidden_block_count_y"), (8, 4, "hidden_block_count_z"),
        (12, 2, "hidden_group_size_x"), (14, 2, "hidden_group_size_y"), (16, 2, "hidden_group_size_z"),
        (18, 2, "hidden_remainder_x"), (64, 2, "hidden_grid_dims"), (80, 8, "hidden_hostcall_buffer"))]
    x = torch.zeros(4)
    kb = kernarg.pack(slots, 8 + 256, [x], (5, 2, 1), (64, 1, 1))
    assert struct.unpack_from("<III", kb, 8) == (5, 2, 1)
    assert struct.unpack_from("<HHHH", kb, 20) == (64, 1, 1, 0)
    assert struct.unpack_from("<H", kb, 8 + 64)[0] == 2 and struct.unpack_from("<Q", kb, 8 + 80)[0] == 0
    # the AQL packet's dimensionality counts work-items: one workgroup of 1x16 threads is 2-D
    for grid, block, dims in (((1, 1, 1), (64, 1, 1), 1), ((1, 1, 1), (1, 16, 1), 2), ((4, 1, 3), (64, 1, 1), 3)):
        kb = kernarg.pack(slots, 8 + 256, [x], grid, block)
        assert struct.unpack_from("<H", kb, 8 + 64)[0] == dims, (grid, block)


def test_argument_count_and_type_mismatches_raise(art):
    x = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(TypeError, match="5 arguments, 4 given"):
        _pack(art, [x, x, x, 1])
    with pytest.raises(TypeError, match="5 arguments, 6 given"):
        _pack(art, [x, x, x, 1, 2, 3])
    with pytest.raises(TypeError, match="must be a tensor"):
        _pack(art, [1, x, x, 1, 2])
    with pytest.raises(OverflowError, match="does not fit"):
        _pack(art, [x, x, x, 1 << 40, 2])


def test_backend_decision():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert launcher.backend_for(cpu, ("gfx950",)) == ("emu", "gfx950")
    with pytest.raises(guards.GuardError, match=r"\[arch\].*gfx950.*meta"):
        launcher.backend_for(meta, ("gfx950",))
    with pytest.raises(guards.GuardError, match=r"\[arch\] the emulator runs gfx950"):
        launcher.backend_for(cpu, ("gfx1250",))


@pytest.mark.parametrize("value, error, message", [
    ("hip", "mxgemm.guards.GuardError", "[backend] MXGEMM_BACKEND=hip needs tensors on a ROCm GPU; they are on cpu"),
    ("bogus", "mxgemm.env.EnvError", "MXGEMM_BACKEND='bogus': must be one of emu, hip")])
def test_backend_variable_is_checked_before_launch(value, error, message):
    """MXGEMM_BACKEND is read once per process: check it in a fresh one."""
    code = ("import torch, mxgemm\n"
            "try:\n"
            "    mxgemm.mxfp8_dequantize(torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))\n"
            f"except {error} as e:\n"
            "    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "MXGEMM_BACKEND": value})
    assert message in p.stdout, p.stderr[-2000:]


def test_emulator_settings_validate_names():
    with pytest.raises(TypeError, match="unknown emulator settings"):
        with launcher.emulator_settings(racecheck=False):
            pass
