"""python -m mxgemm {info,build,demo,bench,perf,time,tune}

Without a command it prints this help and exits with status 2. An MXGEMM_* variable mxgemm
cannot use, and `build` with an unknown kernel, an arch no selected kernel supports, or a failed
compile print one error message (no traceback) and exit with status 1."""
from __future__ import annotations

import argparse
import sys
import time

from . import env


def cmd_info(args) -> int:
    import mxgemm

    from . import toolchain
    print(f"mxgemm        {mxgemm.__version__}")
    for arch in toolchain.ARCHS:
        try:
            comp = toolchain.find_compiler(arch)
            print(f"compiler      {arch}: {comp.describe()}")
        except toolchain.ToolchainError as e:
            print(f"compiler      {arch}: NOT FOUND ({e})")
    print(f"flydsl        {toolchain.flydsl_version() or 'not installed'}")
    try:   # without ROCm it lives in the cache, which info reports on below
        print(f"ld.lld        {toolchain.ld_lld_dir() / 'llvm' / 'bin' / 'ld.lld'} (ROCM_PATH for FlyDSL)")
    except env.EnvError as e:
        print(f"ld.lld        NOT AVAILABLE ({e})")
    gpu = toolchain.gpu_arch()
    print(f"gpu           {gpu or 'none'}")
    from .launcher import backend_problem, default_backend
    print(f"backend       {default_backend()}  (hip on a ROCm GPU, emu otherwise; MXGEMM_BACKEND forces one)")
    problem = backend_problem()
    if problem:
        print(f"              WARNING: {problem}")
    from .emu.launch import TARGETS
    for t in TARGETS.values():
        print(f"emulator      {t.arch}: wave{t.wave}, {t.lds_bytes // 1024} KiB LDS, wait counters "
              f"{'/'.join(t.counters)}")
    try:
        print(f"cache         {toolchain.cache_dir()}")
    except env.EnvError as e:
        print(f"cache         UNUSABLE ({e})")
    return 0


def artefact_line(a) -> str:
    """One artefact by its registry name (HIP and FlyDSL ports share a symbol), language,
    variant and arch, then its ISA facts."""
    from . import registry
    return (f"{a.kernel:30s} {registry.get(a.kernel).language:6s} {registry.variant_id(a.variant):18s} "
            f"{a.isa().summary()}")


def cmd_build(args) -> int:
    from . import build, launcher, toolchain
    archs = tuple(a for a in args.arch.split(",") if a) if args.arch else None
    kernels = args.kernel.split(",") if args.kernel else None
    t0 = time.perf_counter()
    if args.warm:
        print("building the HIP launcher ...", file=sys.stderr, flush=True)
        launcher.host_ext()
    try:
        arts = build.build(kernels=kernels, archs=archs, jobs=args.jobs)
    except (ValueError, toolchain.ToolchainError) as e:   # bad names, failed compiles: no traceback
        print(f"python -m mxgemm build: error: {e}", file=sys.stderr)
        return 1
    if args.verbose:
        from . import specs
        served = {k for s in specs.SPECS if s.serves for k in s.kernels}   # specs naming more than their ops
        for a in arts:
            print(artefact_line(a))
            if a.kernel in served:
                print(f"{'':30s}   serves: {specs.spec_of_kernel(a.kernel).served_by(a.kernel, a.variant)}")
    n_new = build.build.last_compiled
    print(f"{len(arts)} artefacts of {len({a.kernel for a in arts})} kernels ready: {n_new} compiled, "
          f"{len(arts) - n_new} cached, {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_demo(args) -> int:
    from . import build, launcher
    cmd_info(args)
    problem = launcher.backend_problem()
    if problem:   # every demo would fail on it: one error instead
        raise env.EnvError(problem)
    print("\nbuilt kernels:")
    for a in build.build(progress=False):
        print("  " + artefact_line(a))
    from .tools.demo import run_demos
    print()
    return run_demos()


def cmd_bench(args) -> int:
    from .tools import bench
    return bench.main(args.what)


def cmd_perf(args) -> int:
    from .tools import perf
    return perf.main(args.rest)   # perf parses its own options (python -m mxgemm perf --help)


def cmd_time(args) -> int:
    from .timing import cli
    return cli.main(args.rest)   # time parses its own options (python -m mxgemm time --help)


def cmd_tune(args) -> int:
    from .timing import tune
    return tune.main(args.rest)   # tune parses its own options (python -m mxgemm tune --help)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxgemm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, compiler, backend, cache dir").set_defaults(fn=cmd_info)
    b = sub.add_parser("build", help="compile registered kernels (content-hash cached)")
    b.add_argument("--arch", help="comma list, e.g. gfx950,gfx1250 (default: every kernel's archs)")
    b.add_argument("--kernel", help="comma list of registry names (default: all)")
    b.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    b.add_argument("--warm", action="store_true", help="install-time warm-up: host extension + every kernel")
    b.add_argument("-v", "--verbose", action="store_true", help="print ISA facts of each artefact")
    b.set_defaults(fn=cmd_build)
    sub.add_parser("demo", help="build, then run sample ops on the default backend").set_defaults(fn=cmd_demo)
    be = sub.add_parser("bench", help="benchmarks that print numbers")
    be.add_argument("what", choices=["dispatch", "host", "emu"], help="what to measure")
    be.set_defaults(fn=cmd_bench)
    sub.add_parser("perf", help="performance model: roofline + hot-loop analysis (perf --help)",
                   add_help=False).set_defaults(fn=cmd_perf)
    sub.add_parser("time", help="timing model: a kernel's simulated MI355X time and hot blocks (time --help)",
                   add_help=False).set_defaults(fn=cmd_time)
    sub.add_parser("tune", help="autotuner on the timing model: tuned CSV rows with the peer's time (tune --help)",
                   add_help=False).set_defaults(fn=cmd_tune)
    args, rest = p.parse_known_args(argv)
    if rest and args.cmd not in ("perf", "time", "tune"):
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    if args.cmd is None:          # bare `python -m mxgemm`: the help, as a usage error (exit 2)
        p.print_help()
        return 2
    try:
        return args.fn(args)
    except env.EnvError as e:     # a variable's value mxgemm cannot use: name it, no traceback
        print(f"python -m mxgemm {args.cmd}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
