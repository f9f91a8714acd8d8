"""Peer kernels on the emulator: FlyDSL's own examples, norm kernels and an fp8 GEMM
(tests/emu/flydsl_corpus.py) compiled for gfx950 and run in race mode against torch references. A
peer with a race of its own must raise that race in race mode; its output is then checked on a
run without race checking."""
import flydsl_corpus
import pytest
import torch

from mxgemm.emu import Emulator
from mxgemm.emu.isa import RaceError

CASES = flydsl_corpus.cases()

@pytest.mark.parametrize("name", sorted(CASES))
def test_flydsl_kernel_matches_torch(name):
    case = CASES[name]
    if case.race:
        with pytest.raises(RaceError, match=case.race):
            flydsl_corpus.run(case, Emulator(arch="gfx950", race_check=True))
        if not case.want:
            return
        for i in case.want:     # what the aborted run wrote must not count
            case.output(i).zero_()
    flydsl_corpus.run(case, Emulator(arch="gfx950", race_check=case.race is None))
    for i, want in case.want.items():
        got = case.output(i)
        if case.atol == case.rtol == 0:
            assert torch.equal(got, want.to(got.dtype)), f"{name}: output {i} differs"
        else:
            torch.testing.assert_close(got.float(), want.float(), atol=case.atol, rtol=case.rtol)
