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
