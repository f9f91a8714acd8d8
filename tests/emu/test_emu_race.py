"""Race mode: deleting one s_waitcnt or s_barrier from a kernel's assembly must raise
RaceError; the intact kernels must not (the corpus test runs them intact)."""
import re

import pytest
from emu_corpus import CASES, asm_of

from mxgemm.emu import Emulator, RaceError

# Kernels whose every s_waitcnt / s_barrier guards something observable.
RACE_KERNELS = ("lds_reverse", "gemm", "to_lds", "xlane", "math", "divergent")


def _sync_lines(asm):
    lines = asm.splitlines()
    return [i for i, l in enumerate(lines) if re.match(r"\s*s_(waitcnt|barrier)\b", l)]


def _cases():
    out = []
    for name in RACE_KERNELS:
        for i in _sync_lines(asm_of(name)):
            out.append(pytest.param(name, i, id=f"{name}-L{i + 1}"))
    return out


@pytest.mark.parametrize("name,line", _cases())
def test_deleted_sync_raises(name, line):
    lines = asm_of(name).splitlines()
    lines[line] = "\t; deleted: " + lines[line].strip()
    emu = Emulator(race_check=True)
    prog = emu.load("\n".join(lines))
    with pytest.raises(RaceError):
        CASES[name](emu, prog)


def test_load_overwriting_an_outstanding_load_is_in_order():
    """Two vector-memory loads into the same register with no wait between them: loads return
    in issue order (LLVM emits this), so no RaceError and the later load's value wins; an ALU
    write over the outstanding load is still a race."""
    asm = asm_of("math")
    load = "global_load_dword v14, v[2:3], off"
    assert load in asm
    emu = Emulator(race_check=True)
    CASES["math"](emu, emu.load(asm.replace(load, "global_load_dword v14, v[4:5], off\n\t" + load, 1)))
    with pytest.raises(RaceError, match="overwrites v14"):
        CASES["math"](emu, emu.load(asm.replace(load, load + "\n\tv_mov_b32 v14, 0", 1)))
