"""The calibration kernels (the CDNA4 blog's FP8 GEMM stages) compute the GEMM they time: each on
the emulator in race mode against a float64 product of the same E4M3 inputs."""
import pytest
import torch

from mxgemm import asm_facts, calibration
from mxgemm.emu import Emulator
from mxgemm.emu.isa import RaceError

PINGPONG = "fp8_gemm_256x256_pingpong"


@pytest.fixture(scope="module")
def prog():
    return Emulator(arch="gfx950", race_check=True).load(calibration.assembly())


def _inputs(M, N, K):
    g = torch.Generator().manual_seed(4)
    return (torch.randn(M, K, generator=g).to(torch.float8_e4m3fn),
            torch.randn(N, K, generator=g).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("symbol", list(calibration.STAGES))
def test_stage_computes_the_gemm(prog, symbol):
    stage = calibration.STAGES[symbol]
    M = N = 256
    # the SIMT stages cost the emulator most per output; the ping-pong at K = 5 tiles runs its
    # prologue, its two-tile loop once, its odd tile and its two epilogue tiles
    K = 128 if stage.block == (16, 16) else 640 if symbol == PINGPONG else 256
    a, b = _inputs(M, N, K)
    c = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    calibration.launch(Emulator(arch="gfx950", race_check=True), prog, stage, a, b, c)
    ref = a.double() @ b.double().T
    # fp32 accumulation in any order, then one bf16 rounding
    bound = 2.0 ** -8 * ref.abs() + K * 2.0 ** -24 * (a.double().abs() @ b.double().abs().T)
    err = (c.double() - ref).abs()
    assert (err <= bound).all(), f"{symbol}: max error {err.max():.3g} (bound there {bound[err.argmax() // N, err.argmax() % N]:.3g})"


@pytest.mark.parametrize("symbol", list(calibration.STAGES))
def test_stage_is_spill_free(symbol):
    assert asm_facts.kernel_info(calibration.assembly(), symbol).spills == 0


def test_pingpong_race_mode_needs_its_loop_wait():
    """The ping-pong makes its next tile visible with s_waitcnt vmcnt(6) before a bare s_barrier
    (no fence): let two more loads through and race mode flags the LDS DMA data read too early."""
    asm = calibration.assembly()
    i = asm.index(f"\n{PINGPONG}:") + 1
    j = asm.index("s_endpgm", i)
    assert "s_waitcnt vmcnt(6)" in asm[i:j]
    prog = Emulator(arch="gfx950", race_check=True).load(asm[:i] + asm[i:j].replace("vmcnt(6)", "vmcnt(8)") + asm[j:])
    a, b = _inputs(256, 256, 640)
    c = torch.zeros(256, 256, dtype=torch.bfloat16)
    with pytest.raises(RaceError, match="direct-to-LDS data not yet retired"):
        calibration.launch(Emulator(arch="gfx950", race_check=True), prog, calibration.STAGES[PINGPONG], a, b, c)
