"""Vector-memory loads return in issue order: a later load may overwrite an earlier one's
register with no wait in between (LLVM emits none: a spilling kernel's `scratch_load_dwordx2
v[80:81]` then `scratch_load_dword v81`), and the later data is what the register holds. Reading
the register before the wait is still a race."""
import pytest
import torch
from hip_run import program

from mxgemm.emu import RaceError

BLOCK = r"""
  v_mov_b32 v1, 11
  v_mov_b32 v2, 22
  v_mov_b32 v3, 33
  scratch_store_dwordx2 off, v[1:2], off
  scratch_store_dword off, v3, off offset:8
  s_waitcnt vmcnt(0)
  scratch_load_dwordx2 v[80:81], off, off
  scratch_load_dword v81, off, off offset:8
  %READ%
  s_waitcnt vmcnt(0)
  v_mbcnt_lo_u32_b32 v4, -1, 0
  v_mbcnt_hi_u32_b32 v4, -1, v4
  v_lshlrev_b32 v4, 3, v4
  global_store_dwordx2 v4, v[80:81], %0
  s_waitcnt vmcnt(0)
"""

SOURCE = r"""
MXGEMM_KERNEL(inorder)(int* __restrict__ out, const int* __restrict__ idx) {
  int a[48];                             // dynamically indexed: a private segment for the block below
  for (int k = 0; k < 48; ++k) a[k] = idx[k % 9] * (k + 1);
  a[idx[0] % 48] = -1;
  out[128] = a[idx[1] % 48];
  asm volatile(R"(%BLOCK%)" :: "s"(out) : "memory", "v1", "v2", "v3", "v4", "v5", "v80", "v81");
}
"""


def _run(read):
    emu, prog, _ = program(SOURCE.replace("%BLOCK%", BLOCK.replace("%READ%", read)))
    out = torch.zeros(129, dtype=torch.int32)
    emu.launch(prog, "inorder", grid=(1, 1, 1), block=(64, 1, 1), args=[out, torch.zeros(9, dtype=torch.int32)])
    return out[:128].view(64, 2)


def test_later_load_overwrites_earlier_loads_register_without_a_wait():
    assert _run("").tolist() == [[11, 33]] * 64


def test_reading_before_the_wait_is_still_a_race():
    with pytest.raises(RaceError, match="reads v81 while the load"):
        _run("v_mov_b32 v5, v81")
