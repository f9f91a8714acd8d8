"""gfx1250 race mode: deleting any one counter wait (s_wait_loadcnt / _dscnt / _kmcnt / combined
forms) or either half of a split barrier (s_barrier_signal, s_barrier_wait) from a corpus kernel
raises RaceError; the intact kernels do not (test_emu1250_corpus runs them)."""
import re

import pytest
from emu1250_corpus import ARCH, CASES
from emu_corpus import asm_of

from mxgemm.emu import Emulator, RaceError

RACE_KERNELS = ("lds_reverse", "gemm", "math", "divergent", "xlane32")   # not atomics: LDS atomics are exempt
# waits on nothing a later instruction can observe: s_wait_xcnt (operands are read at issue),
# s_wait_alu / s_delay_alu (issue hints)
_SYNC = re.compile(r"\s*s_(wait_(load|store|ds|km|tensor)cnt\w*|barrier_(signal|wait))\b")


def _cases():
    out = []
    for name in RACE_KERNELS:
        for i, l in enumerate(asm_of(name, ARCH).splitlines()):
            if _SYNC.match(l):
                out.append(pytest.param(name, i, id=f"{name}-L{i + 1}-{l.split()[0]}"))
    return out


@pytest.mark.parametrize("name,line", _cases())
def test_deleted_sync_raises(name, line):
    lines = asm_of(name, ARCH).splitlines()
    lines[line] = "\t; deleted: " + lines[line].strip()
    emu = Emulator(arch=ARCH, race_check=True)
    with pytest.raises(RaceError):
        CASES[name](emu, emu.load("\n".join(lines)))


def test_every_counter_kind_is_covered():
    """The deletions above include each wait the compiler emits for these kernels."""
    kinds = {l.split()[0] for n in RACE_KERNELS for l in asm_of(n, ARCH).splitlines() if _SYNC.match(l)}
    assert {"s_wait_loadcnt", "s_wait_dscnt", "s_wait_kmcnt", "s_wait_loadcnt_dscnt", "s_barrier_signal",
            "s_barrier_wait"} <= kinds, kinds
