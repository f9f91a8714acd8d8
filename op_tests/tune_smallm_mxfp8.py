"""Tune smallm_mxfp8_gemm configs and (re)write python/mxgemm/configs/smallm_mxfp8_gfx950.csv.

On an MI355X (gfx950 GPU, ROCm torch) the default mode times every candidate config of each
(M, N, K) (mxgemm.ops.smallm_mxfp8.candidates) and keeps the fastest (source=measured):

    python op_tests/tune_smallm_mxfp8.py                       # all default shapes
    python op_tests/tune_smallm_mxfp8.py --shapes 1x7168x8192 16x4096x4096

Without the GPU, ``--heuristic`` writes the rows the dispatcher's documented rule
(mxgemm.ops.smallm_mxfp8.heuristic_config) would pick, marked source=heuristic, for the shapes
the table has no timed row of. The shipped
CSV's source=simulated rows come from the same candidates timed on the timing model, with the
peer beside them (`python -m mxgemm tune smallm`). Tests check the schema and that every row is
a registered, buildable config, so measured rows can replace any of these.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch

from mxgemm import tuned
from mxgemm.ops import smallm_mxfp8 as op

# (N, K) of decode-time linear layers: Llama-3-70B at TP8 (qkv, o, gate_up, down), Llama-3-8B
# (qkv, o, gate_up, down), DeepSeek-V3 dense projections (q_a/kv_a, o, shared-expert-like).
NK = [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584),
      (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
      (2112, 7168), (7168, 2048), (4096, 7168)]


def default_shapes():
    return [(m, n, k) for n, k in NK for m in op.TUNED_MS]


def time_config(M, N, K, kernel, variant) -> float:
    """Median microseconds of one call on the GPU (weights rotated past the L2 / MALL)."""
    from test_smallm_mxfp8 import bench, dense_inputs  # the benchmark script beside this one
    copies = max(1, (512 << 20) // (N * K))
    a, sa, bs = dense_inputs(M, N, K, "cuda", copies)
    out = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    cfg = {"kernel": kernel, **variant}
    return bench(lambda i: op.smallm_mxfp8_gemm(a, sa, *bs[i], out=out, config=cfg, fallback="error"),
                 copies, iters=200)


def row(M, N, K, kernel, variant, us, source):
    r = {"arch": op.ARCH, "M": M, "N": N, "K": K, "kernel": kernel, "us": "" if us is None else f"{us:.2f}",
         "source": source, "runner_up": "", "runner_up_us": "", "peer_us": ""}
    r.update({p: variant.get(p, "") for p in op.CSV_PARAMS})
    return r


def mnk(row) -> tuple:
    return tuple(int(row[d]) for d in "MNK")


def heuristic_rows(shapes):
    rows = []
    for M, N, K in shapes:
        choice = op.heuristic_config(M, N, K)
        if choice is not None:
            rows.append(row(M, N, K, choice.kernel, choice.variant, None, "heuristic"))
    return rows


def measured_rows(shapes):
    from mxgemm import toolchain
    arch = toolchain.gpu_arch()
    if arch != "gfx950":
        sys.exit(f"measuring needs a gfx950 GPU (MI355X); found {arch or 'none'}. "
                 "Use --heuristic to write the rule-based rows.")
    rows = []
    for M, N, K in shapes:
        best = min(((time_config(M, N, K, k, v), k, v) for k, v in op.candidates(M, N, K)),
                   key=lambda t: t[0], default=None)
        if best is not None:
            us, kernel, variant = best
            print(f"M={M} N={N} K={K}: {kernel} {variant} {us:.2f} us", flush=True)
            rows.append(row(M, N, K, kernel, variant, us, "measured"))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heuristic", action="store_true", help="write rule-based rows (no GPU needed)")
    p.add_argument("--shapes", nargs="*", help="MxNxK triples (default: the built-in decode shapes)")
    p.add_argument("--out", default=str(op.CONFIG_CSV), help="CSV to write")
    args = p.parse_args(argv)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else default_shapes()
    if args.heuristic:   # in place: timed rows (simulated or measured) stay, the rule's are rewritten
        rows = [r if r["source"] != "heuristic" else heuristic_rows([mnk(r)])[0] for r in tuned.read_rows(args.out)]
        have = {mnk(r) for r in rows}
        rows += heuristic_rows([s for s in shapes if s not in have])
    else:
        rows = measured_rows(shapes)
    tuned.write_rows(rows, args.out, op.CSV_FIELDS)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
