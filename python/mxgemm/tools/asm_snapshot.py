"""Assembly snapshots: a refactor of kernel source must leave every code object's assembly as it
was, or change it only where a test proves the output did not. ``save`` writes the assembly of
every built (kernel, variant, arch) into a folder; ``compare`` rebuilds and names each one that
differs from the folder's.

    python -m mxgemm.tools asm save DIR [--kernel NAME,...]
    python -m mxgemm.tools asm compare DIR [--kernel NAME,...]
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import build, registry


def _artefacts(kernels):
    names = kernels or list(registry.KERNELS)
    for name, variant, arch in build.plan(names):
        yield f"{name}.{arch}.{registry.variant_id(variant)}.s", (name, variant, arch)


def save(folder: Path, kernels=None, out=print) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for file, (name, variant, arch) in _artefacts(kernels):
        (folder / file).write_text(build.artifact(name, variant, arch).asm)
        n += 1
        out(f"\r{n} saved ({name} {arch})", end="")
    out(f"\r{n} code objects' assembly saved in {folder}")
    return 0


def compare(folder: Path, kernels=None, out=print) -> list:
    """The artefacts whose assembly differs from (or is missing in) ``folder``."""
    differ = []
    for file, (name, variant, arch) in _artefacts(kernels):
        saved = folder / file
        if not saved.is_file() or saved.read_text() != build.artifact(name, variant, arch).asm:
            differ.append(file)
            out(f"differs: {file}")
    return differ


def main(argv) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m mxgemm.tools asm", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("save", "compare"))
    p.add_argument("folder", type=Path)
    p.add_argument("--kernel", help="comma list of registry names (default: all)")
    args = p.parse_args(argv)
    kernels = args.kernel.split(",") if args.kernel else None
    if args.action == "save":
        return save(args.folder, kernels, out=lambda s, end="\n": print(s, end=end, file=sys.stderr, flush=True))
    differ = compare(args.folder, kernels)
    print(f"{len(differ)} code objects differ" if differ else "every code object's assembly is as saved")
    return 1 if differ else 0
