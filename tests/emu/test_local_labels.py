"""GNU numeric local labels (``1:``, branches to ``1b`` / ``1f``), as hand-written inline assembly
uses them: ``Nb`` is the nearest ``N:`` before the branch, ``Nf`` the nearest after, and a
number may be defined many times."""
import pytest
import torch
from hip_run import program

from mxgemm.emu import UnsupportedInstruction

BLOCK = r"""
  v_mbcnt_lo_u32_b32 v1, -1, 0
  v_mbcnt_hi_u32_b32 v1, -1, v1
  v_lshlrev_b32 v2, 2, v1
  s_mov_b32 s20, 0
  v_mov_b32 v3, 0
1:
  v_add_u32 v3, 1, v3
  s_add_u32 s20, s20, 1
  s_cmp_lt_u32 s20, 5
  s_cbranch_scc1 1b
  s_cmp_eq_u32 s20, 5
  s_cbranch_scc1 1f
  v_mov_b32 v3, 100
1:
  v_add_u32 v3, 10, v3
  s_branch 2f
1:
  v_mov_b32 v3, 200
2:
  s_cmp_eq_u32 s20, 6
  s_cbranch_scc1 1b
  global_store_dword v2, v3, %0
  s_waitcnt vmcnt(0)
"""

SOURCE = r"""
MXGEMM_KERNEL(local_labels)(int* __restrict__ out) {
  asm volatile(R"(%BLOCK%)" :: "s"(out) : "memory", "v1", "v2", "v3", "s20");
}
""".replace("%BLOCK%", BLOCK)


def test_numeric_local_labels_branch_to_the_nearest_definition():
    """The loop runs 5 times (1b: the first 1:), 1f skips `v_mov 100` to the second 1:, 2f skips
    the third 1: block, and the last 1b (s20 is 5, not 6, so not taken) would go to the third."""
    emu, prog, _ = program(SOURCE)
    out = torch.full((64,), -1, dtype=torch.int32)
    emu.launch(prog, "local_labels", grid=(1, 1, 1), block=(64, 1, 1), args=[out])
    assert out.tolist() == [15] * 64


def test_backward_reference_without_a_definition_is_refused():
    emu, _, asm = program(SOURCE)
    broken = asm.replace("s_cbranch_scc1 1b", "s_cbranch_scc1 3b", 1)
    assert broken != asm
    with pytest.raises(UnsupportedInstruction, match="local label 3b has no definition before it"):
        emu.load(broken)
