"""The wave-by-wave reference schedule (lockstep off) gives the same numpy-checked results
as the default lockstep scheduler that test_emu_corpus runs."""
import pytest

from emu_corpus import CASES, asm_of

from mxgemm.emu import Emulator


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_schedule(name):
    emu = Emulator(race_check=True, lockstep=False)
    CASES[name](emu, emu.load(asm_of(name)))


_WAVES = r"""
#include "mxgemm/device.h"
using namespace mxgemm;
MXGEMM_KERNEL(waves)(int* __restrict__ out, const int* __restrict__ v) {
  int t = thread_x(), i = block_x() * 256 + t;
  int w = __builtin_amdgcn_readfirstlane(t >> 6);      // wave id: scalar, different per wave
  int x = v[i], acc = 0;
  for (int k = 0; k <= w; ++k) acc += x * (k + 1);      // per-wave trip count
  if (x & 1) acc ^= 0x55;                               // lanes diverge inside each wave
  out[i] = acc;
}"""


@pytest.mark.parametrize("lockstep", [False, True])
def test_waves_of_a_workgroup_diverge(lockstep):
    """Waves of one workgroup take different scalar paths: the lockstep unit splits."""
    import numpy as np
    import torch

    from mxgemm.toolchain import compile_hip_source
    v = torch.from_numpy(np.random.default_rng(5).integers(-1000, 1000, 512).astype(np.int32))
    out = torch.zeros(512, dtype=torch.int32)
    emu = Emulator(race_check=True, lockstep=lockstep)
    emu.launch(emu.load(compile_hip_source(_WAVES, "gfx950")), "waves", grid=2, block=256, args=[out, v])
    x = v.numpy().astype(np.int64)
    w = (np.arange(512) % 256) // 64
    ref = x * (w + 1) * (w + 2) // 2
    ref = np.where(x & 1, ref ^ 0x55, ref)
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.int32))
