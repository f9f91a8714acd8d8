"""LDS races at byte granularity for sub-dword accesses: waves writing different bytes of one
dword do not race (a byte histogram keeps per-thread counters that way); the same byte, or a
whole-dword access over another wave's byte, does."""
import pytest
import torch
from hip_run import program

from mxgemm.emu import Emulator, RaceError

SOURCE = r"""
MXGEMM_KERNEL(bytes)(int* __restrict__ out, int mode) {
  __shared__ int t[64];
  const int lane = mxgemm::thread_x() % 64, wave = mxgemm::thread_x() / 64;
  t[lane] = 0;
  mxgemm::syncthreads();
  const int byte = mode == 1 ? 0 : wave;             // mode 1: both waves write byte 0
  asm volatile("ds_write_b8 %0, %1\n s_waitcnt lgkmcnt(0)" :: "v"(lane * 4 + byte + (int)(long)t), "v"(wave + 1)
               : "memory");
  if (mode == 2 && wave == 1) {                      // mode 2: wave 1 reads the dword, no barrier
    int v;
    asm volatile("ds_read_b32 %0, %1\n s_waitcnt lgkmcnt(0)" : "=v"(v) : "v"(lane * 4 + (int)(long)t) : "memory");
    out[256 + lane] = v;
  }
  mxgemm::syncthreads();
  out[mxgemm::thread_x()] = t[lane];
}
"""


def _run(mode, lockstep):
    _, _, asm = program(SOURCE)
    emu = Emulator(arch="gfx950", lockstep=lockstep)
    out = torch.zeros(320, dtype=torch.int32)
    emu.launch(emu.load(asm), "bytes", grid=(1, 1, 1), block=(128, 1, 1), args=[out, mode])
    return out


@pytest.mark.parametrize("lockstep", [True, False])
def test_waves_writing_different_bytes_of_a_dword_do_not_race(lockstep):
    assert _run(0, lockstep)[:128].tolist() == [1 | 2 << 8] * 128


@pytest.mark.parametrize("lockstep", [True, False])
@pytest.mark.parametrize("mode", [1, 2])
def test_same_byte_or_a_whole_dword_over_another_waves_byte_races(mode, lockstep):
    with pytest.raises(RaceError, match="LDS race"):
        _run(mode, lockstep)
