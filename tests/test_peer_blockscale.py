"""The blockscale family's peer (mxgemm.timing.peers.blockscale: vLLM's Triton block-FP8 MoE GEMM,
compiled for gfx950) computes DeepGEMM's grouped products, and both it and ours are timed on the
same model. Tiny cells: a few seconds each on one core."""
import pytest
import torch

from mxgemm import reference
from mxgemm.timing.peers import blockscale, time_ours

G, N, K = 2, 256, 384


@pytest.mark.parametrize("masked", [False, True], ids=["contiguous", "masked"])
def test_the_peer_computes_the_grouped_block_scale_product_and_both_are_timed(masked):
    """Contiguous: groups of 100 rows padded to 128 (a 64-row tile half padding, one all padding);
    masked: groups of 64 and 23 live rows in 64-row buffers. Scales in [0.5, 1.5): a dropped or
    misplaced scale, a wrong group or a wrong K step moves elements by far more than the tolerance."""
    a, sfa, b, sfb, layout = blockscale.operands(G, 64 if masked else 100, N, K, masked, seed=3)
    if masked:
        layout[1] = 23
        ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, layout)
        written = torch.arange(64)[None, :] < layout[:, None]
    else:
        ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, layout, torch.bfloat16)
        written = layout >= 0
    theirs, t = blockscale.time_peer(a, sfa, b, sfb, layout, masked)
    mine, us, symbol, _ = time_ours(lambda: blockscale.ours(a, sfa, b, sfb, layout, masked))
    assert (ref[written].abs() > 1).float().mean() > 0.9     # elements the tolerance can tell apart
    torch.testing.assert_close(theirs[written].float(), ref[written].float(), rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(mine[written].float(), ref[written].float(), rtol=2 ** -7, atol=1e-2)
    assert not theirs[~written].any()           # padding / masked rows: not stored (the buffer's zeros)
    assert t["us"] > 0 and us > 0 and symbol == "blockscale_grouped_gemm"
    # grid: contiguous 4 M tiles x 2 N tiles, masked (2 groups, 1 x 2 tiles); XCD 0 holds workgroup 0
    assert t["breakdown"]["workgroups_simulated"] == 1 and not t["sampled"]


def test_the_cells_are_deepseek_v3s_expert_gemms_in_both_layouts():
    cells = blockscale.cells()
    assert len(cells) == 16 and len({c["label"] for c in cells}) == 16
    assert {(c["N"], c["K"]) for c in cells} == {(2048, 7168), (7168, 2048)}
    assert {c["m"] for c in cells} == {64, 128, 256, 512} and {c["masked"] for c in cells} == {False, True}
    assert all(c["G"] == 8 for c in cells)
