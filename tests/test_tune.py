"""The autotuner on the timing model (`python -m mxgemm tune`): it keeps the fastest candidate, the
runner-up and the peer's time, keeps other shapes' rows, and writes a table the planner reads."""
from __future__ import annotations

import pytest
import torch

import mxgemm
from mxgemm import quant, reference, tuned
from mxgemm.launcher import emulator_settings
from mxgemm.ops import blockscale_grouped_gemm as bs
from mxgemm.ops import dense_mx
from mxgemm.ops import moe_mxfp8 as moe
from mxgemm.ops import smallm_mxfp8 as op
from mxgemm.ops import train_grouped_gemm as tgg
from mxgemm.timing import tune
from mxgemm.timing.peers import NoPeer, blockscale, grouped_fp8, moe_mxfp8, mx_gemm, smallm, time_ours


def _tuned_beside(path, capsys, fields, other, argv) -> dict:
    """Tunes argv's one shape into a table holding a row of another shape (``other``) -> the new
    row, after checking that the other row is kept ahead of it and the heuristic was judged."""
    other = {f: "" for f in fields} | other
    tuned.write_rows([other], path, fields)
    assert tune.main([*argv, "--out", str(path)]) == 0
    assert "heuristic within 5 % of the best: " in capsys.readouterr().out
    rows = tuned.read_rows(path)
    assert rows[0] == other and len(rows) == 2
    return rows[1]


def test_a_row_replaces_its_key_in_place_and_keeps_rows_written_since(tmp_path):
    """put_row re-reads the table: rows another tuner wrote after this one started are kept."""
    path, fields = tmp_path / "p.csv", ("k", "v")
    tuned.put_row({"k": "a", "v": "1"}, path, fields, key=lambda r: r["k"])
    tuned.write_rows([{"k": "a", "v": "1"}, {"k": "b", "v": "2"}], path, fields)    # another tuner's row
    tuned.put_row({"k": "c", "v": "3"}, path, fields, key=lambda r: r["k"])
    tuned.put_row({"k": "a", "v": "4"}, path, fields, key=lambda r: r["k"])
    assert tuned.read_rows(path) == [{"k": "a", "v": "4"}, {"k": "b", "v": "2"}, {"k": "c", "v": "3"}]


def test_the_tuner_keeps_the_fastest_candidate_with_the_runner_up_and_the_peer(tmp_path, capsys):
    path = tmp_path / "t.csv"
    M, N, K = 9, 256, 512
    r = _tuned_beside(path, capsys, op.CSV_FIELDS, dict(arch="gfx950", M="1", N="1280", K="8192", kernel=op.GEMV,
                                                        M_TILE="1", N_SUB="1", source="heuristic"),
                      ["smallm", "--shapes", f"{M}x{N}x{K}"])
    # each candidate timed on its own, outside the tuner: the same model gives the same times
    a, sa, b, sb = smallm.operands(M, N, K)
    times = sorted((time_ours(lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config={"kernel": k, **v}),
                              rounds=smallm.ROUNDS)[1], k, v) for k, v in op.candidates(M, N, K))
    assert len(times) == 5 and (op.DENSE, {"BM": 64, "BN": 64}) in [t[1:] for t in times]
    (us, kernel, variant), runner = times[0], times[1]
    assert (r["kernel"], op._variant_of(r), r["source"]) == (kernel, variant, "simulated")
    assert float(r["us"]) == round(us, 2) and float(r["runner_up_us"]) == round(runner[0], 2)
    assert r["runner_up"] == ",".join([runner[1], *(f"{p}={x}" for p, x in runner[2].items())])
    peer_us = smallm.time_peer(a, sa, b, sb)[1]["us"]
    assert float(r["peer_us"]) == round(peer_us, 2) and peer_us > us
    assert tune.main(["smallm", "--table", "--out", str(path)]) == 0      # the simulated row only
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and table[2].startswith(f"|  | {M} | {N} | {K} | {r['us']} | ")


