"""Long branches as clang emits them, run on the emulator. A branch-distance limit forced low
(LLVM's ``-amdgpu-s-branch-bits``: clang rejects unknown -mllvm options, so it exists) makes
branch relaxation turn the kernel's branches into long ones: on gfx950 s_getpc_b64 + s_add_u32 /
s_addc_u32 of ``(.LBB - .Lpost_getpc) & 4294967295`` and ``>> 32`` + s_setpc_b64, on gfx1250
``s_add_pc_i64 .LBB - .Lpost_addpc``. Expected values come from a numpy model of the source."""
import subprocess

import numpy as np
import pytest
import torch
from asm_wave import run as run_wave

from mxgemm import toolchain
from mxgemm.emu import Emulator, pc
from mxgemm.emu.isa import EmulatorFault, RaceError, UnsupportedInstruction

SOURCE = """
#include "mxgemm/device.h"
MXGEMM_KERNEL(lb)(const int* __restrict__ a, int* __restrict__ out, int n, int limit) {
  const int t = __builtin_amdgcn_workgroup_id_x() * 64 + __builtin_amdgcn_workitem_id_x();
  int acc = 0;
  for (int i = 0; i < n; ++i) {
    const int x = a[i * 128 + t];
    if (x & 1) acc += x * 3; else acc ^= x + i;
    if (acc > limit) break;
  }
  out[t] = acc;
}
"""
LONG_BRANCH = {"gfx950": "s_addc_u32", "gfx1250": "s_add_pc_i64"}


def compile_long_branches(arch, tmp_path):
    """The kernel's assembly with every branch that spans more than 2^4 dwords made long."""
    src, out = tmp_path / "lb.hip", tmp_path / f"lb.{arch}.s"
    src.write_text(SOURCE)
    subprocess.run([*toolchain.find_compiler(arch).clang, *toolchain.hip_flags(arch), "-mllvm",
                    "-amdgpu-s-branch-bits=5", "-S", str(src), "-o", str(out)], check=True, capture_output=True)
    return out.read_text()


@pytest.fixture(scope="module", params=["gfx950", "gfx1250"])
def long_asm(request, tmp_path_factory):
    arch = request.param
    text = compile_long_branches(arch, tmp_path_factory.mktemp(arch))
    long_lines = [ln for ln in text.splitlines() if LONG_BRANCH[arch] in ln]
    assert len(long_lines) >= 2 and all(".Lpost_" in ln for ln in long_lines), long_lines
    return arch, text


def model(a, n, limit):
    acc = np.zeros(128, np.int64)
    for t in range(128):
        for i in range(n):
            x = int(a[i * 128 + t])
            acc[t] = acc[t] + 3 * x if x & 1 else acc[t] ^ (x + i)
            if acc[t] > limit:
                break
    return acc.astype(np.int32)


def run(arch, text, a, n, limit):
    out = torch.full((128,), -7, dtype=torch.int32)
    emu = Emulator(arch=arch, race_check=True)
    emu.launch(emu.load(text), "lb", grid=(2, 1, 1), block=(64, 1, 1), args=[torch.from_numpy(a), out, n, limit])
    return out.numpy()


@pytest.mark.parametrize("n, limit", [(0, 0), (1, 1 << 30), (6, 1 << 30), (6, 900)])
def test_compiler_long_branches_run_bit_exactly(long_asm, n, limit):
    arch, text = long_asm
    a = np.random.default_rng(n + limit).integers(-1000, 1000, 6 * 128).astype(np.int32)
    np.testing.assert_array_equal(run(arch, text, a, n, limit), model(a, n, limit))


def test_a_long_branch_four_bytes_off_goes_wrong(long_asm):
    """The displacement matters: moving every long branch's target by one dword changes the
    result or faults (so the bit-exact runs above did take the long branches)."""
    arch, text = long_asm
    moved = text.replace("-.Lpost_getpc", "+4-.Lpost_getpc").replace("-.Lpost_addpc", "+4-.Lpost_addpc")
    a = np.random.default_rng(1).integers(-1000, 1000, 6 * 128).astype(np.int32)
    try:
        got = run(arch, moved, a, 6, 1 << 30)
    except (EmulatorFault, RaceError):     # landed mid-instruction, or skipped a wait
        return
    assert (got != model(a, 6, 1 << 30)).any()


