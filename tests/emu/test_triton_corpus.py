"""Peer kernels on the emulator: Triton's gfx950 code (tests/emu/triton_corpus.py) in race mode
against torch references."""
import pytest
import torch
import triton_corpus

from mxgemm import asm_facts
from mxgemm.emu import Emulator

CASES = triton_corpus.cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_kernel_matches_torch(name):
    case = CASES[name]
    emu = Emulator(arch="gfx950", race_check=True)
    got = triton_corpus.run(case, emu)
    if case.spills:     # the code object records VGPR spills and the run went through scratch
        asm, _ = triton_corpus.assembly(case)
        assert asm_facts.kernel_info(asm, case.fn.__name__).vgpr_spills > 0
        assert emu.last_stats["scratch_store"] > 0 and emu.last_stats["scratch_load"] > 0
    want = case.want if isinstance(case.want, (list, tuple)) else [case.want]
    for g, w in zip(got, want):
        if case.atol == case.rtol == 0:
            assert torch.equal(g, w.to(g.dtype)), f"{name}: differs"
        else:
            torch.testing.assert_close(g.float(), w.float(), atol=case.atol, rtol=case.rtol)
