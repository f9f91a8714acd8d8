"""Run a few lines of raw assembly on one emulated wave: per-lane uint32 inputs are loaded into
named VGPRs from a buffer, the body runs, named VGPRs are stored back. Expected values of the
tests that use it come from numpy / mxgemm.formats, never from the emulator."""
from __future__ import annotations

import struct

import numpy as np
import torch

from mxgemm.emu import Emulator
from mxgemm.hardware import ARCH_LIMITS

# gfx9 / gfx12 spellings of the few instructions the wrapper itself uses
_OPS = {"gfx950": dict(sload="s_load_dwordx2", load="global_load_dword", store="global_store_dword",
                       add="v_add_u32", wait_s="s_waitcnt lgkmcnt(0)", wait_v="s_waitcnt vmcnt(0)",
                       lane="v_mbcnt_lo_u32_b32 v0, -1, 0\n  v_mbcnt_hi_u32_b32 v0, -1, v0"),
        "gfx1250": dict(sload="s_load_b64", load="global_load_b32", store="global_store_b32",
                        add="v_add_nc_u32", wait_s="s_wait_kmcnt 0", wait_v="s_wait_loadcnt 0",
                        lane="v_mbcnt_lo_u32_b32 v0, -1, 0")}


def lanes(arch: str) -> int:
    return ARCH_LIMITS[arch]["wave_size"]


def kernel(arch: str, body: str, ins: list[int], outs: list[int], lds: int = 0) -> str:
    """Kernel ``t``: v0 = lane, v1 = 4 * lane, v2 = row address scratch; s[2:3] = the buffer
    (rows of one dword per lane: the inputs, then the outputs). Body registers start at v3."""
    o, n = _OPS[arch], lanes(arch)
    lines = [f"{o['sload']} s[2:3], s[0:1], 0", o["wait_s"], o["lane"], "v_lshlrev_b32 v1, 2, v0"]
    for k, r in enumerate(ins):
        lines += [f"{o['add']} v2, {4 * n * k}, v1", f"{o['load']} v{r}, v2, s[2:3]"]
    lines += [o["wait_v"], body]
    for k, r in enumerate(outs):
        lines += [f"{o['add']} v2, {4 * n * (len(ins) + k)}, v1", f"{o['store']} v2, v{r}, s[2:3]"]
    text = "\n".join(f"  {x}" for x in lines)
    agprs = "    .amdhsa_accum_offset 256\n" if arch == "gfx950" else ""
    return (f"  .text\n  .globl t\n  .p2align 8\n  .type t,@function\nt:\n{text}\n  s_endpgm\n.Lfunc_end0:\n"
            f"  .rodata\n  .amdhsa_kernel t\n    .amdhsa_user_sgpr_kernarg_segment_ptr 1\n"
            f"    .amdhsa_next_free_vgpr 256\n    .amdhsa_next_free_sgpr 64\n{agprs}"
            f"    .amdhsa_group_segment_fixed_size {lds}\n  .end_amdhsa_kernel\n")


def run(arch: str, body: str, inputs: dict[int, np.ndarray], outs: list[int], lds: int = 0) -> dict[int, np.ndarray]:
    """inputs: VGPR -> uint32 [lanes] (or a scalar, broadcast); returns VGPR -> uint32 [lanes]."""
    n = lanes(arch)
    regs = list(inputs)
    buf = np.zeros((len(regs) + len(outs), n), np.uint32)
    for k, r in enumerate(regs):
        buf[k] = np.broadcast_to(np.asarray(inputs[r], np.uint64).astype(np.uint32), (n,))
    t = torch.from_numpy(buf.view(np.int32).copy())
    emu = Emulator(arch=arch, race_check=True)
    emu.launch_kernarg(emu.load(kernel(arch, body, regs, outs, lds)), "t", (1, 1, 1), (n, 1, 1),
                       struct.pack("<Q", t.data_ptr()), [t])
    got = t.numpy().view(np.uint32)[len(regs):]
    return {r: got[k].copy() for k, r in enumerate(outs)}
