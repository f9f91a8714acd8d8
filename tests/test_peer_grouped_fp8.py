"""The grouped_fp8 peer family (mxgemm.timing.peers.grouped_fp8): the Triton grouped FP8 GEMM written
after Primus-Turbo's Triton backend, compiled for gfx950, computes the three training GEMMs and is
timed on the same model as ours."""
import pytest
import torch

from mxgemm.timing.peers import grouped_fp8, time_ours

LENS = (200, 0, 72)          # an empty group, a partial 256-row tile
N, K = 256, 320              # K: two full 128-steps and a masked 64 tail (the wgrad: 64-steps, partial groups)


def _want(pass_, a, sa, b, sb, lens) -> torch.Tensor:
    """float64 product of the fp8 operands times the two scales."""
    a, b, s = a.double(), b.double(), float(sa) * float(sb)
    rows = a.split(list(lens))
    if pass_ == "wgrad":
        return torch.stack([x.T @ y for x, y in zip(rows, b.split(list(lens)))]) * s
    return torch.cat([x @ (b[g].T if pass_ == "fwd" else b[g]) for g, x in enumerate(rows)]) * s


@pytest.mark.parametrize("pass_", grouped_fp8.PASSES)
def test_the_triton_grouped_fp8_peer_computes_the_product_and_is_timed(pass_):
    a, sa, b, sb, _ = grouped_fp8.operands(pass_, 1, sum(LENS), N, K)
    if pass_ != "wgrad":
        b = torch.randn(len(LENS), N, K, generator=torch.Generator().manual_seed(1)).to(torch.float8_e4m3fn)
    lens = torch.tensor(LENS)
    want = _want(pass_, a, sa, b, sb, lens)
    theirs, t = grouped_fp8.time_peer(pass_, a, sa, b, sb, lens)
    mine, us, symbol, tm = time_ours(lambda: grouped_fp8.ours(pass_, a, sa, b, sb, lens))
    tol = dict(rtol=2 ** -8, atol=1e-3 * float(want.abs().max()))    # bf16 rounding of an fp32 sum
    torch.testing.assert_close(theirs.double(), want, **tol)
    torch.testing.assert_close(mine.double(), want, **tol)
    assert t["us"] > 0 and us > 0 and symbol.startswith("train_grouped_gemm")
    # the persistent grid of 256: XCD 0 holds 32 workgroups, one round, all simulated
    assert t["breakdown"]["workgroups_simulated"] == 32 and t["breakdown"]["workgroups_per_xcd"] == 32
    assert tm["breakdown"]["workgroups_simulated"] >= 1
