"""Performance model of every registered kernel: ``python -m mxgemm perf``.

Nobody here can time an MI355X, so this is a model, and says so. Per (kernel, variant, shape):
FLOPs, compulsory bytes (inputs once, output once; atomics read and write it), arithmetic
intensity and the roofline time from ``asm_facts.LIMITS`` (docs/perf_model.md §1); the launch shape
(workgroups, resident workgroups per CU from the kernel's registers and LDS, the waves of
workgroups and how full the last one is); the hot loop read from the kernel's own assembly
(``asm_facts.loop_profile``: instructions per iteration by the emulator's classes, MFMA cycles from
``asm_facts.mfma_cycles``, other issue cycles, global and LDS bytes, waits); and a predicted time with
the factor that limits it (docs/perf_model.md §3). Published numbers of the peers are facts
of their sources, printed beside the model, never derived from it.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import torch

from .. import asm_facts, registry, specs
from ..specs import SMALL_PRESET, Case
from ..specs.base import waves


@lru_cache(maxsize=1)
def _llvm_mca() -> str | None:
    """An llvm-mca of LLVM 22 or newer on PATH (older ones have no gfx950 model), else None."""
    for name in ("llvm-mca", "llvm-mca-24", "llvm-mca-23", "llvm-mca-22"):
        exe = shutil.which(name)
        if exe:
            ver = re.search(r"version (\d+)", subprocess.run([exe, "--version"], capture_output=True, text=True).stdout)
            if ver and int(ver.group(1)) >= 22:
                return exe
    return None


def llvm_mca_cycles(body: list[str], arch: str = "gfx950") -> str:
    """llvm-mca's cycle estimate of one loop iteration (its back-edge branch left out)."""
    exe = _llvm_mca()
    if exe is None:
        return "no llvm-mca"
    p = subprocess.run([exe, "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={arch}", "--iterations=1"],
                       input="\n".join(l for l in body if not l.startswith("s_cbranch")), capture_output=True,
                       text=True)
    total = re.search(r"Total Cycles:\s+(\d+)", p.stdout)
    return total.group(1) if total else "llvm-mca failed"


