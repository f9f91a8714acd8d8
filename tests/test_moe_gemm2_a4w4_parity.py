"""HIP reference kernel vs its FlyDSL port (moe_gemm2_a4w4): bit-exact and structural parity.

Bit-exact: for every variant (BM 16/32/64/128 x NT off/on x ROUTE_ROWS), both code objects run on the emulator
(race mode) on the same inputs with the same workgroup order (linear, and shuffled with the
same seed) and must produce identical bf16 bits: same MFMA chain per accumulator, same
epilog rounding, same atomic issue order. Cases cover several token counts, top-k up to 9,
uneven routing, and K with an even and an odd number of 256-wide steps (pair loop + tail).
Against the reference: bitwise in linear order, the atomic-order bound in shuffled order (see
test_moe_gemm2_a4w4.py); a row per route bitwise in both.

Structural: per K step of the main loop, the two code objects issue the same number of
scaled MFMAs, buffer loads (incl. direct-to-LDS) and barriers; the report prints them side by
side with VGPR / LDS / occupancy.
"""
import pytest
from test_moe_gemm2_a4w4 import VARIANTS, assert_within_atomic_order_bound, make_case, reference_out, run

from mxgemm import build, metrics, registry
from mxgemm.asm_facts import k_step_profile

# (tokens, topk, experts, K, skew): token counts 4..32 (what the emulator runs quickly),
# top-k 1..9, uneven routing (skew), K = 256 (1 step: tail only), 512 (pair loop), 768 (both);
# 160 tokens fill every row of a BM 128 block of expert 0 and part of its next one.
CASES = [(4, 9, 12, 256, 0.0), (13, 4, 8, 768, 1.0), (32, 2, 4, 512, 0.7), (7, 1, 3, 256, 0.0),
         (160, 2, 3, 768, 1.0)]
ORDERS = ["linear", "shuffled"]
SEED = 1234


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("variant", VARIANTS, ids=registry.variant_id)
@pytest.mark.parametrize("case", CASES, ids=[f"T{t}_top{k}_E{e}_K{kk}" for t, k, e, kk, _ in CASES])
def test_hip_and_flydsl_bit_identical(case, variant, order):
    tokens, topk, experts, k, skew = case
    c = make_case(tokens, topk, experts, k=k, block_m=variant["BM"], skew=skew, seed=tokens * 100 + topk)
    route_rows = variant["ROUTE_ROWS"]
    hip = run(c, "hip", variant["NT"], wg_order=order, seed=SEED, route_rows=route_rows)
    fly = run(c, "flydsl", variant["NT"], wg_order=order, seed=SEED, route_rows=route_rows)
    assert hip.abs().max() > 0
    metrics.assert_bitwise_equal(fly, hip, f"flydsl vs hip {registry.variant_id(variant)} {order}")
    if order == "linear" or route_rows:
        metrics.assert_bitwise_equal(hip, reference_out(c, route_rows),
                                     f"hip vs reference {registry.variant_id(variant)} {order}")
    else:
        assert_within_atomic_order_bound(hip, reference_out(c), c, f"hip {order}")


def _row(name, hip, fly, must_match=True):
    verdict = ("ok" if hip == fly else "DIFFERS") if must_match else "(register allocation)"
    return f"  {name:<28}{hip:>12}{fly:>12}{'':>4}{verdict}"


@pytest.mark.parametrize("variant", VARIANTS, ids=registry.variant_id)
def test_structural_parity_per_k_step(variant):
    hip_art = build.artifact("moe_gemm2_a4w4", variant)
    fly_art = build.artifact("moe_gemm2_a4w4_flydsl", variant)
    hip, fly = k_step_profile(hip_art.asm), k_step_profile(fly_art.asm)
    hi, fi = hip_art.isa(), fly_art.isa()
    lines = [f"\nmoe_gemm2_a4w4 [{registry.variant_id(variant)}]{'HIP':>16}{'FlyDSL':>12}",
             "  per K step (main loop):"]
    lines += [_row(k, f"{hip[k]:g}", f"{fly[k]:g}") for k in hip]
    lines += ["  code object:",
              _row("VGPRs", hi.total_vgprs, fi.total_vgprs, False), _row("SGPRs", hi.sgprs, fi.sgprs, False),
              _row("LDS bytes", hi.lds_bytes, fi.lds_bytes),
              _row("occupancy (waves/SIMD)", hi.occupancy(256), fi.occupancy(256)),
              _row("spills", hi.spills, fi.spills)]
    print("\n".join(lines))
    assert hip == fly
    m_tiles = variant["BM"] // 16
    assert hip["scaled MFMA"] == 2 * m_tiles * 4                 # 2 k-steps x m-tiles x 4 n-tiles
    dma = max(1, variant["BM"] // 32)                             # 16-byte DMAs per wave: BM x 128 B over 4 waves
    assert hip["  of which direct-to-LDS"] == dma and hip["barriers"] == 1
    assert hip["buffer loads (all)"] == 8 + 4 + m_tiles + dma    # W data, W scales, A scales, A DMA
    assert hi.lds_bytes == fi.lds_bytes and hi.spills == fi.spills == 0
