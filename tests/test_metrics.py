"""metrics.py spec: DeepGEMM calc_diff, SNR, error norms, exact and ulp assertions."""
import math

import numpy as np
import pytest
import torch

from mxgemm import metrics as Mt


def test_calc_diff_formula():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, generator=g), torch.randn(50, generator=g)
    xd, yd = x.double().numpy(), y.double().numpy()
    assert Mt.calc_diff(x, y) == pytest.approx(1 - 2 * (xd * yd).sum() / (xd * xd + yd * yd).sum(), rel=1e-12)
    assert Mt.calc_diff(x, x) == 0.0 and Mt.calc_diff(x, -x) == 2.0
    # float64 inside: bf16 inputs whose float32 sum of squares would lose the difference
    big = torch.full((4,), 3e4, dtype=torch.bfloat16)
    assert Mt.calc_diff(big, big) == 0.0


def test_snr_and_error_norms():
    e = torch.ones(100)
    a = e + 0.1  # noise power 100 * 0.01 = 1, signal power 100 -> 20 dB
    assert Mt.snr_db(a, e) == pytest.approx(20.0, abs=1e-5)
    assert Mt.snr_db(e, e) == math.inf
    assert Mt.max_abs_err(torch.tensor([1.0, 5.0]), torch.tensor([1.5, 2.0])) == 3.0
    assert Mt.max_rel_err(torch.tensor([1.0, 5.0]), torch.tensor([2.0, 4.0])) == 0.5


def test_assert_bitwise_equal_reports_mismatches():
    x = torch.tensor([[1.0, 0.0], [float("nan"), 3.0]])
    Mt.assert_bitwise_equal(x, x.clone(), "same")  # identical NaN bits compare equal
    y = x.clone()
    y[0, 1], y[1, 1] = -0.0, float(np.nextafter(np.float32(3), np.float32(4)))
    with pytest.raises(AssertionError) as e:
        Mt.assert_bitwise_equal(y, x, "out")
    msg = str(e.value)
    assert "out: 2 of 4 elements differ bitwise" in msg
    assert "at (0, 1): actual -0.0 (0x80000000)  expected 0.0 (0x00000000)" in msg
    assert "(0x40400001)" in msg and "(0x40400000)" in msg
    with pytest.raises(AssertionError, match="dtype"):
        Mt.assert_bitwise_equal(x.bfloat16(), x, "dt")
    Mt.assert_bitwise_equal(torch.arange(3, dtype=torch.uint8), torch.arange(3, dtype=torch.uint8))


def test_assert_close_ulp_bf16():
    bits = torch.tensor([0x3F80, 0x3F81, 0x3F82, 0x0001, 0x8001, 0x7FC0], dtype=torch.int32).to(torch.int16)
    v = bits.view(torch.bfloat16)
    one, up1, up2, tiny, ntiny, nan = v
    Mt.assert_close_ulp(up1[None], one[None], 1)
    with pytest.raises(AssertionError, match="1 of 1 elements differ by more than 1 bf16 ulp"):
        Mt.assert_close_ulp(up2[None], one[None], 1)
    Mt.assert_close_ulp(up2[None], one[None], 2)
    assert Mt.bf16_ulp_distance(tiny[None], ntiny[None]).item() == 2  # across zero
    Mt.assert_close_ulp(nan[None], nan[None], 0)
    with pytest.raises(AssertionError):
        Mt.assert_close_ulp(nan[None], one[None], 100)
