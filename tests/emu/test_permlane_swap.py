"""v_permlane16_swap_b32 / v_permlane32_swap_b32 (gfx950), expected values written from the ISA's
description: VDST's odd 16-lane rows (permlane32: lanes 32-63) trade values with SRC0's even rows
(lanes 0-31), lane for lane; the other rows keep theirs."""
import pytest
import torch
from hip_run import program

from mxgemm.emu import EmulatorFault

SWAPS = r"""
  v_mbcnt_lo_u32_b32 v1, -1, 0
  v_mbcnt_hi_u32_b32 v1, -1, v1
  v_lshlrev_b32 v2, 2, v1
  v_lshlrev_b32 v3, 1, v1
  v_add_u32 v4, 1000, v1
  v_permlane16_swap_b32 v3, v4
  global_store_dword v2, v3, %0
  global_store_dword v2, v4, %0 offset:256
  v_lshlrev_b32 v5, 1, v1
  v_add_u32 v6, 1000, v1
  v_permlane32_swap_b32 v5, v6
  global_store_dword v2, v5, %0 offset:512
  global_store_dword v2, v6, %0 offset:768
  s_waitcnt vmcnt(0)
"""

PARTIAL = r"""
  v_mbcnt_lo_u32_b32 v1, -1, 0
  v_mbcnt_hi_u32_b32 v1, -1, v1
  v_lshlrev_b32 v2, 2, v1
  v_lshlrev_b32 v3, 1, v1
  v_add_u32 v4, 1000, v1
  s_mov_b64 s[20:21], exec
  s_mov_b64 exec, 0xffff
  v_permlane16_swap_b32_e64 v3, v4 %FI%
  s_mov_b64 exec, s[20:21]
  global_store_dword v2, v3, %0
  global_store_dword v2, v4, %0 offset:256
  s_waitcnt vmcnt(0)
"""


def _source(block):
    return (r"MXGEMM_KERNEL(swaps)(int* __restrict__ out) {"
            r'  asm volatile(R"(' + block + r')" :: "s"(out) : "memory", "v1", "v2", "v3", "v4", "v5", "v6", "s20", "s21");'
            r"}")


def _run(block):
    emu, prog, _ = program(_source(block))
    out = torch.full((4 * 64,), -1, dtype=torch.int32)
    emu.launch(prog, "swaps", grid=(1, 1, 1), block=(64, 1, 1), args=[out])
    return out.view(4, 64).tolist()


def test_swaps_trade_odd_rows_of_vdst_with_even_rows_of_src0():
    vdst16, src16, vdst32, src32 = _run(SWAPS)
    lanes = range(64)
    assert vdst16 == [1000 + l - 16 if (l // 16) % 2 else 2 * l for l in lanes]
    assert src16 == [1000 + l if (l // 16) % 2 else 2 * (l + 16) for l in lanes]
    assert vdst32 == [1000 + l - 32 if l >= 32 else 2 * l for l in lanes]
    assert src32 == [1000 + l if l >= 32 else 2 * (l + 32) for l in lanes]


def test_fetch_inactive_reads_the_inactive_partner_and_exec_masks_the_writes():
    """EXEC = row 0: its SRC0 takes row 1's VDST (fi: read although inactive); row 1 (inactive)
    writes nothing, so its VDST keeps 2 * lane."""
    vdst, src, *_ = _run(PARTIAL.replace("%FI%", "fi:1"))
    lanes = range(64)
    assert vdst == [2 * l for l in lanes]
    assert src == [2 * (l + 16) if l < 16 else 1000 + l for l in lanes]


def test_inactive_partner_without_fetch_inactive_is_refused():
    with pytest.raises(EmulatorFault, match="partner lane is inactive and fi is off"):
        _run(PARTIAL.replace("%FI%", ""))
