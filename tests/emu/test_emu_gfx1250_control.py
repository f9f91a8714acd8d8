"""gfx1250 control, clock, barrier-state and block / cluster load instructions on the emulator
(docs/gfx1250_emulator.md §5, §6). Expected values come from the documented rules: byte
displacements from the encoding sizes the project's assembler gives (checked here), the clock's
one tick per issued wave-instruction, the barrier-state fields of the Linux gfx12 trap handler,
the block load's M0 rule; data from numpy, never from the emulator."""
import re
import struct
import subprocess

import numpy as np
import pytest
import torch
from asm_wave import run

from mxgemm.emu import Emulator, EmulatorFault, UnsupportedInstruction
from mxgemm.toolchain import find_compiler

A = "gfx1250"
N = 32


def encoded_sizes(lines):
    """Bytes of each line as the project's assembler encodes it for gfx1250."""
    argv = [*find_compiler(A).clang, "-cc1as", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", A, "-show-encoding",
            "-filetype", "asm", "-", "-o", "-"]
    out = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    return [len(m.split(",")) for m in re.findall(r"encoding: \[([^\]]*)\]", out)]


def u64(out, lo, hi):
    return int(out[lo][0]) | int(out[hi][0]) << 32


# ---- s_add_pc_i64 ----------------------------------------------------------------------------

SKIPPED = ["s_mov_b32 s10, 0x12345", "s_add_co_i32 s10, s10, 1", "v_mov_b32 v11, 0x777"]


def test_add_pc_skips_the_bytes_of_the_instructions_it_jumps_over():
    """PC = the next instruction's address + S0: 20 bytes over a literal SOP1 (8), a SOP2 (4)
    and a literal VOP1 (8) land on the label after them."""
    assert encoded_sizes(SKIPPED) == [8, 4, 8]
    body = "\n  ".join(["s_mov_b32 s10, 0", "v_mov_b32 v11, 0", "s_mov_b64 s[6:7], 20", "s_add_pc_i64 s[6:7]",
                        *SKIPPED, "s_add_co_i32 s10, s10, 2", "v_mov_b32 v10, s10"])
    out = run(A, body, {}, [10, 11])
    assert int(out[10][0]) == 2 and int(out[11][0]) == 0


def test_add_pc_backward_constant_loops():
    """s_add_pc_i64 -16 after three 4-byte instructions and itself (4 bytes) returns to the loop
    head, three passes; s_get_pc_i64 before the loop and after it read addresses 20 bytes apart
    (the loop's 16 bytes and the 4 of the second s_get_pc_i64)."""
    loop = ["s_add_co_i32 s10, s10, 1", "s_cmp_lt_u32 s10, 3", "s_cbranch_scc0 .Ldone", "s_add_pc_i64 -16"]
    assert encoded_sizes([s.replace(".Ldone", "0") for s in loop] + ["s_get_pc_i64 s[6:7]"]) == [4, 4, 4, 4, 4]
    body = "\n".join(["s_mov_b32 s10, 0", "  s_get_pc_i64 s[4:5]", ".Lloop:", *[f"  {s}" for s in loop], ".Ldone:",
                      "  s_get_pc_i64 s[6:7]", "  s_sub_nc_u64 s[6:7], s[6:7], s[4:5]", "  v_mov_b32 v10, s10",
                      "  v_mov_b32 v11, s6"])
    out = run(A, body, {}, [10, 11])
    assert int(out[10][0]) == 3 and int(out[11][0]) == 20


def test_add_pc_into_the_middle_of_an_instruction_faults():
    body = "s_mov_b64 s[6:7], 4\n  s_add_pc_i64 s[6:7]\n  s_mov_b32 s10, 0x12345\n  v_mov_b32 v10, s10"
    with pytest.raises(EmulatorFault, match="not an instruction"):
        run(A, body, {}, [10])


