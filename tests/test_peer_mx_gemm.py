"""The mx_gemm family's peer (mxgemm.timing.peers.mx_gemm): Triton's tl.dot_scaled GEMM compiled
for gfx950 computes the MX product and is timed beside mxgemm.mx_gemm on the same model."""
import pytest
import torch

from mxgemm import reference
from mxgemm.timing.peers import mx_gemm as fam


@pytest.mark.parametrize("a_fmt, b_fmt", [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1")])
def test_the_triton_mx_peer_computes_the_product_and_both_sides_are_timed(a_fmt, b_fmt):
    """M = 160: two row tiles, the second's rows past M wrapped on load and masked on store;
    K = 512: two K steps. Both products against the reference
    (128-K chunks, one fp32 rounding each: the MFMA's); a wrong scale shuffle or operand layout
    is off by far more than one bf16 ulp."""
    import mxgemm
    from mxgemm.timing.peers import time_ours
    M, N, K = 160, 128, 512
    a, sa, b, sb = fam.operands(a_fmt, b_fmt, M, N, K)
    want = reference.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt, torch.bfloat16, chunk=reference.MX_MMA_K).float()
    theirs, t = fam.time_peer(a, sa, b, sb, a_fmt, b_fmt)
    mine, us, symbol, _ = time_ours(lambda: mxgemm.mx_gemm(a, sa, b, sb, a_format=a_fmt, b_format=b_fmt))
    torch.testing.assert_close(theirs.float(), want, rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(mine.float(), want, rtol=2 ** -7, atol=1e-2)
    assert t["us"] > 0 and us > 0 and symbol == "mx_gemm"
    assert t["breakdown"]["workgroups_simulated"] == 1     # grid (2,): XCD 0 holds workgroup 0


def test_the_peer_refuses_shapes_outside_its_blocks():
    with pytest.raises(ValueError, match="K % 256 == 0; got K = 384"):
        fam.check_peer_shape(128, 128, 384)
    with pytest.raises(ValueError, match="M % 32 == 0; got M = 100"):
        fam.check_peer_shape(100, 128, 256)