def test_every_candidate_serves_its_shape_at_its_smallest_tile_or_below():
    for M in (1, 2, 3, 8, 9, 16, 33, 64):
        cands = op.candidates(M, 1024, 1024)
        assert cands and all(op.serves(k, M, 1024) for k, _ in cands)
        covering = min(t for t in (16, 32, 64) if t >= M)
        assert {v["M_TILE"] for k, v in cands if k == op.GEMV} <= {min((t for t in (1, 2, 4, 8, 16) if t >= M),
                                                                      default=None)}
        assert {v["M_TILE"] for k, v in cands if k == op.MFMA} == {t for t in (16, 32, 64) if t <= covering}
        heuristic = op.heuristic_config(M, 1024, 1024)
        assert (heuristic.kernel, heuristic.variant) in cands      # the tuner can tell how good it was
    assert op.candidates(16, 1024, 96) == [(op.GEMV, {"M_TILE": 16, "N_SUB": 1})]   # K % 128: no MFMA


def test_the_moe_tuner_writes_the_fastest_variant_the_planner_then_reads(tmp_path, capsys, monkeypatch):
    """gemm2's call (a row per route, top-k weights, fp32 out) at 3 tokens x top-2 of 4 experts:
    every variant timed on its own gives the same fastest and runner-up; the planner takes the row
    at the nearest tuned token count >= T and falls back to the heuristic past it."""
    path = tmp_path / "moe.csv"
    T, k, E, N, K = 3, 2, 4, 64, 256
    assert tune.main(["moe_mxfp8", "--shapes", f"{T}x{k}x{E}x{N}x{K}x1", "--out", str(path)]) == 0
    assert "heuristic within 5 % of the best: " in capsys.readouterr().out
    (r,) = tuned.read_rows(path)
    ids, weights, srt = moe_mxfp8.routing(T, k, E)
    a, sa, w, sw = moe_mxfp8.operands(T, k, E, N, K, True, srt)
    times = sorted((time_ours(lambda: mxgemm.moe_mxfp8_grouped_gemm(
        a, sa, w, sw, srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids, topk_weights=weights,
        block_m=16, out_dtype=torch.float32, config=v, fallback="error"), rounds=moe_mxfp8.ROUNDS, xcd0=True)[1],
                    tuple(v.items())) for v in moe.candidates(K, 16))
    assert len(times) == len(moe.registry.get(moe.MOE).variants)
    (us, best), (runner_us, runner) = times[0], times[1]
    assert {p: int(r[p]) for p in moe.CSV_PARAMS} == dict(best) and r["source"] == "simulated"
    assert float(r["us"]) == round(us, 2) and float(r["runner_up_us"]) == round(runner_us, 2)
    assert r["runner_up"] == ",".join(f"{p}={x}" for p, x in runner)
    monkeypatch.setattr(moe, "CONFIG_CSV", path)
    moe.tuned_table.cache_clear()
    moe.moe_mxfp8_grouped_gemm.clear_plans()
    try:
        for tokens in (3, 2, 4):
            ids, weights, srt = moe_mxfp8.routing(tokens, k, E)
            a, sa, w, sw = moe_mxfp8.operands(tokens, k, E, N, K, True, srt)
            plan = mxgemm.explain("moe_mxfp8_grouped_gemm", a, sa, w, sw, srt.sorted_token_ids, srt.sorted_expert_ids,
                                  srt.num_valid_ids, topk_weights=weights, block_m=16, out_dtype=torch.float32)
            assert ("tuned CSV row tokens=3 " in plan.reason) == (tokens <= 3), plan
    finally:
        moe.tuned_table.cache_clear()
        moe.moe_mxfp8_grouped_gemm.clear_plans()