def test_rfe_returns_to_the_address_in_its_pair():
    body = """s_mov_b32 s10, 0
  s_get_pc_i64 s[4:5]
  s_add_co_i32 s10, s10, 1
  s_cmp_eq_u32 s10, 2
  s_cbranch_scc1 .Ldone
  s_rfe_i64 s[4:5]
.Ldone:
  v_mov_b32 v10, s10"""
    assert int(run(A, body, {}, [10])[10][0]) == 2


# ---- the clock -------------------------------------------------------------------------------

def test_shader_cycles_counts_issued_instructions():
    """Two reads around N = 5 instructions differ by N + 1 (the first read itself issues); a
    third read, then MSG_RTN_GET_REALTIME right after it, each one further on."""
    body = """s_get_shader_cycles_u64 s[4:5]
  s_nop 0
  s_nop 1
  s_add_co_i32 s12, s12, 1
  s_monitor_sleep 1
  s_nop 0
  s_get_shader_cycles_u64 s[6:7]
  s_get_shader_cycles_u64 s[8:9]
  s_sendmsg_rtn_b64 s[10:11], sendmsg(MSG_RTN_GET_REALTIME)
  v_mov_b32 v10, s4
  v_mov_b32 v11, s5
  v_mov_b32 v12, s6
  v_mov_b32 v13, s7
  v_mov_b32 v14, s8
  v_mov_b32 v15, s9
  v_mov_b32 v16, s10
  v_mov_b32 v17, s11"""
    out = run(A, body, {}, list(range(10, 18)))
    t0, t1, t2, t3 = (u64(out, r, r + 1) for r in (10, 12, 14, 16))
    assert t0 > 0 and t1 - t0 == 6 and t2 - t1 == 1 and t3 - t2 == 1


def test_getreg_shader_cycles_halves_read_the_same_clock():
    """gfx12's HW_REG_SHADER_CYCLES_HI / _LO are the halves of the 64-bit counter: LO read right
    after s_get_shader_cycles_u64 is its low word + 1, HI its high word, and a 20-bit field of LO
    the low 20 bits of the next tick."""
    body = """s_get_shader_cycles_u64 s[4:5]
  s_getreg_b32 s6, hwreg(HW_REG_SHADER_CYCLES_LO)
  s_getreg_b32 s7, hwreg(HW_REG_SHADER_CYCLES_HI)
  s_getreg_b32 s8, hwreg(HW_REG_SHADER_CYCLES_LO, 0, 20)
  v_mov_b32 v10, s4
  v_mov_b32 v11, s5
  v_mov_b32 v12, s6
  v_mov_b32 v13, s7
  v_mov_b32 v14, s8"""
    out = run(A, body, {}, [10, 11, 12, 13, 14])
    t = u64(out, 10, 11)
    assert t > 0 and int(out[12][0]) == (t + 1) & 0xFFFFFFFF and int(out[13][0]) == (t + 2) >> 32
    assert int(out[14][0]) == (t + 3) & 0xFFFFF


def test_sendmsg_rtn_without_a_meaning_in_the_emulator_raises():
    with pytest.raises(UnsupportedInstruction, match="message MSG_RTN_GET_DOORBELL: only MSG_RTN_GET_REALTIME"):
        run(A, "s_sendmsg_rtn_b32 s4, sendmsg(MSG_RTN_GET_DOORBELL)", {}, [])


# ---- barrier state ---------------------------------------------------------------------------

def state(members, signals, valid=1):
    """The trap handler's fields: valid bit 0, member count 10:4, signal count 22:16."""
    return valid | members << 4 | signals << 16


