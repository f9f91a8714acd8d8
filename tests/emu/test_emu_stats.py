"""Emulator.last_stats counts, by construction: the kernel is one inline-assembly block (the
compiler adds only the kernarg load, its wait and s_endpgm, checked below), so every class
count and byte total is known from the block and the launch shape."""
import re

import pytest
import torch
from hip_run import program

BLOCK = r"""
  s_mov_b64 s[20:21], exec
  v_mbcnt_lo_u32_b32 v1, -1, 0
  v_mbcnt_hi_u32_b32 v1, -1, v1
  v_lshlrev_b32 v2, 4, v1
  global_load_dwordx4 v[4:7], v2, %0
  global_load_dword v8, v2, %0 offset:16
  s_waitcnt vmcnt(0)
  v_mfma_f32_16x16x32_bf16 v[12:15], v[4:7], v[4:7], 0
  v_mfma_f32_16x16x32_bf16 v[12:15], v[4:7], v[4:7], v[12:15]
  v_mfma_f32_32x32x16_bf16 v[16:31], v[4:7], v[4:7], 0
  s_nop 7
  ds_write_b128 v2, v[4:7]
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_read_b64 v[10:11], v2
  s_waitcnt lgkmcnt(0)
  s_mov_b64 exec, 0xffff
  global_store_dword v2, v10, %1
  global_store_dwordx2 v2, v[10:11], %1 offset:8
  s_mov_b64 exec, s[20:21]
  s_waitcnt vmcnt(0)
"""

SOURCE = r"""
MXGEMM_KERNEL(counted)(int* __restrict__ out, const int* __restrict__ x) {    // 1 KB dynamic LDS
  asm volatile(R"(%BLOCK%)" :: "s"(x), "s"(out) : "memory", "v1", "v2", "v4", "v5", "v6", "v7", "v8",
               "v10", "v11", "v12", "v13", "v14", "v15", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23",
               "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31", "s20", "s21");
}
""".replace("%BLOCK%", BLOCK)

# per wave (one 64-lane wave per workgroup): the block, plus the compiler's s_load, s_waitcnt, s_endpgm (salu)
PER_WAVE = {"salu": 4 + 1, "valu": 3, "mfma": 3, "vmem_load": 2, "vmem_load_bytes": (16 + 4) * 64,
            "vmem_store": 2, "vmem_store_bytes": (4 + 8) * 16, "lds_store": 1, "lds_store_bytes": 16 * 64,
            "lds_load": 1, "lds_load_bytes": 8 * 64, "lds_bytes": 24 * 64, "barrier": 1, "waitcnt": 4 + 1,
            "smem": 1, "wave_instructions": 21 + 3}


def _compiled():
    emu, prog, asm = program(SOURCE)
    body = asm.split("counted:", 1)[1].split(".Lfunc_end", 1)[0]
    outside = re.sub(r";;#ASMSTART.*?;;#ASMEND", "", body, flags=re.S)
    code = [ln.split(";")[0].split()[0] for ln in outside.splitlines() if ln.strip() and
            not ln.strip().startswith((";", "."))]
    assert code == ["s_load_dwordx4", "s_waitcnt", "s_endpgm"], code   # the compiler's part, known
    return emu, prog


def _launch(emu, prog, grid, **kw):
    out = torch.zeros(64 * 4 * grid, dtype=torch.int32)
    x = torch.arange(64 * 5, dtype=torch.int32)
    emu.launch(prog, "counted", grid=(grid, 1, 1), block=(64, 1, 1), args=[out, x], dynamic_lds=1024, **kw)
    return emu.last_stats


@pytest.mark.parametrize("grid", [1, 5])
def test_counts_known_by_construction(grid):
    emu, prog = _compiled()
    st = _launch(emu, prog, grid)
    assert st["workgroups"] == st["waves"] == grid
    for k, v in PER_WAVE.items():
        assert st[k] == v * grid, (k, st[k], v * grid)
    assert st["mfma_by_mnemonic"] == {"v_mfma_f32_16x16x32_bf16": 2 * grid, "v_mfma_f32_32x32x16_bf16": grid}
    assert st["mfma_by_shape"] == {"16x16x32": 2 * grid, "32x32x16": grid}
    assert "branch" not in st and "vmem_atomic" not in st


def test_counts_follow_the_workgroup_window():
    emu, prog = _compiled()
    st = _launch(emu, prog, 5, workgroups=[(1, 0, 0), (4, 0, 0)])
    assert st["workgroups"] == 2 and st["mfma"] == 6 and st["vmem_store_bytes"] == 2 * 192


@pytest.mark.parametrize("lockstep", [False, True])
def test_lockstep_units_count_every_wave(lockstep):
    """Four waves per workgroup (identical, so the default scheduler runs them as one lockstep
    unit): every count is the per-wave count times the waves run, on both schedules. Race
    checking is off because the block's waves write the same LDS bytes."""
    from mxgemm.emu import Emulator
    _, _, asm = program(SOURCE)
    emu = Emulator(race_check=False, lockstep=lockstep)
    prog = emu.load(asm)
    out = torch.zeros(64 * 4, dtype=torch.int32)
    x = torch.arange(64 * 5, dtype=torch.int32)
    emu.launch(prog, "counted", grid=(2, 1, 1), block=(256, 1, 1), args=[out, x], dynamic_lds=1024)
    st = emu.last_stats
    assert st["workgroups"] == 2 and st["waves"] == 8
    for k, v in PER_WAVE.items():
        assert st[k] == v * 8, (k, st[k], v * 8)
    assert st["mfma_by_shape"] == {"16x16x32": 16, "32x32x16": 8}
