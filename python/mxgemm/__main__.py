"""python -m mxgemm {info,build,demo,bench}"""
from __future__ import annotations

import argparse
import sys
import time


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
    print(f"ld.lld        {toolchain.ld_lld_dir() / 'llvm' / 'bin' / 'ld.lld'} (ROCM_PATH for FlyDSL)")
    gpu = toolchain.gpu_arch()
    print(f"gpu           {gpu or 'none'}")
    from .launcher import default_backend
    print(f"backend       {default_backend()}  (hip on a ROCm GPU, emu otherwise; MXGEMM_BACKEND forces one)")
    print(f"cache         {toolchain.cache_dir()}")
    return 0


def cmd_build(args) -> int:
    from . import build, launcher, registry
    archs = tuple(a for a in args.arch.split(",") if a) if args.arch else None
    kernels = args.kernel.split(",") if args.kernel else None
    t0 = time.perf_counter()
    if args.warm and launcher.hip_available():
        print("building the HIP launcher ...", file=sys.stderr, flush=True)
        launcher.host_ext()
    arts = build.build(kernels=kernels, archs=archs, jobs=args.jobs, default_only=args.warm)
    if args.verbose:
        for a in arts:
            print(f"{registry.variant_id(a.variant):>20}  {a.isa().summary()}")
    print(f"{len(arts)} artefacts ready in {time.perf_counter() - t0:.2f} s "
          f"({build.build.last_compiled} compiled)")
    return 0


def cmd_demo(args) -> int:
    from . import build, registry
    cmd_info(args)
    print("\nbuilt kernels:")
    for a in build.build(progress=False):
        print(f"  {a.kernel:32s} {registry.variant_id(a.variant):18s} {a.isa().summary()}")
    from .demo import run_demos
    print()
    return run_demos()


def cmd_bench(args) -> int:
    from . import bench
    return bench.main(args.what)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxgemm", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, compiler, backend, cache dir").set_defaults(fn=cmd_info)
    b = sub.add_parser("build", help="compile registered kernels (content-hash cached)")
    b.add_argument("--arch", help="comma list, e.g. gfx950,gfx1250 (default: every kernel's archs)")
    b.add_argument("--kernel", help="comma list of registry names (default: all)")
    b.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    b.add_argument("--warm", action="store_true", help="install-time warm-up: host extension + default set")
    b.add_argument("-v", "--verbose", action="store_true", help="print ISA facts of each artefact")
    b.set_defaults(fn=cmd_build)
    sub.add_parser("demo", help="build, then run sample ops on the default backend").set_defaults(fn=cmd_demo)
    be = sub.add_parser("bench", help="benchmarks that print numbers")
    be.add_argument("what", choices=["dispatch", "emu"], help="what to measure")
    be.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
