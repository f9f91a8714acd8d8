"""`python -m mxgemm time`: a kernel of the registry timed on the model at a shape of its perf
presets, with the basic blocks its cycles went to (without a kernel: a row per case of the
preset, simulated time beside the roofline); grids of more than 3 rounds of workgroups on XCD 0
are sampled (``--rounds``, docs/timing_model.md §3); `--calibrate`: the calibration kernels
(mxgemm.calibration) timed at M = N = K = 4096 (and 8192 where the blog publishes it) beside
their published MI355X results.

`--vs-peers FAMILY[,FAMILY]`: our kernels beside the peer users run today, same model, same run, on
the family's cells (mxgemm.timing.peers: smallm, ...).

`--revisions OLD,NEW`: the case's launch with the kernel built from each git revision, same inputs, same
run (mxgemm.timing.revisions); `--shape groups=8,m=256,...` replaces the case's shape (the op then picks
the variant).

In the calibration each stage runs the first two rounds of workgroups XCD 0 receives (sampled; the rest of its share
extrapolated) at two small K, and the time is extrapolated linearly in K to the full K (the K loop is
the steady state of these kernels)."""
from __future__ import annotations

import dataclasses
import sys
import time

import torch

from .. import calibration
from ..emu import Emulator
from . import round_workgroups, xcd0_sample


