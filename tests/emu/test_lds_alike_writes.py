"""Two waves writing an LDS dword in one barrier epoch race only if what they write differs:
bytes written alike (Triton stores a reduction result replicated across waves that way) or
unchanged leave nothing another wave could observe."""
import pytest
import torch
from hip_run import program

from mxgemm.emu import Emulator, RaceError

SOURCE = r"""
MXGEMM_KERNEL(alike)(int* __restrict__ out, int per_wave) {
  __shared__ int t[64];
  const int lane = mxgemm::thread_x() % 64, wave = mxgemm::thread_x() / 64;
  const int v = lane + per_wave * wave;      // per_wave 0: both waves write the same values
  asm volatile("ds_write_b32 %0, %1\n s_waitcnt lgkmcnt(0)" :: "v"(lane * 4 + (int)(long)t), "v"(v) : "memory");
  mxgemm::syncthreads();
  out[mxgemm::thread_x()] = t[lane];
}
"""


@pytest.mark.parametrize("lockstep", [True, False])
def test_waves_writing_alike_do_not_race(lockstep):
    _, _, asm = program(SOURCE)
    emu = Emulator(arch="gfx950", lockstep=lockstep)
    out = torch.zeros(128, dtype=torch.int32)
    emu.launch(emu.load(asm), "alike", grid=(1, 1, 1), block=(128, 1, 1), args=[out, 0])
    assert out.tolist() == list(range(64)) * 2


@pytest.mark.parametrize("lockstep", [True, False])
def test_waves_writing_different_values_race(lockstep):
    _, _, asm = program(SOURCE)
    emu = Emulator(arch="gfx950", lockstep=lockstep)
    out = torch.zeros(128, dtype=torch.int32)
    with pytest.raises(RaceError, match="LDS race"):
        emu.launch(emu.load(asm), "alike", grid=(1, 1, 1), block=(128, 1, 1), args=[out, 1000])