def test_set_symbol_displacement(long_asm):
    """The displacements named by .set symbols defined as the label expressions (LLVM's other
    spelling, `s_add_pc_i64 .Loffset0`)."""
    arch, text = long_asm
    lines, k = [], 0
    for ln in text.splitlines():
        if ".Lpost_" in ln and "," in ln or "s_add_pc_i64" in ln:
            head, _, expr = ln.rpartition("," if "," in ln else " ")
            lines += [f"\t.set .Loffset{k}, {expr.strip()}", f"{head}{',' if ',' in ln else ' '} .Loffset{k}"]
            k += 1
        else:
            lines.append(ln)
    assert k >= 2
    a = np.random.default_rng(3).integers(-1000, 1000, 6 * 128).astype(np.int32)
    np.testing.assert_array_equal(run(arch, "\n".join(lines) + "\n", a, 6, 900), model(a, 6, 900))


def test_kernels_without_label_values_keep_the_numbering(long_asm, monkeypatch):
    """Plain branches need no byte addresses: the assembler is not called."""
    arch, _ = long_asm
    text = toolchain.compile_hip_source(SOURCE, arch)
    assert LONG_BRANCH[arch] not in text

    def no_assembler(*args):
        raise AssertionError("the assembler ran")
    monkeypatch.setattr(pc, "_encoded", no_assembler)
    a = np.random.default_rng(2).integers(-1000, 1000, 6 * 128).astype(np.int32)
    np.testing.assert_array_equal(run(arch, text, a, 6, 900), model(a, 6, 900))


@pytest.mark.parametrize("expr, value", [("8>>1+1", 5), ("1|2-1", 2), ("6^3+1", 6), ("1+2&3", 3), ("8-4-2", 2),
                                         ("-8>>1", 0x7FFFFFFFFFFFFFFC), ("(.b-.a)&4294967295", 0xFFFFFFF0),
                                         ("(.b-.a)>>32", 0xFFFFFFFF), ("~0", -1), ("7/-2", -3), ("-7%2", -1)])
def test_expressions_as_the_assembler_reads_them(expr, value):
    """Precedence and shifts as the project's assembler evaluates them (checked with .long / .quad
    of the same expressions: GNU precedence, >> a logical 64-bit shift)."""
    assert pc.evaluate(expr, {".a": 0x10010, ".b": 0x10000}, {}) == value


def test_unknown_symbol_and_data_size_raise():
    with pytest.raises(UnsupportedInstruction, match="not a label"):
        pc.evaluate(".a-.zz", {".a": 0}, {})
    with pytest.raises(UnsupportedInstruction, match="through itself"):
        pc.evaluate(".s", {}, {".s": ".s+4"})


@pytest.mark.parametrize("data, size", [(".long 0x12345678", 4), (".byte 1, 2\n  .short 3", 4), (".quad 9", 8),
                                        (".zero 8", 8), (".fill 2, 4, 0", 8)])
def test_data_in_code_counts_its_bytes(data, size):
    """s_add_pc_i64 by a constant over a 4-byte s_add_co_i32 and data: it lands on the label after
    them only when the data's bytes are counted (the assembler pads nothing: .p2align absent)."""
    body = "\n  ".join(["s_mov_b32 s10, 0", f"s_mov_b64 s[6:7], {4 + size}", "s_add_pc_i64 s[6:7]",
                        "s_add_co_i32 s10, s10, 1", data, "s_add_co_i32 s10, s10, 2", "v_mov_b32 v10, s10"])
    assert int(run_wave("gfx1250", body, {}, [10])[10][0]) == 2


def test_data_directive_without_a_size_raises():
    body = "s_mov_b64 s[6:7], 8\n  s_add_pc_i64 s[6:7]\n  .ascii \"ab\"\n  .balign 4\n  v_mov_b32 v10, 0"
    with pytest.raises(UnsupportedInstruction, match="data directive"):
        run_wave("gfx1250", body, {}, [10])
