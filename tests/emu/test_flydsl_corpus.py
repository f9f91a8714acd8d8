"""Peer kernels on the emulator: FlyDSL's own examples, norm kernels and an fp8 GEMM
(tests/emu/flydsl_corpus.py) compiled for gfx950 and run in race mode against torch references. A
peer with a race of its own must raise that race in race mode; its output is then checked on a
run without race checking."""
import flydsl_corpus
import pytest
import torch

from mxgemm.emu import Emulator
from mxgemm.emu.isa import RaceError, UnsupportedInstruction

CASES = flydsl_corpus.cases()

# Emulator gaps these peers found: each case fails at its first unsupported instruction. Strict, and
# only for that exception, so a case passes the day its instruction lands and fails on anything else.
GAPS = {
    "tiledMma": "v_mfma_f32_16x16x4_f32 (CDNA3 fp32 MFMA, still on gfx950) is not emulated",
    "preshuffle_gemm": "v_mfma_f32_16x16x16_f16 (CDNA3 f16 MFMA, still on gfx950) is not emulated",
    "softmax_f32": "v_maximum3_f32 (gfx950's NaN-propagating three-way maximum) is not emulated; past it race "
                   "mode must report the peer's LDS race",
    "softmax_bf16": "v_maximum3_f32 (gfx950's NaN-propagating three-way maximum) is not emulated; past it race "
                    "mode must report the peer's LDS race",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, raises=UnsupportedInstruction,
                                                                          reason=GAPS[n])) if n in GAPS else n
                                  for n in sorted(CASES)])
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
