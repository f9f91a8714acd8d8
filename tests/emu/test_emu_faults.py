"""Memory safety of the emulator: an access outside every buffer of the launch, by any memory
instruction class, raises EmulatorFault naming the kernel, the line, the lane, the address and
the nearest buffer; an LDS access past the kernel's LDS allocation faults likewise. Lane 5 is
the only lane that strays; the buffers are sparse (far apart), so the nearest one is known."""
import re

import pytest
import torch
from hip_run import program

from mxgemm.emu import EmulatorFault

NBYTES = 256          # size of the buffer x
STRAY = 4096          # dwords past lane 5's element that lane 5 accesses

# class -> inline assembly (%0 result / data, %1 64-bit address, %2 V#, %3 voffset, %4 data)
CASES = {
    "global_load": 'global_load_dword %0, %1, off',
    "global_store": 'global_store_dword %1, %4, off',
    "flat_load": 'flat_load_dword %0, %1',
    "flat_store": 'flat_store_dword %1, %4',
    "global_atomic": 'global_atomic_add %1, %4, off',
    "global_atomic_rtn": 'global_atomic_add %0, %1, %4, off sc0',
    "buffer_load": 'buffer_load_dword %0, %3, %2, 0 offen',
    "buffer_store": 'buffer_store_dword %4, %3, %2, 0 offen',
    "buffer_atomic": 'buffer_atomic_add %4, %3, %2, 0 offen',
    "buffer_load_lds": 's_mov_b32 m0, %5\\n buffer_load_dword %3, %2, 0 offen lds',
    "global_load_lds": 's_mov_b32 m0, %5\\n global_load_lds_dword %1, off',
}
LDS_CASES = {"ds_read": "ds_read_b32 %0, %1", "ds_write": "ds_write_b32 %1, %4"}

SOURCE = r"""
MXGEMM_KERNEL(k)(int* __restrict__ out, int* __restrict__ x, int which, int lds_off) {
  __shared__ int t[64];
  int lane = mxgemm::thread_x();
  int stray = lane == 5 ? %STRAY% : 0;
  int* p = x + lane + stray;
  unsigned long b = (unsigned long)x;
  v4i rs = {(int)b, (int)(b >> 32), 0x7FFFFFFF, 0x00027000};     // num_records passes every offset
  int vo = 4 * (lane + stray), one = 1, r = 0, la = lds_off + 4 * lane + (lane == 5 ? 4096 : 0);
  int m0 = (int)(unsigned long)t;
  t[lane] = lane;
  switch (which) {
%CASES%
  }
  out[lane] = r + t[lane];
}
"""


def _source():
    cases = []
    for n, text in enumerate([*CASES.values(), *LDS_CASES.values()]):
        addr = "la" if n >= len(CASES) else "p"
        cases.append(f'  case {n}: asm volatile("{text}\\n s_waitcnt vmcnt(0) lgkmcnt(0)" : "+v"(r) : '
                     f'"v"({addr}), "s"(rs), "v"(vo), "v"(one), "s"(m0) : "memory", "m0"); break;')
    return SOURCE.replace("%STRAY%", str(STRAY)).replace("%CASES%", "\n".join(cases))


def _launch(which):
    emu, prog, _ = program(_source())
    x = emu.sparse_buffer(NBYTES)
    out = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(EmulatorFault) as e:
        emu.launch(prog, "k", grid=(1, 1, 1), block=(64, 1, 1), args=[out, x, which, 0])
    return str(e.value), x


@pytest.mark.parametrize("which", range(len(CASES)), ids=list(CASES))
def test_access_outside_every_buffer_faults(which):
    msg, x = _launch(which)
    addr = x.address + 4 * (5 + STRAY)
    mnemonic = CASES[list(CASES)[which]].split("\\n ")[-1].split()[0]
    assert re.search(rf"kernel 'k', line \d+: {mnemonic}", msg), msg
    assert "lane 5," in msg and f"address {addr:#x}" in msg, msg
    assert f"nearest buffer: {NBYTES} bytes at {x.address:#x}" in msg, msg
    assert f"{addr + 4 - x.address - NBYTES} bytes past its end" in msg, msg


@pytest.mark.parametrize("which", range(len(LDS_CASES)), ids=list(LDS_CASES))
def test_lds_access_past_allocation_faults(which):
    msg, _ = _launch(len(CASES) + which)
    mnemonic = list(LDS_CASES.values())[which].split()[0]
    assert re.search(rf"kernel 'k', line \d+: {mnemonic}", msg), msg
    assert "outside the 256-byte allocation: lane 5, address 0x1014" in msg, msg


def test_in_range_accesses_do_not_fault():
    """The same kernel with no stray lane (which = -1 takes no case) runs clean."""
    emu, prog, _ = program(_source())
    x = emu.sparse_buffer(NBYTES)
    out = torch.zeros(64, dtype=torch.int32)
    emu.launch(prog, "k", grid=(1, 1, 1), block=(64, 1, 1), args=[out, x, -1, 0])
    assert out.tolist() == list(range(64))
