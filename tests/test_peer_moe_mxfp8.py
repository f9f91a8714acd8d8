"""The MXFP8 MoE peer (mxgemm.timing.peers.moe_mxfp8): vLLM / SGLang's Triton fused-MoE kernel with
tl.dot_scaled, compiled for gfx950, computes the exact product on the emulator and is timed on the
same model as moe_mxfp8_grouped_gemm."""
import pytest
import torch

pytest.importorskip("triton")


@pytest.mark.parametrize("per_route", [False, True], ids=["gemm1", "gemm2"])
def test_the_fused_moe_peer_computes_the_product_and_both_sides_are_timed(per_route):
    """3 tokens, top-2 of 4 experts, N 128, K 256: gemm1 (a row per token, bf16) and gemm2 (a row per
    route times its top-k weight, fp32), each side against the exact reference."""
    import mxgemm
    from mxgemm.timing.peers import moe_mxfp8 as m
    from mxgemm.timing.peers import time_ours
    T, k, E, N, K = 3, 2, 4, 128, 256
    ids, weights, srt = m.routing(T, k, E)
    a, sa, w, sw = m.operands(T, k, E, N, K, per_route, srt)
    tw = weights if per_route else None
    want = m.reference(a, sa, w, sw, srt, T, k, tw)
    assert want.abs().amax() > 1 and (want != 0).all()      # every route has a real product
    pa, psa = (a.view(T * k, K), sa.view(T * k, K // 32)) if per_route else (a, sa)
    theirs, t = m.time_peer(pa, psa, w, sw, ids, tw, rounds=None)
    assert theirs.dtype == (torch.float32 if per_route else torch.bfloat16)
    torch.testing.assert_close(theirs.float(), want.float(), rtol=2 ** -7, atol=1e-2)
    mine, us, symbol, _ = time_ours(lambda: mxgemm.moe_mxfp8_grouped_gemm(
        a, sa, w, sw, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids, topk_weights=tw, block_m=16,
        topk=k, out_dtype=theirs.dtype))
    torch.testing.assert_close(mine.view(T * k, N).float(), want.float(), rtol=2 ** -7, atol=1e-2)
    assert t["us"] > 0 and us > 0 and symbol == "smallm_mxfp8_moe_grouped_gemm"
    # SGLang's grid: 6 routes + 5 buckets * 63 = 321 sorted ids -> 6 row blocks of 64 x 1 column block
    # of 128; XCD 0 (one of 8, round robin) holds workgroup 0 only
    assert t["breakdown"]["workgroups_simulated"] == 1


def test_the_peer_layout_is_moe_align_block_sizes():
    """Routes token * top_k + slot grouped by expert, each expert padded to 64 with T * top_k, the
    buffer of routes * 64 ids when routes < E + 1, else routes + (E + 1) * 63."""
    from mxgemm.timing.peers.moe_mxfp8 import peer_layout
    ids, experts, post = peer_layout(torch.tensor([[2, 0], [2, 1], [0, 3]]), 4)
    assert ids.numel() == 6 + 5 * 63 and experts.numel() == 6 and post.tolist() == [4 * 64]
    pad = [6] * 62
    # routes 0..5 go to experts 2, 0, 2, 1, 0, 3
    assert ids[:256].tolist() == [1, 4] + pad + [3] + [6] * 63 + [0, 2] + pad + [5] + [6] * 63
    assert experts.tolist() == [0, 1, 2, 3, -1, -1]
    ids, _, _ = peer_layout(torch.tensor([[1]]), 4)
    assert ids.numel() == 64


def test_a_sampled_launch_is_checked_where_it_wrote():
    """check(): a sampled output is compared wherever it wrote, and one that wrote nothing fails."""
    from mxgemm.timing.peers.moe_mxfp8 import check
    want = torch.arange(1, 13, dtype=torch.float32).view(3, 4).to(torch.bfloat16)
    part = torch.zeros_like(want)
    part[1] = want[1]
    check(part, want, True, "x")
    check(torch.where(part == 0, float("nan"), part), want, True, "x")
    for nothing in (torch.zeros_like(want), torch.full_like(want, float("nan"))):
        with pytest.raises(AssertionError, match="x: the sampled launch wrote no output element"):
            check(nothing, want, True, "x")
    part[1, 2] += 1
    with pytest.raises(AssertionError, match="x:"):
        check(part, want, True, "x")
    with pytest.raises(AssertionError):
        check(part, want, False, "x")
