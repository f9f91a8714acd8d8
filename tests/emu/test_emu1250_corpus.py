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


def test_window_and_counters():
    """Workgroup windows and Emulator.last_stats on the wave32 target: lds_reverse (256 threads =
    8 waves of 32, one split barrier each) run on workgroups 1 and 3 of 4 only."""
    import numpy as np
    import torch
    emu = Emulator(arch=ARCH)
    prog = emu.load(asm_of("lds_reverse", ARCH))
    n = 1000
    x, y = np.arange(1024, dtype=np.float32), torch.full((1024,), -1.0)
    emu.launch(prog, "lds_reverse", grid=(4, 1, 1), block=(256, 1, 1), args=[y, torch.from_numpy(x), 2.0, n],
               workgroups=[(3, 0, 0), (1, 0, 0)])
    ran = np.zeros(1024, bool)
    ran[256:512] = ran[768:n] = True
    xs = np.where(np.arange(1024) < n, x, 0).reshape(4, 256)[:, ::-1].ravel()
    np.testing.assert_array_equal(y.numpy(), np.where(ran, 2 * xs - 1, -1).astype(np.float32))
    s = emu.last_stats
    assert (s["workgroups"], s["waves"], s["barrier"]) == (2, 16, 16)
    assert s["lds_store_bytes"] == 2 * 256 * 4 and s["lds_load_bytes"] == (256 + n - 768) * 4
    assert s["vmem_store_bytes"] == (256 + n - 768) * 4