# ---- the model ----
def predict(case: Case, arch: str = "gfx950", mca: bool = True) -> dict:
    """One row of the model (see the module docstring); docs/perf_model.md §3 gives the rules."""
    lim = asm_facts.LIMITS[arch]
    from ..build import artifact
    art = artifact(case.kernel, case.variant, arch)
    info = art.isa()
    kern = registry.get(case.kernel)
    loop = asm_facts.loop_profile(art.asm, art.symbol, arch)
    w = specs.work(case)
    clock = lim["clock_ghz"] * 1e9
    peak = lim["peak_tflops"][w.rate] * 1e12
    t_flops, t_mem = w.flops / peak, w.bytes / (lim["hbm_tbps"] * 1e12)
    t_roof = max(t_flops, t_mem)

    waves_per_wg = waves(case.kernel, case.variant, arch)
    occ = info.occupancy(kern.threads_for(arch, case.variant))                # waves per SIMD
    wgs_per_cu = max(1, occ * lim["simds_per_cu"] // waves_per_wg)
    slots = lim["cus"] * wgs_per_cu
    rounds = max(1, -(-w.live_wgs // slots))
    busy_last = (w.live_wgs - (rounds - 1) * slots) / slots      # fraction of the machine in the last round
    # per CU and round: the MFMA units and issue slots are shared by its resident waves; a wave's
    # iteration waits one memory round trip (a loop that drains vmcnt(0) cannot overlap two)
    resident = min(wgs_per_cu, max(1, -(-w.live_wgs // lim["cus"])))
    per_round_iters = w.wave_iterations / max(1, w.live_wgs) * resident   # wave-iterations on one CU
    t_mfma = rounds * per_round_iters * loop.mfma_cycles / lim["simds_per_cu"] / clock
    t_issue = rounds * per_round_iters * loop.issue_cycles / lim["simds_per_cu"] / clock
    depth = 1 if loop.drains_vm else 2
    t_lat = rounds * w.serial_iterations * lim["mem_latency_ns"] * 1e-9 / depth if loop.global_bytes else 0.0
    terms = {"memory": t_mem, "MFMA issue": t_mfma, "instruction issue": t_issue, "latency/occupancy": t_lat}
    limit = max(terms, key=terms.get)
    t_pred = max(terms.values())
    if limit != "memory" and rounds > 1 and busy_last < 0.5:
        limit = "tail"                         # a mostly idle last round of workgroups dominates
    return dict(
        kernel=case.kernel, variant=registry.variant_id(case.variant), case=case.label,
        flops=w.flops, bytes=w.bytes, ai=w.flops / w.bytes if w.bytes else 0.0, rate=w.rate,
        roofline_us=t_roof * 1e6, grid="x".join(map(str, w.grid)), workgroups=w.live_wgs,
        waves_per_simd=occ, wgs_per_cu=wgs_per_cu, rounds=rounds, last_round_busy=round(busy_last, 3),
        loop_counts=dict(loop.counts), loop_mfma_cycles=loop.mfma_cycles, loop_issue_cycles=loop.issue_cycles,
        loop_global_bytes=loop.global_bytes, loop_lds_bytes=loop.lds_bytes, loop_waits=loop.waits,
        hot_loop="loop" if loop.in_loop else "no loop (whole body)",
        llvm_mca=llvm_mca_cycles(loop.lines, arch) if mca else "not run",
        mfma_us=t_mfma * 1e6, issue_us=t_issue * 1e6, latency_us=t_lat * 1e6, memory_us=t_mem * 1e6,
        predicted_us=t_pred * 1e6, roofline_fraction=t_roof / t_pred if t_pred else 0.0, limit=limit,
        published=case.published, source=case.source)


def modelled_cases(preset_names, note=print) -> list[Case]:
    """The presets' cases whose kernel is registered and modelled; a note names each one skipped."""
    cases = []
    for name in preset_names:
        for case in specs.presets()[name]():
            if case.kernel not in registry.KERNELS:
                note(f"note: kernel {case.kernel!r} ({case.label}) is not in the registry yet: skipped")
                continue
            cases.append(case)
    return cases


# ---- output ----
_COLUMNS = (("kernel", "{}"), ("variant", "{}"), ("case", "{}"), ("ai", "{:.1f}"), ("roofline_us", "{:.2f}"),
            ("predicted_us", "{:.2f}"), ("roofline_fraction", "{:.2f}"), ("limit", "{}"), ("grid", "{}"),
            ("waves_per_simd", "{}"), ("rounds", "{}"), ("loop_mfma_cycles", "{:.0f}"),
            ("loop_issue_cycles", "{:.0f}"), ("loop_global_bytes", "{}"), ("loop_lds_bytes", "{}"),
            ("loop_waits", "{}"), ("llvm_mca", "{}"), ("published", "{}"), ("source", "{}"))
_HEAD = dict(roofline_us="roof_us", predicted_us="model_us", roofline_fraction="of_roof", waves_per_simd="w/SIMD",
             loop_mfma_cycles="mfma_cyc", loop_issue_cycles="issue_cyc", loop_global_bytes="glob_B",
             loop_lds_bytes="lds_B", loop_waits="waits")


_MEASURED = (("measured_us", "{:.2f}"), ("model_over_measured", "{:.2f}"))


def table(rows) -> str:
    cols = _COLUMNS + (_MEASURED if rows and "measured_us" in rows[0] else ())
    cells = [[fmt.format(r[c]) for c, fmt in cols] for r in rows]
    heads = [_HEAD.get(c, c) for c, _ in cols]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(heads)] + [line(c) for c in cells])


def csv_text(rows) -> str:
    import csv
    import io
    buf = io.StringIO()
    cols = [c for c in rows[0] if c != "loop_counts"] if rows else []
    wr = csv.DictWriter(buf, cols, extrasaction="ignore")
    wr.writeheader()
    wr.writerows(rows)
    return buf.getvalue()


def plot(rows, path, arch="gfx950"):
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib, which is not installed (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lim = asm_facts.LIMITS[arch]
    bw = lim["hbm_tbps"] * 1e12
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [10 ** (i / 10) for i in range(-10, 50)]
    for rate, peak in lim["peak_tflops"].items():
        ax.plot(xs, [min(peak * 1e12, bw * x) / 1e12 for x in xs], lw=1, label=f"roof {rate}")
    for kernel in sorted({r["kernel"] for r in rows}):
        pts = [r for r in rows if r["kernel"] == kernel and r["ai"] > 0]
        ax.scatter([r["ai"] for r in pts], [r["flops"] / r["predicted_us"] / 1e6 for r in pts], s=12,
                   label=kernel if pts else f"{kernel} (0 FLOP: no point on a FLOP roofline)")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / compulsory byte)",
           ylabel="predicted TFLOP/s", title=f"mxgemm perf model on {lim['name']} ({arch})")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)


# ---- timing a case on the GPU ----
def measure_us(fn, calls: int = 20, replays: int = 20) -> float:
    """Microseconds per call on the GPU: ``calls`` calls captured in one graph (hipGraph through
    torch.cuda.CUDAGraph), replayed ``replays`` times between two events. Operands stay in the
    caches between calls (no rotation), so memory-bound cases run faster than from HBM."""
    fn()                                   # plan, compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def measure(cases, rows) -> None:
    """Adds measured_us and model/measured to each row; refuses without a gfx950 GPU."""
    from .. import toolchain
    gpu = toolchain.gpu_arch()
    if gpu != "gfx950":
        raise RuntimeError(f"--measure needs a gfx950 GPU (ROCm torch); this machine has {gpu or 'no GPU'}")
    for case, row in zip(cases, rows):
        row["measured_us"] = measure_us(specs.op_call(case, "cuda"))
        row["model_over_measured"] = row["predicted_us"] / row["measured_us"]


def main(argv) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m mxgemm perf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="all",
                   help=f"comma list of {sorted(specs.presets())} or 'all' (every preset but '{SMALL_PRESET}')")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV ('-': stdout instead of the table)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON ('-': stdout instead of the table)")
    p.add_argument("--plot", metavar="FILE.png", help="roofline chart with every case's predicted point")
    p.add_argument("--measure", action="store_true", help="time the cases on a gfx950 GPU and print model vs measured")
    p.add_argument("--no-mca", action="store_true", help="skip llvm-mca even when it is on PATH")
    args = p.parse_args(argv)
    presets = specs.presets()
    names = [n for n in presets if n != SMALL_PRESET] if args.preset == "all" else args.preset.split(",")
    unknown = [n for n in names if n not in presets]
    if unknown:
        print(f"python -m mxgemm perf: error: unknown preset {unknown[0]!r}; known: {sorted(presets)}", file=sys.stderr)
        return 1
    cases = modelled_cases(names, note=lambda s: print(s, file=sys.stderr))
    rows = [predict(c, mca=not args.no_mca) for c in cases]
    if args.measure:
        try:
            measure(cases, rows)
        except RuntimeError as e:
            print(f"python -m mxgemm perf: {e}", file=sys.stderr)
            return 1
    to_stdout = False
    if args.csv:
        text = csv_text(rows)
        to_stdout |= args.csv == "-"
        sys.stdout.write(text) if args.csv == "-" else Path(args.csv).write_text(text)
    if args.json:
        text = json.dumps(rows, indent=1)
        to_stdout |= args.json == "-"
        print(text) if args.json == "-" else Path(args.json).write_text(text)
    if args.plot:
        try:
            plot(rows, args.plot)
        except RuntimeError as e:
            print(f"python -m mxgemm perf: error: {e}", file=sys.stderr)
            return 1
    if not to_stdout:
        print(table(rows))
    return 0
