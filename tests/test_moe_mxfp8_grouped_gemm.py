"""mxgemm.moe_mxfp8_grouped_gemm: MXFP8 MoE grouped GEMM over the expert-sorted layout.

Spec: for each sorted row p < num_valid_ids[0] with (token, slot) = decode(sorted_token_ids[p])
and expert = sorted_expert_ids[p // block_m] of a route (token < T, expert >= 0):
    out[token, slot] = topk_weights[token, slot] * A[token] @ W[expert]^T  (MX-scaled, fp32 accumulate)
out is [T, topk, N] in route order; padding rows write nothing, and routes no sorted row below
num_valid_ids[0] holds are left as they were.
Every kernel variant runs on the emulator in race mode against mxgemm.reference (which takes
the routing's sorted_weights: sorted_weights[p] == topk_weights[token, slot]). The contract
(nearly bitwise: bf16 >= 99.9% bit-exact, every bf16 output of these cases is), the accuracy
bound and the test data are those of tests/test_smallm_mxfp8_gemm.py (see its docstring).
"""
from __future__ import annotations

import pytest
import torch
from test_smallm_mxfp8_gemm import assert_matches_reference, mx_operand

import mxgemm
from mxgemm import build, guards, reference, registry, routing
from mxgemm.ops import moe_mxfp8 as op

MOE = op.MOE


