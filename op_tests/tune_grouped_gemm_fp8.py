"""Tune the tensorwise FP8 grouped GEMM configs and (re)write
python/mxgemm/configs/train_grouped_gemm_gfx950.csv, keyed by (layout, G, M, N, K) (see
mxgemm.ops.train_grouped_gemm.problem_key).

On an MI355X (gfx950 GPU, ROCm torch) the default mode times every candidate config (each
registered e4m3 -> bf16 tile of the layout x GROUP_M x PERSISTENT) of the forward (NT), dgrad
(NN) and wgrad (TN) GEMMs of each MoE up-projection of op_tests/test_grouped_gemm_fp8.py
(balanced split, as a dispatcher's autotune profiles) and keeps the fastest (source=measured):

    python op_tests/tune_grouped_gemm_fp8.py                       # every model, EP 8, 512 and 2048 rows/group
    python op_tests/tune_grouped_gemm_fp8.py --model GPT-OSS -M 1024

``--heuristic`` writes the rows the planner's rule (heuristic_config) picks, marked
source=heuristic, for the problems the table has no timed row of (the timing model's tuner,
`python -m mxgemm tune grouped_fp8`, writes source=simulated rows into the same table).
``--emulator`` is a dry run of the measuring path on tiny problems with two candidates each, timed
on the emulator (meaningless times, source=emulator), checking that every candidate gives the
reference's bits; tests/test_op_tests.py runs it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch

from mxgemm import toolchain, tuned
from mxgemm.ops import train_grouped_gemm as op

FIELDS = op.CSV_FIELDS


def default_problems(models, ep, rows_per_group):
    """(layout, G, M, N, K) of the three GEMMs of each model's up-projection (N = 2 * inter)."""
    from test_grouped_gemm_fp8 import MODELS  # the benchmark script beside this one
    out = []
    for name in models:
        hidden, inter, experts = MODELS[name]
        G = experts // ep
        for m in rows_per_group:
            out += [("NT", G, G * m, 2 * inter, hidden), ("NN", G, G * m, hidden, 2 * inter),
                    ("TN", G, 2 * inter, hidden, G * m)]
    return out


def candidates(layout):
    tiles = sorted({(v["BM"], v["BN"]) for v in op._FACTS.variants
                    if (v["LAYOUT"], v["FMT"], v["FMT_B"], v["OUT"]) == (layout, "e4m3", "e4m3", "bf16")})
    return [dict(BM=bm, BN=bn, GROUP_M=gm, PERSISTENT=p) for bm, bn in tiles for gm in op.GROUP_MS
            for p in op.PERSISTENT]


def call_of(layout, G, M, N, K, device):
    """(op, args, kwargs, reference thunk) of one problem, balanced split."""
    from test_grouped_gemm_fp8 import gemms, reference_of, split_rows
    if layout == "TN":   # gemms' wgrad is out [G, n, k] from dy [sum_m, n], x [sum_m, k]
        lens, n, k = split_rows(K, G, False), M, N
    else:                # forward: out [sum_m, n] with K = k; dgrad: out [sum_m, k] with K = n
        lens = split_rows(M, G, False)
        n, k = (N, K) if layout == "NT" else (K, N)
    fn, args, kw, _ = gemms(lens, n, k, device)[layout]
    return fn, args, kw, lambda: reference_of(layout, args, kw)


def row(problem, cfg, us, source):
    return {**dict(zip(op.KEY, problem)), **cfg, "us": "" if us is None else f"{us:.2f}", "source": source}


def heuristic_rows(problems):
    return [row(p, op.heuristic_config(p[0], p[1], p[2], p[3]), None, "heuristic") for p in problems]


def tune(problems, device, time_fn, pick, source):
    rows = []
    for p in problems:
        fn, args, kw, ref = call_of(*p, device)
        results = []
        for cfg in pick(p[0]):
            results.append((time_fn(lambda: fn(*args, **kw, config=cfg)), cfg))
        us, cfg = min(results, key=lambda t: t[0])
        print(f"{' '.join(f'{k}={v}' for k, v in zip(op.KEY, p))}: {cfg} {us:.2f} us "
              f"({len(results)} candidates)", flush=True)
        rows.append(row(p, cfg, us, source))
    return rows


def gpu_time(fn) -> float:
    from test_smallm_mxfp8 import bench
    return bench(lambda i: fn(), 1, iters=50)


def emulator_dry_run(out_path) -> int:
    """Tiny problems, two candidates each (the heuristic's and a persistent GROUP_M=1 one), on the
    emulator; every candidate must give the reference's bits. Returns the exit status."""
    problems = [("NT", 2, 96, 64, 128), ("NN", 2, 96, 64, 128), ("TN", 2, 64, 64, 96)]
    bad = []

    def checked_time(p):
        def time_fn(run):
            t0 = time.perf_counter()
            got = run()
            if not torch.equal(got.view(torch.int16), call_of(*p, "cpu")[3]().view(torch.int16)):
                bad.append(p)
            return (time.perf_counter() - t0) * 1e6
        return time_fn

    rows = []
    for p in problems:
        heur = op.heuristic_config(p[0], p[1], p[2], p[3])
        other = dict(heur, GROUP_M=1, PERSISTENT=1)
        rows += tune([p], "cpu", checked_time(p), lambda layout: [heur, other], "emulator")
    tuned.write_rows(rows, out_path, FIELDS)
    print(f"wrote {len(rows)} rows to {out_path}; " + (f"NOT bit-exact: {bad}" if bad else
                                                      "every candidate bit-exact vs reference"))
    return int(bool(bad))


def main(argv=None):
    from test_grouped_gemm_fp8 import MODELS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heuristic", action="store_true", help="write rule-based rows (no GPU needed)")
    p.add_argument("--emulator", action="store_true", help="dry run on tiny problems (no GPU needed)")
    p.add_argument("--model", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("-M", type=int, nargs="*", default=[512, 2048], help="mean rows per group")
    p.add_argument("--out", default=str(op.CONFIG_CSV), help="CSV to write")
    args = p.parse_args(argv)
    if args.emulator:
        sys.exit(emulator_dry_run(args.out))
    problems = default_problems(args.model, args.ep, args.M)
    if args.heuristic:
        timed = {tuple(r[k] for k in op.KEY): r for r in tuned.read_rows(args.out) if r["source"] != "heuristic"}
        rows = [timed.pop(tuple(map(str, p)), None) or r for p, r in zip(problems, heuristic_rows(problems))]
        rows += list(timed.values())
    else:
        if toolchain.gpu_arch() != "gfx950":
            sys.exit(f"measuring needs a gfx950 GPU (MI355X); found {toolchain.gpu_arch() or 'none'}. "
                     "Use --heuristic or --emulator.")
        rows = tune(problems, "cuda", gpu_time, candidates, "measured")
    tuned.write_rows(rows, args.out, FIELDS)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
