"""Workgroup windows: run only chosen workgroups of a grid. With sparse buffers this executes
the last rows of a problem whose tensors exceed 2^31 elements (8 GB of fp32), which proves the
kernel's 64-bit addressing; through an op, emulator_settings(workgroups=...) does the same."""
import numpy as np
import pytest
import torch
from hip_run import program

import mxgemm
from mxgemm.launcher import emulator_settings
from mxgemm.quant import dequantize_mx, quantize_mx

SOURCE = r"""
MXGEMM_KERNEL(row_scale)(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ s,
                         int cols) {
  long row = mxgemm::block_x();                 // one workgroup per row; 64-bit element offsets
  for (int c = mxgemm::thread_x(); c < cols; c += 256)
    out[row * cols + c] = x[row * cols + c] * s[row] + 1.0f;
}
"""
ROWS, COLS = (1 << 21) + 5, 1024                # 2^31 + 5120 elements per tensor
WINDOW = [ROWS - 1, ROWS - 2, ROWS - 5, 0]


def test_last_rows_of_an_8gb_problem():
    assert ROWS * COLS > 1 << 31
    emu, prog, _ = program(SOURCE)
    nbytes = ROWS * COLS * 4
    x, out = emu.sparse_buffer(nbytes), emu.sparse_buffer(nbytes)
    rng = np.random.default_rng(4)
    s = torch.from_numpy(np.ldexp(1.0, rng.integers(-3, 4, ROWS)).astype(np.float32))   # x * s exact: fma or not
    rows = {r: rng.standard_normal(COLS).astype(np.float32) for r in WINDOW + [ROWS - 3]}
    for r, v in rows.items():
        x.write(r * COLS * 4, torch.from_numpy(v))
    emu.launch(prog, "row_scale", grid=(ROWS, 1, 1), block=(256, 1, 1), args=[out, x, s, COLS],
               workgroups=[(r, 0, 0) for r in WINDOW])
    assert emu.last_stats["workgroups"] == len(WINDOW)
    for r in WINDOW:
        got = out.read(r * COLS * 4, COLS * 4).view(torch.float32).numpy()
        np.testing.assert_array_equal(got, rows[r] * s[r].numpy() + np.float32(1), err_msg=f"row {r}")
    assert not out.read((ROWS - 3) * COLS * 4, COLS * 4).any()     # outside the window: never run


def test_window_rejects_ids_outside_the_grid():
    emu, prog, _ = program(SOURCE)
    t = torch.zeros(256)
    with pytest.raises(ValueError, match=r"workgroup id \(2, 0, 0\) is outside the grid \(2, 1, 1\)"):
        emu.launch(prog, "row_scale", grid=(2, 1, 1), block=(256, 1, 1), args=[t, t, t, 128],
                   workgroups=[(2, 0, 0)])


@pytest.mark.parametrize("order", ["linear", "shuffled"])
def test_op_runs_only_the_window(order):
    """mxfp8_dequantize: one workgroup per 1024 elements; workgroups 2 and 7 of 8 run."""
    x, sc = quantize_mx(torch.randn(32, 256), "e4m3")
    out = torch.full((32, 256), -7.0)
    with emulator_settings(workgroups=[(2, 0, 0), (7, 0, 0)], wg_order=order, seed=1):
        mxgemm.mxfp8_dequantize(x, sc, out=out)
    ref = dequantize_mx(x, sc, "e4m3").reshape(-1)
    got = out.reshape(-1)
    ran = torch.zeros(32 * 256, dtype=torch.bool)
    ran[2048:3072] = ran[7168:8192] = True
    assert torch.equal(got[ran], ref[ran].float())
    assert (got[~ran] == -7.0).all()