def stage_time(stage, M, N, K, machine="mi355x"):
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    prog = emu.load(calibration.assembly())
    g = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn)
    c = torch.zeros(M, N, dtype=torch.bfloat16)
    grid = (N // stage.tile[1], M // stage.tile[0], 1)
    block = (*stage.block, 1)
    emu.launch(prog, stage.symbol, grid=grid, block=block, args=[a, b, c, M, N, K],
               workgroups=xcd0_sample(grid, 2 * round_workgroups(machine, prog, stage.symbol, block, 0), machine))
    return emu.last_timing


def calibrate(out=None, stages=None):
    """Predicted vs published TFLOP/s of each stage (``stages``: their symbols; None: all) at every
    size the blog publishes it: M = N = K = 4096, and 8192 where given."""
    out = out or sys.stdout      # the stream at call time (a test's capture)
    unknown = set(stages or ()) - set(calibration.STAGES)
    if unknown:
        raise ValueError(f"unknown calibration stages {sorted(unknown)}; known: {list(calibration.STAGES)}")
    print(f"{'stage':26s} {'size':>5s} {'published':>10s} {'predicted':>10s} {'error':>7s}  limiter  (TFLOP/s)",
          file=out)
    rows = []
    for stage in calibration.STAGES.values():
        if stages and stage.symbol not in stages:
            continue
        for n, published in ((4096, stage.tflops_4096), (8192, stage.tflops_8192)):
            if published is None:
                continue
            t0 = time.time()
            ks = (64, 128) if stage.block == (16, 16) else (256, 512)
            t = [stage_time(stage, n, n, k) for k in ks]
            us = t[0]["us"] + (t[1]["us"] - t[0]["us"]) * (n - ks[0]) / (ks[1] - ks[0])
            tf = 2 * n ** 3 / (us * 1e-6) / 1e12
            err = (tf - published) / published
            rows.append((stage.symbol, n, published, tf, err, t[1]["limiter"]))
            print(f"{stage.symbol:26s} {n:5d} {published:10.1f} {tf:10.1f} {100 * err:+6.0f}%  {t[1]['limiter']:8s}"
                  f" ({time.time() - t0:.0f} s)", file=out, flush=True)
    mean = sum(abs(r[4]) for r in rows) / len(rows)
    print(f"mean |error| {100 * mean:.0f}%", file=out)
    return rows


def time_case(case, machine="mi355x", rounds=None) -> list:
    """(symbol, timing) of each launch of ``case`` (an mxgemm.specs.Case) through its public op."""
    from .. import launcher, specs
    call = specs.op_call(case)
    with launcher.emulator_settings(timing=machine, timing_rounds=rounds or None, race_check=False):
        call()
        return launcher.timings()


def report(symbol, t, top=8, out=None) -> None:
    out = out or sys.stdout      # the stream at call time (a test's capture)
    b = t["breakdown"]
    busy = " ".join(f"{k} {100 * v:.0f}%" for k, v in b["busy"].items())
    print(f"{symbol}: {t['us']:.2f} us ({t['cycles']:.0f} cycles at {t['clock_ghz']} GHz), limiter {t['limiter']}"
          f"{', sampled' if t['sampled'] else ''}; {b['workgroups_simulated']} of XCD 0's {b['workgroups_per_xcd']}"
          f" workgroups simulated, {b['occupancy_workgroups_per_cu']} per CU", file=out)
    print(f"  busy: {busy}; bytes: " + " ".join(f"{k} {v / 1e6:.2f} MB" for k, v in b["bytes"].items()), file=out)
    print(f"  {'block':24s} {'pcs':>9s} {'issued':>9s} {'cycles':>11s}  stalls (cycles)", file=out)
    for blk in b["blocks"][:top]:
        st = " ".join(f"{k} {v:.0f}" for k, v in sorted(blk["stalls"].items(), key=lambda kv: -kv[1]))
        where = f"{blk['first']:4d}-{blk['last']:<4d}"
        print(f"  {blk['block']:24s} {where} {blk['issued']:9d} {blk['cycles']:11.0f}  {st}", file=out)


def table(cases, rounds=None, out=None) -> list:
    """A row per case: simulated us (launches summed), the roofline us beside it (mxgemm.tools.perf's
    work model: compulsory bytes and FLOPs at peak), and the longest launch's limiter."""
    out = out or sys.stdout      # the stream at call time (a test's capture)
    from .. import asm_facts, specs
    lim = asm_facts.LIMITS["gfx950"]
    print(f"{'kernel':30s} {'case':34s} {'sim_us':>8s} {'roof_us':>8s} {'of_roof':>7s}  limiter  sampled", file=out)
    rows = []
    for case in cases:
        w = specs.work(case)
        roof = max(w.flops / (lim["peak_tflops"][w.rate] * 1e12), w.bytes / (lim["hbm_tbps"] * 1e12)) * 1e6
        ts = time_case(case, rounds=rounds)
        us = sum(t["us"] for _, t in ts)
        top = max(ts, key=lambda st: st[1]["us"])[1]
        rows.append(dict(kernel=case.kernel, case=case.label, sim_us=us, roofline_us=roof, limiter=top["limiter"],
                         sampled=any(t["sampled"] for _, t in ts)))
        print(f"{case.kernel:30s} {case.label[:34]:34s} {us:8.2f} {roof:8.2f} {roof / us:7.2f}  {top['limiter']:8s} "
              f"{'yes' if rows[-1]['sampled'] else 'no'}", file=out, flush=True)
    return rows


def revision_table(case, revs, rounds, out=None) -> list:
    """The case's launch timed with its kernel built from each of ``revs`` (the first the baseline):
    a row per revision, us, ratio to the first, limiter."""
    out = out or sys.stdout      # the stream at call time (a test's capture)
    from .. import specs
    from . import revisions
    call = specs.spec_of_kernel(case.kernel).call(case.kernel, case.variant, case.shape, specs.Inputs("bytes", "cpu"))
    t0 = time.time()
    _, rows = revisions.time_revisions(call, revs, rounds)
    base = rows[0][1]["us"]
    for rev, (c, t) in zip(revs, rows):
        print(f"  {rev:>12s} {c[:10]}  {t['us']:9.2f} us  x{t['us'] / base:.3f}  limiter {t['limiter']}"
              f"{', sampled' if t['sampled'] else ''}", file=out)
    print(f"  ({time.time() - t0:.0f} s)", file=out, flush=True)
    return rows


def main(argv) -> int:
    import argparse

    from .. import specs
    from ..tools import perf
    presets = specs.presets()
    p = argparse.ArgumentParser(prog="python -m mxgemm time", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", nargs="?", help="registry name (its first case in --preset); none: a row per case")
    p.add_argument("--preset", default=specs.SMALL_PRESET, help=f"a preset of mxgemm.specs: {sorted(presets)}")
    p.add_argument("--case", help="the case whose label contains this text")
    p.add_argument("--rounds", type=int, default=3,
                   help="simulate ROUNDS rounds of XCD 0's workgroups: its first and one per stratum of the rest "
                        "(mxgemm.timing.rounds_sample; default 3); 0: the whole grid")
    p.add_argument("--revisions", help="comma-separated git revisions: time the kernel built from each")
    p.add_argument("--shape", help="the case's shape instead, as name=value,... (the op picks the variant)")
    p.add_argument("--blocks", type=int, default=8, help="hottest basic blocks to print")
    p.add_argument("--calibrate", action="store_true", help="the calibration table (over an hour on 2 cores)")
    p.add_argument("--stages", help="with --calibrate: only these stages (comma-separated symbols)")
    p.add_argument("--vs-peers", metavar="FAMILIES",
                   help="comma-separated peer families (mxgemm.timing.peers.FAMILIES): ours vs the peer, same run")
    args = p.parse_args(argv)
    if args.calibrate:
        calibrate(stages=args.stages.split(",") if args.stages else None)
        return 0
    if args.vs_peers:
        from . import peers
        return peers.main(args.vs_peers)
    if args.preset not in presets:
        p.error(f"unknown preset {args.preset!r}; known: {sorted(presets)}")
    if args.kernel is None:
        table(perf.modelled_cases([args.preset], note=lambda s: print(s, file=sys.stderr)), args.rounds)
        return 0
    cases = [c for c in presets[args.preset]() if c.kernel == args.kernel and (args.case or "") in c.label]
    if not cases:
        print(f"python -m mxgemm time: no case of kernel {args.kernel!r} in preset {args.preset!r}", file=sys.stderr)
        return 1
    case = cases[0]
    if args.shape:
        case = dataclasses.replace(case, shape={k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))})
    print(f"{case.kernel} {case.variant} {case.label}: {case.shape}")
    if args.revisions:
        revision_table(case, args.revisions.split(","), args.rounds)
        return 0
    for symbol, t in time_case(case, rounds=args.rounds):
        report(symbol, t, args.blocks)
    return 0
