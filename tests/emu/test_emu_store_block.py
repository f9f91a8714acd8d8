"""gfx1250 global_store_block (docs/gfx1250_emulator.md §5): the dword at a lane's address + 4 i
takes VGPR vsrc + i when bit i of M0 is set; a clear bit writes nothing and still moves the next
VGPR 4 bytes on (the RDNA4 ISA guide's block load / store section; LLVM's assembler syntax
vaddr, vsrc[32], saddr). Expected memory from numpy, read back with plain loads."""
import numpy as np
import pytest
from asm_wave import run

from mxgemm.emu import RaceError

A, N = "gfx1250", 32
CANARY = 0xA5A5A5A5


def stored(mask, exec_lo=0xFFFFFFFF, offset=0):
    """Lane l stores v[16:47] (row i of the inputs in v16 + i) at the 32 canary rows, 128 l +
    offset bytes in, then row k of that region (lane j: dword i = j of lane k's block) is read
    back into v48 + k."""
    x = np.random.default_rng(mask & 0xFFFF).integers(0, 1 << 32, (N, N), dtype=np.uint64).astype(np.uint32)
    rows = {16 + i: x[i] for i in range(N)} | {100 + k: CANARY for k in range(N + 1)}
    body = ["v_lshlrev_b32 v6, 7, v0", f"v_add_nc_u32 v6, {4 * N * N}, v6", f"s_mov_b32 m0, {mask:#x}",
            "s_mov_b32 s20, exec_lo", f"s_mov_b32 exec_lo, {exec_lo:#x}",
            f"global_store_block v6, v[16:47], s[2:3] offset:{offset}", "s_mov_b32 exec_lo, s20", "s_wait_storecnt 0"]
    for k in range(N + 1):
        body += [f"v_add_nc_u32 v7, {4 * N * (N + k)}, v1", f"global_load_b32 v{48 + k}, v7, s[2:3]"]
    out = run(A, "\n  ".join([*body, "s_wait_loadcnt 0"]), rows, list(range(48, 48 + N + 1)))
    return x, np.stack([out[48 + k] for k in range(N + 1)])


def expected(x, mask, exec_lo=0xFFFFFFFF, offset=0):
    """want[k, j]: the dword at canary byte 128 k + 4 j, i.e. lane k's block at offset."""
    flat = np.full(N * (N + 1), CANARY, np.uint32)
    for lane in range(N):
        if exec_lo >> lane & 1:
            for i in range(N):
                if mask >> i & 1:
                    flat[lane * N + offset // 4 + i] = x[i][lane]
    return flat.reshape(N + 1, N)


@pytest.mark.parametrize("mask", [0xFFFFFFFF, 0x12345678, 0x80000001, 0])
def test_store_block_writes_only_the_dwords_m0_selects(mask):
    x, got = stored(mask)
    np.testing.assert_array_equal(got, expected(x, mask))


def test_store_block_under_half_exec_with_an_offset():
    x, got = stored(0xF0F0F0F3, exec_lo=0x0000FFFF, offset=8)
    np.testing.assert_array_equal(got, expected(x, 0xF0F0F0F3, 0x0000FFFF, 8))


def test_store_block_of_a_register_a_load_still_fills_races():
    body = "\n  ".join(["s_mov_b32 m0, 0x10", "global_load_b32 v20, v1, s[2:3]", "global_store_block v1, v[16:47], s[2:3]"])
    with pytest.raises(RaceError, match="v20"):
        run(A, body, {}, [3])
