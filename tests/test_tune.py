"""The autotuner on the timing model (`python -m mxgemm tune`): it keeps the fastest candidate, the
runner-up and the peer's time, keeps other shapes' rows, and writes a table the planner reads."""
from __future__ import annotations

import mxgemm
from mxgemm import tuned
from mxgemm.ops import smallm_mxfp8 as op
from mxgemm.timing import tune
from mxgemm.timing.peers import smallm, time_ours


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
