"""The autotuner on the timing model (`python -m mxgemm tune`): it keeps the fastest candidate, the
runner-up and the peer's time, keeps other shapes' rows, and writes a table the planner reads."""
from __future__ import annotations

import torch

import mxgemm
from mxgemm import tuned
from mxgemm.ops import moe_mxfp8 as moe
from mxgemm.ops import smallm_mxfp8 as op
from mxgemm.ops import train_grouped_gemm as tgg
from mxgemm.timing import tune
from mxgemm.timing.peers import grouped_fp8, moe_mxfp8, smallm, time_ours


def test_the_tuner_keeps_the_fastest_candidate_with_the_runner_up_and_the_peer(tmp_path, capsys):
    path = tmp_path / "t.csv"
    other = {f: "" for f in op.CSV_FIELDS} | dict(arch="gfx950", M="1", N="1280", K="8192",
                                                   kernel=op.GEMV, M_TILE="1", N_SUB="1", source="heuristic")
    tuned.write_rows([other], path, op.CSV_FIELDS)
    M, N, K = 9, 256, 512
    assert tune.main(["smallm", "--shapes", f"{M}x{N}x{K}", "--out", str(path)]) == 0
    assert "heuristic within 5 % of the best: " in capsys.readouterr().out
    rows = tuned.read_rows(path)
    assert rows[0] == other and len(rows) == 2
    r = rows[1]
    # each candidate timed on its own, outside the tuner: the same model gives the same times
    a, sa, b, sb = smallm.operands(M, N, K)
    times = sorted((time_ours(lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config={"kernel": k, **v}),
                              rounds=smallm.ROUNDS)[1], k, v) for k, v in op.candidates(M, N, K))
    assert len(times) == 4
    (us, kernel, variant), runner = times[0], times[1]
    assert (r["kernel"], op._variant_of(r), r["source"]) == (kernel, variant, "simulated")
    assert float(r["us"]) == round(us, 2) and float(r["runner_up_us"]) == round(runner[0], 2)
    assert r["runner_up"] == ",".join([runner[1], *(f"{p}={x}" for p, x in runner[2].items())])
    peer_us = smallm.time_peer(a, sa, b, sb)[1]["us"]
    assert float(r["peer_us"]) == round(peer_us, 2) and peer_us > us
    assert tune.main(["smallm", "--table", "--out", str(path)]) == 0      # the simulated row only
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and table[2].startswith(f"|  | {M} | {N} | {K} | {r['us']} | ")


def test_every_candidate_serves_its_shape_at_its_smallest_tile():
    for M in (1, 2, 3, 8, 9, 16, 33, 64):
        cands = op.candidates(M, 1024, 1024)
        assert cands and all(op.serves(k, M, 1024) for k, _ in cands)
        assert {v["M_TILE"] for _, v in cands if _ == op.MFMA} <= {min(t for t in (16, 32, 64) if t >= M)}
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