def moe_problem(T=5, E=4, topk=2, N=48, K=256, block_m=4, seed=0, per_slot_a=False,
                num_valid_len=1):
    """Uneven routing: expert 0 takes most slots, expert E-1 none, the rest a few; every
    expert's run is padded to block_m, so blocks hold padding rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(T, topk, dtype=torch.int64)
    ids[:, 1] = torch.arange(T) % (E - 1)            # experts 0..E-2; E-1 gets no tokens
    ids[:, 1] = torch.where(ids[:, 1] == 0, 1 % (E - 1), ids[:, 1])  # distinct from slot 0
    weights = torch.rand(T, topk, generator=g) + 0.25
    srt = routing.moe_sorting(ids, weights, E, block_m=block_m, num_valid_len=num_valid_len)
    rows = T * topk if per_slot_a else T
    a, a_scale = mx_operand(rows, K, g, (0, -30, 30, 50), special=False)
    if per_slot_a:
        a, a_scale = a.view(T, topk, K), a_scale.view(T, topk, K // 32)
    ws = [mx_operand(N, K, g, (0, -20, 20), anchor_every=2) for _ in range(E)]
    w = torch.stack([x for x, _ in ws])
    w_scale = torch.stack([s for _, s in ws])
    return a, a_scale, w, w_scale, srt, weights, ids


def numerics(variant) -> dict:
    """The reference's model of a variant's sums: the GEMV core's K split over 256 / BLOCK_N lanes,
    or (M_CHUNK 16) one rounding per scaled 16 x 16 x 128 MFMA."""
    if variant["M_CHUNK"] == op.MFMA_CHUNK:
        return dict(chunk=reference.MX_MMA_K)
    return dict(k_lanes=256 // variant["BLOCK_N"])


def sorted_routes(srt, block_m, T, topk):
    """(tok, slot, expert, real, route) of the sorted rows below num_valid_ids[0]: real marks a
    route (token < T, its block's expert >= 0), route its row token * topk + slot of out."""
    n = int(srt.num_valid_ids[0])
    tok, slot = routing.decode_sorted_id(srt.sorted_token_ids[:n].long())
    exp = srt.sorted_expert_ids.long()[torch.arange(n) // block_m]
    real = (tok < T) & (exp >= 0)
    return tok, slot, exp, real, tok * topk + slot


def check_against_reference(got, a, a_scale, w, w_scale, srt, block_m, weights, name, k_lanes=1,
                            chunk=reference.MX_BLOCK, before=0.0):
    """got: [T, topk, N] in route order; routes no sorted row holds must still be ``before``.
    k_lanes, chunk: the variant's numerics (numerics())."""
    T, topk, N = got.shape
    n = int(srt.num_valid_ids[0])
    a2, s2 = a.reshape(-1, a.shape[-1]), a_scale.reshape(-1, a_scale.shape[-1])
    tok, slot, exp, real, route = sorted_routes(srt, block_m, T, topk)
    row = route if a.dim() == 3 else tok
    flat = got.reshape(T * topk, N)
    held = torch.zeros(T * topk, dtype=torch.bool)
    held[route[real]] = True
    assert bool((flat[~held] == before).all()), f"{name}: routes no sorted row holds must stay untouched"
    mine = torch.zeros(n, N, dtype=got.dtype)
    mine[real] = flat[route[real]]
    if a.dim() == 2:  # the reference op itself (gemm1 layout), taken back to sorted rows
        ref = reference.moe_mxfp8_grouped_gemm_ref(
            a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids,
            block_m, topk, sorted_weights=srt.sorted_weights if weights else None, out_dtype=got.dtype,
            k_lanes=k_lanes, chunk=chunk).reshape(T * topk, N)[torch.where(real, route, 0)]
    else:             # one A row per (token, slot): the reference GEMM per row
        ref = torch.zeros(n, N, dtype=got.dtype)
        for p in real.nonzero().squeeze(1).tolist():
            acc = reference.mx_gemm_ref(a2[row[p]][None], s2[row[p]][None], w[exp[p]], w_scale[exp[p]],
                                        out_dtype=torch.float32, k_lanes=k_lanes, chunk=chunk)
            acc = acc * srt.sorted_weights[p] if weights else acc
            ref[p] = acc[0].to(got.dtype) if got.dtype == torch.float32 else reference.F.bf16_rne(acc[0])
    for e in exp[real].unique().tolist():
        rows = (real & (exp == e)).nonzero().squeeze(1)
        assert_matches_reference(mine[rows], ref[rows], a2[row[rows]], s2[row[rows]], w[e], w_scale[e],
                                 anchored_cols=torch.arange(0, N, 2), name=f"{name} expert {e}",
                                 row_weight=srt.sorted_weights[rows] if weights else None)


def run_case(variant, *, weights=True, out_dtype=torch.bfloat16, block_m=4, **kw):
    block_m = max(block_m, variant["M_CHUNK"])
    a, a_scale, w, w_scale, srt, tw, ids = moe_problem(block_m=block_m, **kw)
    got = mxgemm.moe_mxfp8_grouped_gemm(
        a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids,
        topk_weights=tw if weights else None, block_m=block_m, topk=ids.shape[1], out_dtype=out_dtype,
        config=variant, fallback="error")
    assert got.shape == (*ids.shape, w.shape[1]) and got.dtype == out_dtype
    check_against_reference(got, a, a_scale, w, w_scale, srt, block_m, weights, f"{variant}", **numerics(variant))
    return got


@pytest.mark.parametrize("variant", [pytest.param(v, id=registry.variant_id(v))
                                     for v in registry.get(MOE).variants])
def test_variant_matches_reference_with_topk_weights(variant):
    run_case(variant, weights=True)


@pytest.mark.parametrize("variant", [pytest.param(v, id=registry.variant_id(v))
                                     for v in registry.get(MOE).variants])
def test_variant_fp32_out_without_weights(variant):
    run_case(variant, weights=False, out_dtype=torch.float32, N=40, K=512, seed=1)


def test_a_with_one_row_per_token_slot():
    run_case({"BLOCK_N": 16, "M_CHUNK": 2}, per_slot_a=True, seed=2)


def test_more_experts_larger_blocks_and_num_valid_pair():
    run_case({"BLOCK_N": 8, "M_CHUNK": 4}, T=9, E=6, topk=2, N=24, K=128, block_m=8, seed=3,
             num_valid_len=2)


@pytest.mark.parametrize("variant", [{"BLOCK_N": 8, "M_CHUNK": 2}, {"BLOCK_N": 64, "M_CHUNK": 4},
                                     {"BLOCK_N": 64, "M_CHUNK": 16}], ids=registry.variant_id)
def test_blocks_over_64_rows_with_padding_rows_anywhere(variant):
    """The kernel reads a block's ids 64 rows at a time: 96-row blocks (two segments), rows
    shuffled within each block so that padding rows sit between routes, in both segments."""
    block_m = 96
    a, a_scale, w, w_scale, srt, tw, _ = moe_problem(T=150, E=3, topk=2, N=72, K=128, block_m=block_m, seed=4)
    g = torch.Generator().manual_seed(5)
    n = int(srt.num_valid_ids[0])
    perm = torch.cat([b * block_m + torch.randperm(block_m, generator=g) for b in range(n // block_m)])
    ids, sw = srt.sorted_token_ids.clone(), srt.sorted_weights.clone()
    ids[:n], sw[:n] = ids[:n][perm], sw[:n][perm]
    srt = srt._replace(sorted_token_ids=ids, sorted_weights=sw)
    part = (ids[:n].view(-1, block_m)[1::2] & 0xFFFFFF).lt(150)  # each expert: a full block, then 54 routes
    assert part[:, :64].any(1).all() and part[:, 64:].any(1).all() and not part[:, :64].all(1).any()
    got = mxgemm.moe_mxfp8_grouped_gemm(
        a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids,
        topk_weights=tw, block_m=block_m, config=variant, fallback="error")
    check_against_reference(got, a, a_scale, w, w_scale, srt, block_m, True, f"{variant}", **numerics(variant))


@pytest.mark.parametrize("T,topk,E,block_m", [(1, 1, 32, 16), (1, 8, 256, 16), (3, 2, 4, 4), (32, 8, 256, 16),
                                              (64, 4, 8, 16), (200, 1, 3, 8), (5, 9, 384, 32)])
def test_grid_rows_cover_every_live_block(T, topk, E, block_m):
    """With the route count known (and one column group, so the resident-workgroup cap does not
    bind) the launch's rows are never fewer than the blocks moe_sorting fills, for random and
    round-robin routings, and equal them at decode (one expert per route: no dead rows)."""
    g = torch.Generator().manual_seed(T * 1000 + E)
    for ids in (torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)]),
                torch.arange(T * topk).view(T, topk) % E):
        srt = routing.moe_sorting(ids, torch.ones(T, topk), E, block_m=block_m)
        live = int(srt.num_valid_ids[0]) // block_m
        rows = op.grid_blocks(srt.sorted_expert_ids.numel(), 1, block_m, E, T * topk)
        assert live <= rows <= srt.sorted_expert_ids.numel(), (live, rows)
    if T * topk <= E:
        assert rows == live == T * topk


def test_a_workgroup_row_strides_over_the_blocks(monkeypatch):
    """The rows are capped by the chip's resident workgroups; capped to one row, that row
    computes every live block in turn."""
    a, a_scale, w, w_scale, srt, _, _ = moe_problem(T=9, E=4, topk=2, N=32, K=256, block_m=4, seed=6)
    args = (a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids)
    v = {"BLOCK_N": 16, "M_CHUNK": 2}
    assert int(srt.num_valid_ids[0]) // 4 > 2
    monkeypatch.setattr(op, "RESIDENT_WGS", 2)          # 2 column groups -> one row
    op.moe_mxfp8_grouped_gemm.clear_plans()
    try:
        assert mxgemm.explain("moe_mxfp8_grouped_gemm", *args, block_m=4, topk=2, config=v).grid[:2] == (2, 1)
        got = mxgemm.moe_mxfp8_grouped_gemm(*args, block_m=4, topk=2, config=v, fallback="error")
    finally:
        op.moe_mxfp8_grouped_gemm.clear_plans()
    check_against_reference(got, a, a_scale, w, w_scale, srt, 4, False, "one row", k_lanes=16)


def test_default_dispatch_and_explain():
    a, a_scale, w, w_scale, srt, tw, _ = moe_problem()
    args = (a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids)
    plan = mxgemm.explain("moe_mxfp8_grouped_gemm", *args, topk_weights=tw, block_m=4)
    assert plan.kernel == MOE and "heuristic" in str(plan)
    got = mxgemm.moe_mxfp8_grouped_gemm(*args, topk_weights=tw, block_m=4)
    check_against_reference(got, a, a_scale, w, w_scale, srt, 4, True, "default")


def test_fallback_matches_reference():
    a, a_scale, w, w_scale, srt, tw, _ = moe_problem(seed=4)
    args = (a.to("meta"), a_scale.to("meta"), w.to("meta"), w_scale.to("meta"),
            srt.sorted_token_ids.to("meta"), srt.sorted_expert_ids.to("meta"), srt.num_valid_ids.to("meta"))
    plan = mxgemm.explain("moe_mxfp8_grouped_gemm", *args, block_m=4, topk=2)
    assert plan.fallback and "arch" in plan.reason
    out = torch.zeros(a.shape[0], 2, w.shape[1], dtype=torch.bfloat16)
    moe = op.moe_mxfp8_grouped_gemm
    op._fallback(moe.namespace(moe.flatten((a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids,
                                            srt.num_valid_ids), dict(topk_weights=tw, block_m=4, out=out))), plan)
    check_against_reference(out, a, a_scale, w, w_scale, srt, 4, True, "fallback")


# ------------------------------------------------------------------------------------------
# Guards (raise before any launch; `out` untouched)
# ------------------------------------------------------------------------------------------
def _rejects(rule, *args, out, **kw):
    before = out.clone()
    with pytest.raises(guards.GuardError, match=rf"\[{rule}\]") as e:
        mxgemm.moe_mxfp8_grouped_gemm(*args, out=out, **kw)
    assert torch.equal(out, before), "a rejected call wrote its output"
    return str(e.value)


@pytest.fixture
def problem():
    a, a_scale, w, w_scale, srt, tw, ids = moe_problem()
    out = torch.full((*ids.shape, w.shape[1]), 5.0, dtype=torch.bfloat16)
    return (a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids), tw, out


def test_guard_sorted_ids_dtype(problem):
    (a, sa, w, sw, ids, eids, nv), tw, out = problem
    assert "sorted_token_ids" in _rejects("dtype", a, sa, w, sw, ids.long(), eids, nv, out=out, block_m=4,
                                          topk_weights=tw)


def test_guard_topk_needed_for_token_rows_without_weights(problem):
    args, tw, out = problem
    assert "topk must be given" in _rejects("topk", *args, out=out, block_m=4)
    assert "topk = 3 but" in _rejects("topk", *args, out=out, block_m=4, topk_weights=tw, topk=3)


def test_guard_out_is_route_shaped(problem):
    args, tw, out = problem
    flat = out.view(-1, out.shape[-1])
    assert "out has shape" in _rejects("shape", *args, out=flat, block_m=4, topk_weights=tw)


@pytest.mark.parametrize("variant", [{"BLOCK_N": 16, "M_CHUNK": 4}, {"BLOCK_N": 64, "M_CHUNK": 16}],
                         ids=registry.variant_id)
def test_routes_past_num_valid_ids_are_untouched_and_padding_writes_nothing(variant):
    """num_valid_ids cut to drop the last live block: its routes keep out's bytes, and no padding
    row writes anywhere (every byte of out a route's, checked against the sentinel)."""
    block_m = max(4, variant["M_CHUNK"])
    a, a_scale, w, w_scale, srt, tw, ids = moe_problem(T=7, K=512, block_m=block_m, seed=8)
    srt = srt._replace(num_valid_ids=srt.num_valid_ids - block_m)
    out = torch.full((*ids.shape, w.shape[1]), 5.0, dtype=torch.bfloat16)
    mxgemm.moe_mxfp8_grouped_gemm(a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids,
                                  srt.num_valid_ids, topk_weights=tw, block_m=block_m, out=out, config=variant,
                                  fallback="error")
    assert int((out == 5.0).all(-1).sum()) >= 1, "the cut block held no route"
    check_against_reference(out, a, a_scale, w, w_scale, srt, block_m, True, f"{variant}", before=5.0,
                            **numerics(variant))


def test_guard_block_m_multiple_of_chunk():
    a, a_scale, w, w_scale, srt, tw, ids = moe_problem(block_m=2)
    out = torch.full((*ids.shape, w.shape[1]), 5.0, dtype=torch.bfloat16)
    assert "M_CHUNK = 4" in _rejects("block_m", a, a_scale, w, w_scale, srt.sorted_token_ids,
                                     srt.sorted_expert_ids, srt.num_valid_ids, out=out, block_m=2,
                                     topk=2, config={"BLOCK_N": 8, "M_CHUNK": 4})


def test_guard_mfma_chunk_needs_k_multiple_of_128():
    a, a_scale, w, w_scale, srt, tw, ids = moe_problem(K=160, block_m=16)
    out = torch.full((*ids.shape, w.shape[1]), 5.0, dtype=torch.bfloat16)
    args = (a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids)
    assert "K = 160 must be a multiple of 128" in _rejects("shape", *args, out=out, block_m=16, topk=2,
                                                          config={"BLOCK_N": 64, "M_CHUNK": 16})
    kw = dict(block_m=16, topk=2, out=out, fallback="error")
    assert op.moe_heuristic_config(10, 8, 64 * 12, 160, 16, 64).variant["M_CHUNK"] != op.MFMA_CHUNK
    assert op.moe_heuristic_config(10, 8, 64 * 12, 256, 16, 64).variant == {"BLOCK_N": 64, "M_CHUNK": op.MFMA_CHUNK}
    assert op.moe_heuristic_config(10, 8, 64 * 12, 256, 8, 64).variant["M_CHUNK"] != op.MFMA_CHUNK
    mxgemm.moe_mxfp8_grouped_gemm(*args, **kw)   # the heuristic's choice at K 160 runs


def test_heuristic_thresholds():
    """The MFMA core from 3/4 of the CUs' worth of its workgroups (N / 64 x live blocks); below, the
    GEMV core's widest BLOCK_N with 3 workgroups per 2 CUs, else 8 (docs/peers/moe_mxfp8.md)."""
    mfma = {"BLOCK_N": 64, "M_CHUNK": op.MFMA_CHUNK}
    blocks = op.NUM_CUS * 3 // 4 // (1536 // 64)    # the fewest whose MFMA grid reaches 3/4 of the CUs
    assert op.moe_heuristic_config(8, 256, 1536, 6144, 16, blocks).variant == mfma
    assert op.moe_heuristic_config(8, 256, 1536, 6144, 16, blocks - 1).variant == {"BLOCK_N": 16, "M_CHUNK": 2}
    assert op.moe_heuristic_config(1, 32, 1536, 6144, 16, 1).variant == {"BLOCK_N": 8, "M_CHUNK": 2}


def test_heuristic_gemv_chunk_of_4_only_where_throughput_decides():
    """The GEMV core (K 192: no MFMA core; N 4096 at BLOCK_N 64 is 64 column groups) reads a weight
    tile once per 4 rows where its grid fills the chip's resident workgroups (64 x 32 blocks = 8
    per CU) and an active expert averages >= 1.5 rows (256 routes over 128 experts: about 111
    active, 2.3 rows each); else 2 (64 routes: about 50 active, 1.3 rows; or 31 blocks)."""
    blocks = op.RESIDENT_WGS // 64
    assert op.moe_heuristic_config(256, 128, 4096, 192, 16, blocks).variant == {"BLOCK_N": 64, "M_CHUNK": 4}
    assert op.moe_heuristic_config(256, 128, 4096, 192, 16, blocks - 1).variant == {"BLOCK_N": 64, "M_CHUNK": 2}
    assert op.moe_heuristic_config(64, 128, 4096, 192, 16, blocks).variant == {"BLOCK_N": 64, "M_CHUNK": 2}


def test_guard_expert_block_count(problem):
    (a, sa, w, sw, ids, eids, nv), tw, out = problem
    assert "blocks" in _rejects("shape", a, sa, w, sw, ids, eids[:1], nv, out=out, block_m=4, topk=2)


def test_guard_topk_weights_shape(problem):
    args, tw, out = problem
    assert "topk_weights" in _rejects("shape", *args, out=out, block_m=4, topk_weights=tw[:, :1].T.contiguous())


def test_guard_weight_k_mismatch(problem):
    (a, sa, w, sw, ids, eids, nv), tw, out = problem
    assert "w has shape" in _rejects("shape", a, sa, w[:, :, :128], sw, ids, eids, nv, out=out, block_m=4,
                                    topk=2)


def test_guard_out_dtype(problem):
    args, tw, out = problem
    assert "out has dtype" in _rejects("dtype", *args, out=out, block_m=4, topk=2, out_dtype=torch.float32)


def test_guard_2gb_voffset_is_per_expert_slice():
    T, K, N = 2, 1 << 15, 1 << 16
    w = torch.empty(1, N, K, dtype=torch.float8_e4m3fn)          # 2^31 bytes, never touched
    w_scale = torch.empty(1, N, K // 32, dtype=torch.uint8)
    a, a_scale = torch.zeros(T, K, dtype=torch.float8_e4m3fn), torch.zeros(T, K // 32, dtype=torch.uint8)
    srt = routing.moe_sorting(torch.zeros(T, 1, dtype=torch.int64), torch.ones(T, 1), 1, block_m=2)
    out = torch.full((T, 1, N), 5.0, dtype=torch.bfloat16)
    args = (a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids)
    with pytest.raises(guards.GuardError, match=r"\[2GB-voffset\] w\[expert\] spans 2147483648"):
        mxgemm.moe_mxfp8_grouped_gemm(*args, block_m=2, topk=1, out=out, fallback="error")
    assert torch.all(out == 5.0)
    assert mxgemm.explain("moe_mxfp8_grouped_gemm", *args, block_m=2, topk=1).fallback


def test_guard_arch(problem):
    args, tw, out = problem
    meta = [t.to("meta") for t in args]
    with pytest.raises(guards.GuardError, match=r"\[arch\].*meta"):
        mxgemm.moe_mxfp8_grouped_gemm(*meta, block_m=4, topk=2, fallback="error")


# ------------------------------------------------------------------------------------------
# ISA
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [pytest.param(v, id=registry.variant_id(v))
                                     for v in registry.get(MOE).variants])
def test_isa_no_spills_and_128_bit_weight_loads(variant):
    info = build.artifact(MOE, variant).isa()
    assert info.spills == 0 and info.scratch_bytes == 0, info.summary()
    buffer_loads = {m for m in info.histogram if m.startswith("buffer_load")}
    assert buffer_loads == {"buffer_load_dwordx4", "buffer_load_ubyte"}, buffer_loads
    assert info.occupancy(256) >= 4, info.summary()


def test_guard_expert_id_beyond_w(problem):
    (a, sa, w, sw, ids, eids, nv), tw, out = problem
    eids = eids.clone()
    eids[0] = 99
    assert "sorted_expert_ids[0] = 99 but w holds 4 experts" in _rejects("expert-id", a, sa, w, sw, ids, eids, nv,
                                                                        out=out, block_m=4, topk=2)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("K", [384, 512, 640])
def test_mfma_chunk_is_bitwise(out_dtype, K):
    """M_CHUNK 16 sums each 128-K MFMA step exactly and rounds once (reference chunk 128): every
    output bit equals the reference's, top-k weights, padding and per-slot A rows included. K steps
    3, 4 and 5: the two-step loop with and without its one-step tail."""
    variant = {"BLOCK_N": 64, "M_CHUNK": op.MFMA_CHUNK}
    a, a_scale, w, w_scale, srt, tw, _ = moe_problem(T=40, E=4, topk=2, N=128, K=K, block_m=16, seed=7,
                                                     per_slot_a=True)
    got = mxgemm.moe_mxfp8_grouped_gemm(
        a, a_scale, w, w_scale, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids,
        topk_weights=tw, block_m=16, out_dtype=out_dtype, config=variant, fallback="error")
    n = int(srt.num_valid_ids[0])
    tok, slot = routing.decode_sorted_id(srt.sorted_token_ids[:n].long())
    real = tok < a.shape[0]
    rows = torch.where(real, tok * a.shape[1] + slot, 0)
    a2, s2 = a.reshape(-1, a.shape[-1]), a_scale.reshape(-1, a_scale.shape[-1])
    exp = srt.sorted_expert_ids.long()[torch.arange(n) // 16]
    want = torch.zeros(n, w.shape[1], dtype=torch.float32)
    for p in real.nonzero().squeeze(1).tolist():
        want[p] = reference.mx_gemm_ref(a2[rows[p]][None], s2[rows[p]][None], w[exp[p]], w_scale[exp[p]],
                                        out_dtype=torch.float32, chunk=reference.MX_MMA_K)[0] * srt.sorted_weights[p]
    want = want if out_dtype == torch.float32 else reference.F.bf16_rne(want)
    bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got[tok[real], slot[real]].view(bits), want[real].view(bits))


# ------------------------------------------------------------------------------------------
# Tuned-config CSV
# ------------------------------------------------------------------------------------------
def test_tuned_csv_rows_are_simulated_registered_variants_the_planner_takes():
    """Every shipped row comes from the tuner (source simulated, its time no slower than its
    runner-up's) with a variant that runs its K and block_m; a call of the row's shape gets it."""
    from mxgemm import tuned
    rows = tuned.read_rows(op.CONFIG_CSV)
    assert rows and set(rows[0]) == set(op.CSV_FIELDS)
    op.tuned_table.cache_clear()
    for r in rows:
        variant = {p: int(r[p]) for p in op.CSV_PARAMS}
        K, block_m = int(r["K"]), int(r["block_m"])
        assert r["source"] == "simulated" and float(r["us"]) <= float(r["runner_up_us"]), r
        assert variant in op.candidates(K, block_m), r
        key = [int(r[c]) for c in ("tokens", "experts", "topk", "per_route_a", "N", "K", "block_m")]
        choice = op.tuned_config(key[0], *key[1:3], bool(key[3]), *key[4:])
        assert choice is not None and choice.variant == variant, r