def test_the_moe_tuner_writes_a_row_without_a_peer_where_the_peer_is_not_defined(tmp_path, capsys):
    """The peer reads whole 128-K slices with no mask: at K 192 it refuses before compiling, and the
    row is ours alone, its peer columns empty in the CSV and '-' in the table."""
    path = tmp_path / "moe.csv"
    T, k, E, N, K = 2, 2, 4, 64, 192
    ids, weights, srt = moe_mxfp8.routing(T, k, E)
    a, sa, w, sw = moe_mxfp8.operands(T, k, E, N, K, True, srt)
    with pytest.raises(NoPeer, match="K % 128 == 0, got K=192"):
        moe_mxfp8.time_peer(a, sa, w, sw, ids, weights)
    assert tune.main(["moe_mxfp8", "--shapes", f"{T}x{k}x{E}x{N}x{K}x1", "--out", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "no peer at this shape: " in printed and "ours faster than the peer: 0 of 0 with a peer" in printed
    (r,) = tuned.read_rows(path)
    assert r["source"] == "simulated" and float(r["us"]) > 0 and r["peer_us"] == ""
    assert tune.main(["moe_mxfp8", "--table", "--out", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith(f"| {r['runner_up_us']} | - | - |")


def test_the_grouped_fp8_tuner_writes_the_fastest_config_the_planner_then_reads(tmp_path, capsys, monkeypatch):
    """The forward at 2 groups of 256 rows, N = K = 256: every candidate timed on its own gives the
    same fastest and runner-up (ties to the first candidate, the heuristic's), the row carries the
    peer's time and the op's problem key, and the planner then runs the row's config."""
    path = tmp_path / "g.csv"
    shape = ("fwd", 2, 256, 256, 256)
    assert tune.main(["grouped_fp8", "--shapes", "fwdx2x256x256x256", "--out", str(path)]) == 0
    assert "heuristic within 5 % of the best: 1 of 1" in capsys.readouterr().out
    (r,) = tuned.read_rows(path)
    layout, G, M, N, K = grouped_fp8.problem(*shape)
    assert (layout, G, M, N, K) == ("NT", 2, 512, 256, 256)
    assert tuple(r[k] for k in tgg.KEY) == tuple(map(str, (layout, G, M, N, K))) and r["source"] == "simulated"
    a, sa, b, sb, lens = grouped_fp8.operands(*shape)
    cands = tgg.candidates(layout, G, M, N)
    times = sorted((time_ours(lambda: grouped_fp8.ours("fwd", a, sa, b, sb, lens, config=c), rounds=grouped_fp8.ROUNDS,
                              xcd0=True)[1], i) for i, c in enumerate(cands))
    (us, best), (runner_us, runner) = times[0], times[1]
    assert {k: int(r[k]) for k in tgg.CONFIG} == cands[best]
    assert float(r["us"]) == round(us, 2) and float(r["runner_up_us"]) == round(runner_us, 2)
    assert r["runner_up"] == ",".join(f"{k}={v}" for k, v in cands[runner].items())
    peer_us = grouped_fp8.time_peer("fwd", a, sa, b, sb, lens)[1]["us"]
    assert float(r["peer_us"]) == round(peer_us, 2)
    monkeypatch.setattr(tgg, "CONFIG_CSV", path)
    tgg.tuned_table.cache_clear()
    tgg.grouped_gemm_fp8_kernel.clear_plans()
    try:
        plan = grouped_fp8.ours("fwd", a, sa, b, sb, lens, explain=True)
        assert "tuned table row (source=simulated)" in plan.reason, plan
        assert (plan.variant["BM"], plan.variant["BN"], plan.args["group_m"]) == \
            (int(r["BM"]), int(r["BN"]), int(r["GROUP_M"]))
    finally:
        tgg.tuned_table.cache_clear()
        tgg.grouped_gemm_fp8_kernel.clear_plans()


def test_grouped_fp8_candidates_walk_one_parameter_from_the_heuristic():
    for problem in (("NT", 8, 4096, 2880), ("NN", 8, 4096, 2048), ("TN", 8, 7168, 2048), ("NT", 2, 128, 64)):
        rule, cands = tgg.heuristic_config(*problem), tgg.candidates(*problem)
        assert cands[0] == rule and len(cands) == len({tuple(c.items()) for c in cands})
        for c in cands:
            moved = {"tile" if k in ("BM", "BN") else k for k in tgg.CONFIG if c[k] != rule[k]}
            assert len(moved) <= 1, (problem, c)
    tiles = {(v["BM"], v["BN"]) for v in tgg._FACTS.variants if v["LAYOUT"] == "NT" and "GRAN" not in v
             and (v["FMT"], v["FMT_B"], v["OUT"]) == ("e4m3", "e4m3", "bf16")}
    big = tgg.candidates("NT", 8, 4096, 2880)
    assert {(c["BM"], c["BN"]) for c in big} == tiles - {(64, 64)}
    assert {c["PERSISTENT"] for c in big} == set(tgg.PERSISTENT) and {c["GROUP_M"] for c in big} == {1, 2, 4}
    assert (64, 64) in {(c["BM"], c["BN"]) for c in tgg.candidates("NT", 2, 128, 64)}   # N under 128: the rule's


def test_the_mx_gemm_tuner_writes_the_fastest_tile_with_the_runner_up_and_the_peer(tmp_path, capsys):
    """MXFP4 on shuffled scales at M 96, N 64, K 512: every tile timed on its own gives the same
    fastest and runner-up, and the row carries the peer's time."""
    M, N, K = 96, 64, 512
    r = _tuned_beside(tmp_path / "mx.csv", capsys, dense_mx.CSV_FIELDS,
                      dict(arch="gfx950", M="64", a_format="e4m3", b_format="e4m3", out="bf16", shuffled="0", N="64",
                           K="128", BM="64", BN="64", SPLITS="1", source="heuristic"),
                      ["mx_gemm", "--shapes", f"e2m1xe2m1x{M}x{N}x{K}x1"])
    assert (r["a_format"], r["b_format"], r["out"], r["shuffled"], r["M"], r["N"], r["K"]) == \
        ("e2m1", "e2m1", "bf16", "1", str(M), str(N), str(K))
    a, sa, b, sb = mx_gemm.operands("e2m1", "e2m1", M, N, K)
    xa, xb = quant.shuffle_scales(sa), quant.shuffle_scales(sb)
    cands = dense_mx.candidates("gfx950", "e2m1", "e2m1", "bf16", 1)
    assert [(c["BM"], c["BN"], c["SPLITS"]) for c in cands] == [(64, 64, 1), (128, 128, 1), (256, 128, 1)]
    times = sorted((time_ours(lambda: mxgemm.mx_gemm(a, xa, b, xb, a_format="e2m1", b_format="e2m1", config=c,
                                                     shuffled_scales=True), rounds=mx_gemm.ROUNDS)[1], i)
                   for i, c in enumerate(cands))
    (us, best), (runner_us, runner) = times[0], times[1]
    assert {p: int(r[p]) for p in dense_mx.CSV_PARAMS} == cands[best] and r["source"] == "simulated"
    assert float(r["us"]) == round(us, 2) and float(r["runner_up_us"]) == round(runner_us, 2)
    assert r["runner_up"] == ",".join(f"{k}={v}" for k, v in cands[runner].items())
    peer_us = mx_gemm.time_peer(a, sa, b, sb, "e2m1", "e2m1")[1]["us"]
    assert float(r["peer_us"]) == round(peer_us, 2)


def test_smallm_runs_a_tuned_mx_gemm_row_bitwise_as_mx_gemm(tmp_path, monkeypatch):
    """A smallm row may name mx_gemm's tile (the tuner times it beside the small-M kernels): M up
    to the row's runs it, bitwise mx_gemm_ref at its 128-K chunks; a caller may force it too."""
    path = tmp_path / "s.csv"
    row = dict(arch="gfx950", M=64, N=256, K=512, kernel=op.DENSE, BM=64, BN=64, us="1.00", source="simulated")
    tuned.write_rows([row], path, op.CSV_FIELDS)
    monkeypatch.setattr(op, "CONFIG_CSV", path)
    op.tuned_table.cache_clear()
    op.smallm_mxfp8_gemm.clear_plans()
    try:
        a, sa, b, sb = smallm.operands(33, 256, 512)
        p = mxgemm.explain("smallm_mxfp8_gemm", a, sa, b, sb)
        assert p.kernel == op.DENSE and "tuned CSV row M=64 " in p.reason and (p.variant["BM"], p.variant["BN"]) == \
            (64, 64), p
        want = reference.mx_gemm_ref(a, sa, b, sb, chunk=reference.MX_MMA_K)
        with emulator_settings(race_check=False):
            got = mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, fallback="error")
            forced = mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config={"kernel": op.DENSE, "BM": 64, "BN": 64},
                                              fallback="error")
        assert torch.equal(got, want) and torch.equal(forced, want)
        assert mxgemm.explain("smallm_mxfp8_gemm", *smallm.operands(65, 256, 512)).kernel == op.DENSE
        a, sa, b, sb = smallm.operands(33, 256, 640)          # another K: no row, the rule
        assert mxgemm.explain("smallm_mxfp8_gemm", a, sa, b, sb).kernel == op.MFMA
    finally:
        op.tuned_table.cache_clear()
        op.smallm_mxfp8_gemm.clear_plans()


def test_mx_gemm_runs_the_tuned_row_at_the_nearest_m_above(tmp_path, monkeypatch):
    """A row (here 128 x 128, which the rule would not pick at these shapes) serves every M up to
    its own with the same formats, scale layout, N and K; past it, or for another key, or when its
    tile is no longer registered, the rule picks."""
    path = tmp_path / "mx.csv"
    row = dict(arch="gfx950", M=256, a_format="e4m3", b_format="e4m3", out="bf16", shuffled=0, N=256, K=512,
               BM=128, BN=128, SPLITS=1, us="1.00", source="simulated")
    stale = {**row, "M": 64, "N": 512, "BM": 32, "BN": 32}
    tuned.write_rows([row, stale], path, dense_mx.CSV_FIELDS)
    monkeypatch.setattr(dense_mx, "CONFIG_CSV", path)
    dense_mx.tuned_table.cache_clear()
    dense_mx.mx_gemm.clear_plans()
    try:
        def plan(M, N, fmt="e4m3"):
            g = torch.Generator().manual_seed(1)
            a, sa = quant.quantize_mx(torch.randn(M, 512, generator=g), "e4m3")
            b, sb = quant.quantize_mx(torch.randn(N, 512, generator=g), fmt)
            return mxgemm.explain("mx_gemm", a, sa, b, sb, b_format=fmt)
        for M in (1, 100, 256):
            p = plan(M, 256)
            assert "tuned CSV row M=256 (source=simulated)" in p.reason and (p.variant["BM"], p.variant["BN"]) == \
                (128, 128), p
        for p in (plan(257, 256), plan(64, 512), plan(64, 256, "e2m1")):
            assert "heuristic" in p.reason and p.variant["BM"] == 64, p
        with emulator_settings(race_check=False):
            g = torch.Generator().manual_seed(2)
            a, sa = quant.quantize_mx(torch.randn(200, 512, generator=g), "e4m3")
            b, sb = quant.quantize_mx(torch.randn(256, 512, generator=g), "e4m3")
            got = mxgemm.mx_gemm(a, sa, b, sb)
        assert torch.equal(got, reference.mx_gemm_ref(a, sa, b, sb, chunk=reference.MX_MMA_K))
    finally:
        dense_mx.tuned_table.cache_clear()
        dense_mx.mx_gemm.clear_plans()


def test_the_smallm_tuner_finds_a_heuristic_mx_gemm_pick_among_its_candidates():
    shape = (64, 16384, 2048)   # M > 16 and 256 tiles of 64 x 64: the rule takes mx_gemm
    assert op.heuristic_config(*shape).kernel == op.DENSE
    assert tune.FAMILIES["smallm"]()["heuristic"](shape) in op.candidates(*shape)


def test_every_mx_gemm_heuristic_pick_is_a_candidate():
    for *fmts, out in (("e4m3", "e4m3", "bf16"), ("e2m1", "e2m1", "f32"), ("e4m3", "e2m1", "f32"),
                       ("e2m3", "e5m2", "bf16")):      # FP6: bf16 out only
        for M, N, K in ((1, 256, 4096), (64, 256, 4096), (1024, 1024, 1024), (8192, 8192, 8192)):
            for shuffled in (0, 1) if out == "bf16" and fmts[0] == "e4m3" else (0,):
                pick = dense_mx.heuristic_pick("gfx950", *fmts, out, M, N, K, shuffled)
                assert pick in dense_mx.candidates("gfx950", *fmts, out, shuffled), (fmts, out, M, N, K, pick)
    assert {c["SPLITS"] for c in dense_mx.candidates("gfx950", "e4m3", "e4m3", "f32")} == {1, 2}
    assert {c["SPLITS"] for c in dense_mx.candidates("gfx950", "e4m3", "e4m3", "bf16")} == {1}


def test_the_blockscale_tuner_writes_the_fastest_tile_as_the_peer_family_times_it(tmp_path, capsys):
    """Contiguous, 2 groups of 100 rows (padded to 128), N 256, K 768: each tile timed by the peer
    family's own run (the two sampled K, extrapolated) gives the same fastest, runner-up and peer
    time; the row is keyed by the op's M (a's 256 rows)."""
    path = tmp_path / "b.csv"
    assert tune.main(["blockscale", "--shapes", "0x2x100x256x768", "--out", str(path)]) == 0
    assert "heuristic within 5 % of the best: " in capsys.readouterr().out
    (r,) = tuned.read_rows(path)
    assert (r["family"], r["G"], r["M"], r["N"], r["K"]) == ("MASKED=0,OUT=bf16,UE8M0=0", "2", "256", "256", "768")
    cell = dict(label="t", masked=False, G=2, m=100, N=256, K=768)
    tiles = bs.candidates(256, dict(MASKED=0, UE8M0=0, OUT="bf16"))
    assert tiles == [(64, 128), (128, 64), (128, 128)]
    runs = [blockscale.run(cell, config=f"BM={bm},BN={bn}") for bm, bn in tiles]
    (us, best), (runner_us, runner) = sorted((x["ours_us"], i) for i, x in enumerate(runs))[:2]
    assert (int(r["BM"]), int(r["BN"])) == tiles[best] and r["source"] == "simulated"
    assert float(r["us"]) == round(us, 2) and float(r["runner_up_us"]) == round(runner_us, 2)
    assert r["runner_up"] == "BM={},BN={}".format(*tiles[runner])
    assert float(r["peer_us"]) == round(runs[0]["peer_us"], 2)


def test_deep_gemm_runs_the_tuned_tile_at_the_nearest_m_above(tmp_path, monkeypatch):
    """Masked, 2 groups: a row (64 x 128, which the rule would not pick here) serves buffers of up
    to its M rows with the same G, N and K; past it, for the contiguous family, or under a caller's
    config, the rule or the config picks; the product is the reference's."""
    path = tmp_path / "b.csv"
    row = dict(family="MASKED=1,OUT=bf16,UE8M0=0", G=2, M=128, N=256, K=512, BM=64, BN=128, us="1.00",
               source="simulated")
    tuned.write_rows([row], path, bs.CSV_FIELDS)
    monkeypatch.setattr(bs, "CONFIG_CSV", path)
    bs.tuned_table.cache_clear()
    bs.deep_gemm_fp8_grouped_gemm.clear_plans()
    try:
        def plan(m, masked=True, config=""):
            a, sfa, b, sfb, layout = blockscale.operands(2, m, 256, 512, masked)
            d = torch.zeros(*a.shape[:-1], 256, dtype=torch.bfloat16)
            return mxgemm.explain("deep_gemm_fp8_grouped_gemm", a, sfa, b, sfb, layout, d, masked=masked,
                                  config=config)
        rule = plan(129).variant["BM"], plan(129).variant["BN"]
        assert rule != (64, 128) and "tuned" not in plan(129).reason
        for m in (1, 64, 128):
            p = plan(m)
            assert "tuned CSV row M=128 (source=simulated)" in p.reason and (p.variant["BM"], p.variant["BN"]) == \
                (64, 128), p
        assert "tuned" not in plan(64, masked=False).reason
        assert "config given by the caller" in plan(64, config="BM=128,BN=128").reason
        a, sfa, b, sfb, layout = blockscale.operands(2, 100, 256, 512, True, seed=4)
        layout[1] = 37
        with emulator_settings(race_check=False):
            got = blockscale.ours(a, sfa, b, sfb, layout, True)
        ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, layout)
        torch.testing.assert_close(got.float(), ref.float(), rtol=2 ** -7, atol=1e-2)
    finally:
        bs.tuned_table.cache_clear()
        bs.deep_gemm_fp8_grouped_gemm.clear_plans()
