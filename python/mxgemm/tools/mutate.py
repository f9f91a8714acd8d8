"""Mutation harness: apply each catalogued mutation to a temporary copy of the repo, run the
targeted kernels' tests there, report which test caught it (or SURVIVED).

The working tree is never touched. Every run gets one temporary root holding the repo copy
(re-copied per mutation) and an MXGEMM_CACHE_DIR seeded with the user's kernel artefacts: they
are keyed by a hash of their sources, so unmutated kernels are reused and mutated ones rebuilt.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import toolchain
from ..registry import source_root
from .mutations import ALL, CATALOGUE, Mutation

COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", ".pytest_cache")


class SnippetError(Exception):
    """A catalogue entry's original snippet is missing or ambiguous in its file."""


def apply(m: Mutation, root: Path) -> None:
    """Apply m's edits to the tree at root; SnippetError unless each original occurs exactly once."""
    for rel, original, replacement in m.edits:
        path = root / rel
        text = path.read_text() if path.is_file() else ""
        n = text.count(original)
        if n != 1:
            raise SnippetError(f"{m.name}: {rel}: original snippet found {n} times (need exactly 1): "
                               f"{original[:70]!r}")
        path.write_text(text.replace(original, replacement))


def select(kernel: str | None = None, sample: int | None = None, names: str | None = None) -> list:
    """Catalogue entries targeting kernel (emulator entries target every kernel) or named
    (comma-separated); sample N: N entries evenly spaced over the catalogue order."""
    wanted = set(names.split(",")) if names else None
    unknown = wanted - {m.name for m in CATALOGUE} if wanted else set()
    if unknown:
        raise SystemExit(f"unknown mutations {sorted(unknown)}; see --list")
    chosen = [m for m in CATALOGUE if (kernel is None or m.kernels == ALL or kernel in m.kernels)
              and (wanted is None or m.name in wanted)]
    if sample and sample < len(chosen):
        chosen = [chosen[i * len(chosen) // sample] for i in range(sample)]
    return chosen


FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def run_one(m: Mutation, work: Path, cache: Path, timeout: float) -> str:
    """'caught by <test>', 'SURVIVED', 'TIMEOUT' or 'HARNESS ERROR: ...'."""
    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(source_root(), repo, ignore=COPY_IGNORE)
    try:
        apply(m, repo)
    except SnippetError as e:
        return f"HARNESS ERROR: {e}"
    env = {**os.environ, "MXGEMM_CACHE_DIR": str(cache), "PYTHONPATH": str(repo / "python")}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", "-n", "0", *m.tests()]
    try:
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "TIMEOUT"
    if p.returncode == 0:
        return "SURVIVED"
    hit = FAILED.search(p.stdout)
    if hit:
        return f"caught by {hit.group(1)}"
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    return "HARNESS ERROR: pytest exited %d without a failing test: %s" % (p.returncode, " | ".join(tail))


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m mxgemm.tools mutate", description=__doc__.splitlines()[0])
    p.add_argument("--kernel", help="only mutations targeting this registry kernel")
    p.add_argument("--list", action="store_true", help="list the selected mutations and exit")
    p.add_argument("--sample", type=int, help="run N mutations evenly spaced over the catalogue")
    p.add_argument("--name", help="only these mutations (comma-separated)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per mutation")
    args = p.parse_args(argv)
    chosen = select(args.kernel, args.sample, args.name)
    if args.list:
        for m in chosen:
            print(f"{m.name:34s} {','.join(m.kernels):60s} {m.what}")
        return 0
    bad = 0
    with tempfile.TemporaryDirectory(prefix="mxgemm-mutate-") as tmp:
        work, cache = Path(tmp), Path(tmp) / "cache"
        # Kernel artefacts only: the host extension is rebuilt for the copy's source path (and a
        # copied build lock of a concurrent build would never be released).
        shutil.copytree(toolchain.cache_dir(), cache, ignore=shutil.ignore_patterns("host_ext", "*lock"))
        for m in chosen:
            t0 = time.perf_counter()
            verdict = run_one(m, work, cache, args.timeout)
            bad += not verdict.startswith("caught")
            print(f"{m.name:34s} {verdict}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} mutations caught")
    return 1 if bad else 0
