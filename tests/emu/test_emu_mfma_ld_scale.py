"""gfx950 v_mfma_ld_scale_b32 on its own has no public semantics (docs/gfx950_isa.md §1.6): the
emulator refuses it with a reason, before anything runs; the fused v_mfma_scale_* form still runs."""
import numpy as np
import pytest
from asm_wave import run

from mxgemm.emu import UnsupportedInstruction


@pytest.mark.parametrize("form", ["v_mfma_ld_scale_b32 v3, v4", "v_mfma_ld_scale_b32 v3, 64",
                                  "v_mfma_ld_scale_b32 v3, v4 op_sel:[1,0,0] op_sel_hi:[0,1,0]"])
def test_standalone_ld_scale_raises_saying_why(form):
    with pytest.raises(UnsupportedInstruction, match="standalone semantics are undocumented"):
        run("gfx950", form, {3: 1, 4: 2}, [3])


def test_the_fused_scaled_mfma_still_runs():
    """All-zero A and B with unit scales (127) leave C: D = 0 * 0 * 1 + C."""
    body = "v_mfma_scale_f32_16x16x128_f8f6f4 v[10:13], v[20:27], v[30:37], v[10:13], v4, v4"
    c = {10 + i: (np.arange(64, dtype=np.float32) + 0.5 * i).view(np.uint32) for i in range(4)}
    zeros = {r: 0 for r in [*range(20, 28), *range(30, 38)]}
    out = run("gfx950", body, {**c, **zeros, 4: 127}, list(range(10, 14)))
    for i in range(4):
        np.testing.assert_array_equal(out[10 + i], c[10 + i])
