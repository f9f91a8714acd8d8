"""Each gfx1250 corpus kernel runs on the gfx1250 target (wave32, race mode on) and matches numpy."""
import pytest

from emu1250_corpus import ARCH, CASES
from emu_corpus import asm_of

from mxgemm.emu import Emulator


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("order", ["linear", "shuffled"])
def test_kernel(name, order):
    emu = Emulator(arch=ARCH, race_check=True, wg_order=order, seed=3)
    asm = asm_of(name, ARCH)
    assert not emu.unsupported_mnemonics(asm, ARCH)
    CASES[name](emu, emu.load(asm))
