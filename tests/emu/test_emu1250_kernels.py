"""gfx1250 registry kernels on the gfx1250 emulator target: every mnemonic of every gfx1250
artefact has a handler, and the sample kernels run bit-exact against an ml_dtypes decode."""
import pytest
import torch

from mxgemm import build, launcher
from mxgemm.emu import Emulator

ARCH = "gfx1250"


def test_registry_kernels_fully_supported():
    arts = build.build(archs=(ARCH,), progress=False)
    assert arts
    missing = {}
    for art in arts:
        for m in Emulator.unsupported_mnemonics(art.asm, ARCH):
            missing.setdefault(m, set()).add(art.kernel)
    assert not missing, "unimplemented: " + ", ".join(f"{m} ({sorted(k)[0]})" for m, k in sorted(missing.items()))


@pytest.mark.parametrize("kernel", ["mxfp8_dequant", "mxfp8_dequant_flydsl"])
def test_dequant_is_bit_exact(kernel):
    from test_mxfp8_dequantize import SCALES, assert_same_bits, reference
    K = 256                     # every code in each row, one edge scale per row, plus a partial workgroup
    x = (torch.arange(len(SCALES) * K) % 256).to(torch.uint8).reshape(-1, K)
    scale = torch.tensor(SCALES, dtype=torch.uint8)[:, None].repeat(1, K // 32)
    out = torch.full(x.shape, 7.0)
    M = x.shape[0]
    launcher.launch_variant(kernel, {}, ARCH, "emu", writes=(out,), x=x, scale=scale, out=out, M=M, K=K,
                            elements=M * K)
    assert_same_bits(out, reference(x, scale))


def test_op_runs_on_the_gfx1250_emulator(monkeypatch):
    """With the emulator arch set to gfx1250 (MXGEMM_EMU_ARCH), an op plans and runs its gfx1250
    artefact on CPU tensors."""
    from test_mxfp8_dequantize import assert_same_bits, reference

    import mxgemm
    monkeypatch.setattr(launcher, "EMU_ARCH", ARCH)
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 256, (5, 160), dtype=torch.uint8, generator=g)     # a shape no other test plans
    scale = torch.randint(100, 160, (5, 5), dtype=torch.uint8, generator=g)
    assert mxgemm.explain("mxfp8_dequantize", x, scale).arch == ARCH
    assert_same_bits(mxgemm.mxfp8_dequantize(x, scale), reference(x, scale))
