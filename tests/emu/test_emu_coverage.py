"""Every mnemonic in the gfx950 assembly of every registry kernel has an emulator handler."""
import pytest

from mxgemm.emu import Emulator


def test_registry_kernels_fully_supported():
    from mxgemm import build
    arts = build.build(archs=("gfx950",), progress=False)
    missing = {}
    for art in arts:
        for m in Emulator.unsupported_mnemonics(art.asm):
            missing.setdefault(m, set()).add(art.kernel)
    assert not missing, "unimplemented: " + ", ".join(f"{m} ({sorted(k)[0]})" for m, k in sorted(missing.items()))


def test_unsupported_mnemonic_is_reported():
    from emu_corpus import asm_of
    asm = asm_of("lds_reverse").replace("s_barrier", "s_frobnicate_b32 s0, s1", 1)
    assert Emulator.unsupported_mnemonics(asm) == {"s_frobnicate_b32"}
    emu = Emulator()
    prog = emu.load(asm)
    from mxgemm.emu import UnsupportedInstruction
    with pytest.raises(UnsupportedInstruction, match=r"s_frobnicate_b32.*lds_reverse.*line \d+"):
        emu.launch(prog, "lds_reverse", grid=1, block=256, args=[__import__("torch").zeros(256),
                                                                  __import__("torch").zeros(256), 1.0, 256])
