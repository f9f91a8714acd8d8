"""Each corpus kernel, compiled for gfx950, runs on the emulator (race mode on) and matches numpy."""
import pytest
from emu_corpus import CASES, asm_of

from mxgemm.emu import Emulator


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("order", ["linear", "shuffled"])
def test_kernel(name, order):
    emu = Emulator(race_check=True, wg_order=order, seed=3)
    CASES[name](emu, emu.load(asm_of(name)))
