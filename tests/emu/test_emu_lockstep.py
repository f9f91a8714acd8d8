"""The wave-by-wave reference schedule (lockstep off) gives the same numpy-checked results
as the default lockstep scheduler that test_emu_corpus runs."""
import numpy as np
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


# ---- batches: the workgroups of a launch run together, lockstep units span them (wave.py)

_SYNC = r"""
#include "mxgemm/device.h"
using namespace mxgemm;
#define SYNC() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); \
                    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)
"""

_BATCH = _SYNC + r"""
MXGEMM_KERNEL(batch)(int* __restrict__ out, const int* __restrict__ v, int rounds) {
  __shared__ int s[256];
  int t = thread_x(), g = block_x(), i = g * 256 + t;
  int acc = v[i];
  int n = g % 3 + rounds;                 // per-workgroup trip count: workgroups pass different barrier counts
  for (int r = 0; r < n; ++r) {
    s[t] = acc + g * r;
    SYNC();
    acc += s[255 - t] * (r + 1);          // another wave's value, from this workgroup's LDS
    SYNC();
  }
  if (g & 1) acc = -acc;                  // a per-workgroup scalar branch
  out[i] = acc;
}"""


def _batch_ref(v, rounds):
    out = v.astype(np.int64).reshape(-1, 256).copy()
    for g, acc in enumerate(out):
        for r in range(g % 3 + rounds):
            acc += (acc + g * r)[::-1] * (r + 1)
        if g & 1:
            acc *= -1
    return out.reshape(-1)


@pytest.mark.parametrize("lockstep", [False, True])
def test_workgroups_of_a_batch_keep_their_lds_and_scalar_paths(lockstep):
    """8 workgroups of 4 waves: one batch, whose first lockstep unit spans all 32 waves (the
    workgroup id a per-wave SGPR), then splits per workgroup at the loop bound that differs.
    Results equal numpy on both schedules; the wave-by-wave one never runs a unit wider than 1."""
    import torch

    from mxgemm.toolchain import compile_hip_source
    v = np.random.default_rng(7).integers(-50, 50, 8 * 256).astype(np.int32)
    out = torch.zeros(8 * 256, dtype=torch.int32)
    emu = Emulator(race_check=True, lockstep=lockstep)
    emu.launch(emu.load(compile_hip_source(_BATCH, "gfx950")), "batch", grid=8, block=256,
               args=[out, torch.from_numpy(v), 1])
    np.testing.assert_array_equal(out.numpy(), _batch_ref(v, 1).astype(np.int32))
    assert emu.last_stats["widest_unit"] == (32 if lockstep else 1)


_LDS_PAST = r"""
#include "mxgemm/device.h"
using namespace mxgemm;
MXGEMM_KERNEL(lds_past)(int* __restrict__ out, const int* __restrict__ idx) {
  __shared__ int s[64];
  int t = thread_x();
  s[t] = t;
  out[block_x() * 64 + t] = s[idx[block_x() * 64 + t]];
}"""


def test_lds_bounds_are_the_workgroups_in_a_batch():
    """Workgroup 0 reads s[64], one past its 256 bytes: the batch's LDS continues with
    workgroup 1's region there, yet the access faults."""
    import torch

    from mxgemm.emu import EmulatorFault
    from mxgemm.toolchain import compile_hip_source
    emu = Emulator(race_check=False)
    prog = emu.load(compile_hip_source(_LDS_PAST, "gfx950"))
    idx = torch.zeros(128, dtype=torch.int32)
    out = torch.zeros(128, dtype=torch.int32)
    emu.launch(prog, "lds_past", grid=2, block=64, args=[out, idx])
    assert emu.last_stats["widest_unit"] == 2
    idx[5] = 64
    with pytest.raises(EmulatorFault, match=r"outside the 256-byte allocation: lane 5, address 0x100"):
        emu.launch(prog, "lds_past", grid=2, block=64, args=[out, idx])


_RACY = r"""
#include "mxgemm/device.h"
using namespace mxgemm;
MXGEMM_KERNEL(racy)(int* __restrict__ out, int bad) {
  __shared__ int s[256];
  int t = thread_x(), g = block_x();
  s[t] = t;
  int j = g == bad ? (t + 64) & 255 : t;      // workgroup `bad` reads the next wave's slot, no barrier
  out[g * 256 + t] = s[j];
}"""


@pytest.mark.parametrize("lockstep", [False, True])
def test_lds_race_in_one_workgroup_of_a_batch(lockstep):
    import torch

    from mxgemm.emu import RaceError
    from mxgemm.toolchain import compile_hip_source
    emu = Emulator(race_check=True, lockstep=lockstep)
    prog = emu.load(compile_hip_source(_RACY, "gfx950"))
    out = torch.zeros(4 * 256, dtype=torch.int32)
    emu.launch(prog, "racy", grid=4, block=256, args=[out, -1])
    np.testing.assert_array_equal(out.numpy(), np.tile(np.arange(256), 4))
    with pytest.raises(RaceError, match=r"LDS race at byte 0x\w+ \(workgroup \(2, 0, 0\), wave [0-3]\)"):
        emu.launch(prog, "racy", grid=4, block=256, args=[out, 2])


_TICKETS = _SYNC + r"""
MXGEMM_KERNEL(tickets)(int* __restrict__ out, int* __restrict__ counter, const int* __restrict__ work) {
  __shared__ int s[64];
  int g = block_x(), t = thread_x(), n = work[g];
  int acc = 0;
  for (int k = 0; k < n; ++k) {                          // workgroups of unequal length (in barriers)
    s[t] = (k ^ t) & 7;
    SYNC();
    acc += s[63 - t];
    SYNC();
  }
  if (t == 0) out[g] = __hip_atomic_fetch_add(counter, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) * 1000 + (acc & 0xFF);
}"""


@pytest.mark.parametrize("order", ["linear", "shuffled"])
def test_global_atomics_keep_the_launch_order(order):
    """Workgroups observe each other only through global atomics; a kernel with them runs
    its workgroups one at a time in launch order (linear, or the seeded shuffle), never by
    progress inside a batch: the ticket of each workgroup is its launch position, although
    the later workgroups pass fewer barriers."""
    import torch

    from mxgemm.toolchain import compile_hip_source
    emu = Emulator(race_check=True, wg_order=order, seed=3)
    prog = emu.load(compile_hip_source(_TICKETS, "gfx950"))
    out, counter = torch.zeros(6, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    work = torch.tensor([60, 50, 40, 30, 20, 10], dtype=torch.int32)
    emu.launch(prog, "tickets", grid=6, block=64, args=[out, counter, work])
    launch_pos = np.arange(6)
    if order == "shuffled":
        launch_pos = np.empty(6, int)
        perm = [(x, 0, 0) for x in range(6)]
        np.random.default_rng(3).shuffle(perm)
        launch_pos[[p[0] for p in perm]] = np.arange(6)
    np.testing.assert_array_equal(out.numpy() // 1000, launch_pos)