def launch(body, grid, block, cluster=None):
    """Kernel ``b`` run wave after wave (lockstep off): every lane stores v10 and v11 at
    out[workgroup][0 / 1][thread]; the workgroup id is ttmp9 * cluster + ttmp6[3:0]."""
    meta = ""
    if cluster:
        meta = (f"  .amdgpu_metadata\n---\namdhsa.kernels:\n  - .name: b\n    .wavefront_size: 32\n"
                f"    .cluster_dims: [{cluster}, 1, 1]\n...\n  .end_amdgpu_metadata\n")
    text = f"""  .text
  .globl b
  .p2align 8
  .type b,@function
b:
  s_load_b64 s[2:3], s[0:1], 0
  s_wait_kmcnt 0
  {body}
  s_and_b32 s21, ttmp6, 15
  s_mul_i32 s20, ttmp9, {cluster or 1}
  s_add_co_i32 s20, s20, s21
  s_mul_i32 s20, s20, {8 * block}
  s_add_co_u32 s2, s2, s20
  s_add_co_ci_u32 s3, s3, 0
  v_lshlrev_b32 v1, 2, v0
  global_store_b32 v1, v10, s[2:3]
  global_store_b32 v1, v11, s[2:3] offset:{4 * block}
  s_endpgm
.Lfunc_end0:
  .rodata
  .amdhsa_kernel b
    .amdhsa_user_sgpr_kernarg_segment_ptr 1
    .amdhsa_next_free_vgpr 64
    .amdhsa_next_free_sgpr 64
  .end_amdhsa_kernel
{meta}"""
    out = torch.zeros(grid * 2 * block, dtype=torch.int32)
    emu = Emulator(arch=A, race_check=True, lockstep=False)
    emu.launch_kernarg(emu.load(text), "b", (grid, 1, 1), (block, 1, 1), struct.pack("<Q", out.data_ptr()), [out])
    return out.numpy().view(np.uint32).reshape(grid, 2, block // N, N)[..., 0]    # lane 0 of each wave


def test_workgroup_barrier_state_counts_signals_since_completion():
    """Two waves run one after the other: wave 0 sees 0 of 2 members signalled, then 1 after its
    signal; wave 1 sees wave 0's signal, and its own completes the barrier (0 again)."""
    body = """s_get_barrier_state s4, -1
  s_barrier_signal -1
  s_get_barrier_state s5, -1
  s_barrier_wait -1
  v_mov_b32 v10, s4
  v_mov_b32 v11, s5"""
    got = launch(body, 1, 64)[0]
    np.testing.assert_array_equal(got, [[state(2, 0), state(2, 1)], [state(2, 1), state(2, 0)]])


def test_cluster_barrier_state_valid_only_in_a_cluster():
    """In a cluster of two one-wave workgroups, run in order, workgroup 0 after its signal sees 1
    of 2, workgroup 1 sees the barrier complete; the message and s_get_barrier_state -3 agree.
    Outside a cluster launch the state is 0 (valid clear)."""
    body = """s_barrier_signal -3
  s_sendmsg_rtn_b32 s4, sendmsg(MSG_RTN_GET_CLUSTER_BARRIER_STATE)
  s_get_barrier_state s5, -3
  s_barrier_wait -3
  v_mov_b32 v10, s4
  v_mov_b32 v11, s5"""
    got = launch(body, 2, 32, cluster=2)[:, :, 0]
    np.testing.assert_array_equal(got, [[state(2, 1)] * 2, [state(2, 0)] * 2])
    plain = """s_sendmsg_rtn_b32 s4, sendmsg(MSG_RTN_GET_CLUSTER_BARRIER_STATE)
  s_get_barrier_state s5, -3
  v_mov_b32 v10, s4
  v_mov_b32 v11, s5"""
    np.testing.assert_array_equal(launch(plain, 1, 32)[0, :, 0], [0, 0])


# ---- block and cluster loads -----------------------------------------------------------------

def data(rows, seed):
    return np.random.default_rng(seed).integers(0, 1 << 32, (rows, N), dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("mask", [0x12345678, 0x80000001, 0])
def test_load_block_fills_only_the_registers_m0_selects(mask):
    """Lane l's 32 consecutive dwords (address 128 l: row l of the inputs) go to v16 + i where
    bit i of M0 is set; the others keep 0xA5A5A5A5."""
    x = data(N, 3)
    body = "\n  ".join([*(f"v_mov_b32 v{16 + i}, 0xa5a5a5a5" for i in range(N)), "v_lshlrev_b32 v6, 7, v0",
                        f"s_mov_b32 m0, {mask:#x}", "global_load_block v[16:47], v6, s[2:3]", "s_wait_loadcnt 0"])
    out = run(A, body, {100 + r: x[r] for r in range(N)}, list(range(16, 48)))
    want = np.where((mask >> np.arange(N) & 1).astype(bool)[:, None], x.T, np.uint32(0xA5A5A5A5))
    np.testing.assert_array_equal(np.stack([out[16 + i] for i in range(N)]), want)


def test_cluster_loads_are_global_loads_of_each_lane_address():
    """Outside a cluster each wave gets what a global load of its own address returns: b32 at
    the SGPR base - 64 + 4 l + 64, b64 at a 64-bit address 8 l, b128 at base + 16 l + 16."""
    x = data(8, 4)
    flat = x.ravel()
    body = """s_mov_b32 m0, 1
  v_add_nc_u32 v20, 64, v1
  cluster_load_b32 v10, v20, s[2:3] offset:-64
  v_lshlrev_b32 v21, 3, v0
  v_add_co_u32 v22, vcc_lo, s2, v21
  v_add_co_ci_u32 v23, vcc_lo, s3, 0, vcc_lo
  cluster_load_b64 v[12:13], v[22:23], off
  v_lshlrev_b32 v24, 4, v0
  cluster_load_b128 v[14:17], v24, s[2:3] offset:16
  s_wait_loadcnt 0"""
    out = run(A, body, {100 + r: x[r] for r in range(8)}, [10, 12, 13, 14, 15, 16, 17])
    lane = np.arange(N)
    np.testing.assert_array_equal(out[10], flat[lane])
    np.testing.assert_array_equal(np.stack([out[12], out[13]]), [flat[2 * lane], flat[2 * lane + 1]])
    np.testing.assert_array_equal(np.stack([out[14 + k] for k in range(4)]), [flat[4 + 4 * lane + k] for k in range(4)])


def assembled_text_section(text):
    """The .text bytes of the program as the project's assembler lays it out (an ELF64 object)."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        obj = Path(d) / "k.o"
        subprocess.run([*find_compiler(A).clang, "-cc1as", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", A,
                        "-filetype", "obj", "-", "-o", str(obj)], input=text, text=True, check=True)
        elf = obj.read_bytes()
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sec = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = sec[shstrndx][4]
    for name, _, _, _, off, size in sec:
        if elf[names + name:elf.index(b"\0", names + name)] == b".text":
            return elf[off:off + size]
    raise AssertionError("no .text section")


def test_add_pc_counts_the_padding_of_p2align_in_the_code():
    """A jump over a .p2align 7 lands on the label after it: the displacement is the assembler's
    own value of .Ltarget - .Lpost, read from an object file of the same kernel (a .long of it
    after s_endpgm, where it moves nothing), and the kernel jumps with that literal."""
    from asm_wave import kernel
    body = """s_mov_b32 s10, 0
  s_mov_b32 s6, DISP
  s_mov_b32 s7, 0
  s_add_pc_i64 s[6:7]
.Lpost:
  s_mov_b32 s10, 1
  .p2align 7
.Ltarget:
  s_add_co_i32 s10, s10, 2
  v_mov_b32 v10, s10"""
    text = kernel(A, body.replace("DISP", "0x12345"), [], [10])
    probe = text.replace("  s_endpgm\n.Lfunc_end0:", "  s_endpgm\n  .long .Ltarget-.Lpost\n.Lfunc_end0:")
    disp, = struct.unpack("<I", assembled_text_section(probe)[-4:])
    assert 64 < disp < 0x12345 and disp % 4 == 0     # a literal either way: the layout is the same
    out = torch.zeros(N, dtype=torch.int32)
    emu = Emulator(arch=A)
    emu.launch_kernarg(emu.load(kernel(A, body.replace("DISP", hex(disp)), [], [10])), "t", (1, 1, 1), (N, 1, 1),
                       struct.pack("<Q", out.data_ptr()), [out])
    assert int(out[0]) == 2
