"""mxgemm.timing.peers.moe_a4w4: the Triton MXFP4 fused-MoE peer, compiled for gfx950, computes the
a4w4 down-projection's addends, and it and both of our kernels are timed on the same model.

One tiny case (T 3, top-2, E 2, N 256, K 256): products from functional runs of the whole grids;
the timed runs execute XCD 0's share only (every grid fits its first round)."""
import pytest
import torch

from mxgemm import quant
from mxgemm.specs.moe_a4w4 import KERNELS
from mxgemm.timing.peers import moe_a4w4

T, TOPK, E, N, K = 3, 2, 2, 256, 256


@pytest.fixture(scope="module")
def case():
    return moe_a4w4.operands(T, TOPK, E, N, K, seed=1)


def addends_f64(x):
    """float64 [T * topk, N]: weight(t, s) * (A[t * topk + s] . W[expert(t, s)]) from the dequantised operands."""
    a = quant.dequantize_mx(x["a"], x["a_scale"], "e2m1").double()
    w = quant.dequantize_mx(x["w"], x["w_scale"], "e2m1").double()
    e, wt = x["ids"].reshape(-1), x["weights"].reshape(-1).double()
    return torch.stack([wt[r] * (w[e[r]] @ a[r]) for r in range(a.shape[0])])


def test_the_peer_computes_the_weighted_addends_and_both_sides_are_timed(case):
    import mxgemm
    theirs, _ = moe_a4w4.run_peer(case)
    # one bf16 rounding of a product whose fp32 sum order differs from float64's: 2^-8 relative
    torch.testing.assert_close(theirs.double(), addends_f64(case), rtol=2 ** -8, atol=0)
    _, tp = moe_a4w4.run_peer(case, "mi355x")
    # rows 0..5 in blocks of 64: 2 experts -> 2 row blocks x 4 column blocks; XCD 0 holds id 0 (of 8)
    assert tp["us"] > 0 and tp["breakdown"]["workgroups_per_xcd"] == 1
    assert tp["breakdown"]["workgroups_simulated"] == 1
    for lang in KERNELS:
        for route_rows in (True, False):
            args, kw = moe_a4w4.ours(case, lang, route_rows)
            mine = mxgemm.moe_gemm2_a4w4(*args, **kw)
            assert mine.shape == ((T, TOPK, N) if route_rows else (T, N))
            moe_a4w4.check_same_product(mine, theirs, TOPK)
            _, us, symbol, t = moe_a4w4.time_mine(case, lang, route_rows=route_rows)
            # 2 experts x 1 block of 16 rows, 1 column block of 256: XCD 0 holds workgroup (0, 0)
            assert us > 0 and symbol == "moe_gemm2_a4w4" and t["breakdown"]["workgroups_simulated"] == 1


def test_the_product_check_catches_a_missing_or_wrong_addend(case):
    """Ours modelled as its atomics (bf16 addends added one by one, each sum rounded to bf16) and
    as a row per route."""
    theirs = addends_f64(case).to(torch.bfloat16)
    mine = torch.zeros(T, N, dtype=torch.bfloat16)
    for s in range(TOPK):
        mine = (mine.float() + theirs.reshape(T, TOPK, N)[:, s].float()).to(torch.bfloat16)
    moe_a4w4.check_same_product(mine, theirs, TOPK)
    with pytest.raises(AssertionError, match="ours and the peer differ"):
        moe_a4w4.check_same_product(theirs.reshape(T, TOPK, N)[:, 0].contiguous(), theirs, TOPK)
    wrong = theirs.clone()
    wrong[1] *= 2
    with pytest.raises(AssertionError, match="ours and the peer differ"):
        moe_a4w4.check_same_product(mine, wrong, TOPK)
    # a row per route: each addend on its own
    moe_a4w4.check_same_product(theirs.reshape(T, TOPK, N), theirs, TOPK)
    with pytest.raises(AssertionError, match="route row 1, "):
        moe_a4w4.check_same_product(wrong.reshape(T, TOPK, N), theirs, TOPK)
    swapped = theirs.reshape(T, TOPK, N).flip(1)
    with pytest.raises(AssertionError, match="ours and the peer differ"):
        moe_a4w4.check_same_product(swapped, theirs, TOPK)


def test_the_peer_tiles_are_its_remapped_program_ids():
    """Every (row block, column block) pair is held by exactly one program id; with 8 XCDs, XCD 0's
    ids (0, 8, ...) take the first contiguous range of tiles (group 2: row blocks 0-1 column by column)."""
    tiles = moe_a4w4.peer_tiles(5, 7, 2)
    assert sorted(map(tuple, tiles.tolist())) == [(m, n) for m in range(5) for n in range(7)]
    assert tiles[0:40:8].tolist() == [[0, 0], [1, 0], [0, 1], [1, 1], [0, 2]]
