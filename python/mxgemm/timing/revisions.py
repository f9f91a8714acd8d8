"""A kernel as it was at other git revisions, timed beside itself on today's model: the before
and after of a kernel change (docs/timing_model.md §5, "Kernel changes, before and after").

A revision's kernel is its FlyDSL source compiled with the revision's sibling kernel files
(ir_builder) by today's FlyDSL driver, and launched with the revision's own argument list
(its registry's ``args``). The arguments' values come from today's op, recorded for the case
without running it: each revision takes the names it knows (an argument added later, such as
a stride that is 0 for the old behaviour, is dropped for the older kernel). Both revisions run
the same inputs, grid and workgroup size, sampled the same way (``rounds``)."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from unittest import mock

from .. import build, launcher, registry, toolchain

SOURCES = "flydsl_kernels"


def _git(*args) -> bytes:
    return subprocess.run(["git", "-C", str(registry.source_root()), *args], check=True, capture_output=True).stdout


@functools.lru_cache(maxsize=None)
def commit(rev: str) -> str:
    """The full commit id of ``rev``."""
    return _git("rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()


@functools.lru_cache(maxsize=None)
def kernel_at(rev: str, name: str) -> registry.Kernel:
    """Kernel ``name`` of the registry at ``rev`` (its own args, variants, grid), its source
    path inside the revision's kernel files (extracted once under the build cache)."""
    c = commit(rev)
    src = _git("show", f"{c}:python/mxgemm/registry.py")
    spec = importlib.util.spec_from_loader(f"_mxgemm_registry_{c[:12]}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses resolve annotations through sys.modules
    exec(compile(src, f"{c[:12]}:python/mxgemm/registry.py", "exec"), mod.__dict__)
    old = mod.KERNELS.get(name) or _renamed(c, name, mod.KERNELS)
    if old.language != "flydsl":
        raise ValueError(f"{name}: only FlyDSL kernels are built from other revisions (it is {old.language})")
    fields = {f: getattr(old, f) for f in registry.Kernel.__dataclass_fields__ if hasattr(old, f)}
    return registry.Kernel(**dict(fields, source=str(_sources(c) / Path(old.source).name)))


def _renamed(c: str, name: str, kernels: dict) -> registry.Kernel:
    """The kernel at commit ``c`` whose source became today's source of ``name``, following the
    file's renames since ``c`` one commit at a time (a kernel renamed keeps its file's history)."""
    path = today = registry.get(name).source
    log = _git("log", "--follow", "--diff-filter=R", "--name-status", "--format=", f"{c}..HEAD", "--", today)
    for line in log.decode().splitlines():        # newest rename first
        status, *paths = line.split("\t") if line else ("",)
        if status.startswith("R") and paths[1] == path:
            path = paths[0]
    found = [k for k in kernels.values() if k.source == path]
    if not found:
        raise KeyError(f"{name} has no kernel at {c[:12]} (its source {today} was {path} there)")
    return found[0]


def _sources(c: str) -> Path:
    """The revision's flydsl_kernels/ directory, extracted once (into a scratch directory, then
    renamed: a concurrent run never sees half a tree)."""
    d = Path(toolchain.cache_dir()) / "revisions" / c / SOURCES
    if not d.is_dir():
        d.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=d.parent) as tmp:
            tarfile.open(fileobj=io.BytesIO(_git("archive", c, SOURCES))).extractall(tmp, filter="data")
            try:
                os.rename(Path(tmp) / SOURCES, d)
            except OSError:
                if not d.is_dir():
                    raise
    return d


def artifact(rev: str, name: str, variant: dict, arch: str = "gfx950") -> build.Artifact:
    """Kernel ``name``'s ``variant`` as compiled from revision ``rev``'s sources (cached)."""
    k = kernel_at(rev, name)
    if variant not in k.variants_for(arch):
        raise ValueError(f"{name} at {rev} has no {arch} variant {variant}")
    c = commit(rev)
    key = hashlib.sha256(repr((c, Path(build.__file__).with_name("flydsl_build.py").read_bytes(),
                               toolchain.flydsl_version(), arch,
                               sorted(variant.items()))).encode()).hexdigest()[:20]
    d = Path(toolchain.cache_dir()) / "revisions" / c / arch / name
    art = build.Artifact(name, dict(variant), arch, d / f"{registry.variant_id(variant)}-{key}.s",
                         d / f"{registry.variant_id(variant)}-{key}.hsaco", key)
    if not art.asm_path.exists():
        from ..flydsl_build import compile_flydsl
        compile_flydsl(Path(k.source), arch, variant, art.asm_path, art.hsaco_path, k.symbol)
    return art


def recorded_launch(call) -> tuple:
    """(kernel, variant, grid, block, {argument name: value}) of the one launch ``call`` (an
    mxgemm.specs Call) makes through today's op, recorded instead of run."""
    got = []
    with mock.patch.object(launcher, "launch", lambda art, grid, block, args, *a, **kw: got.append(
            (art, grid, block, args))), launcher.emulator_settings():
        call()
    if len(got) != 1:
        raise ValueError(f"expected one launch, the call made {len(got)}")
    art, grid, block, args = got[0]
    return art.kernel, art.variant, grid, block, dict(zip(registry.get(art.kernel).args, args))


def time_revisions(call, revs, rounds=3, machine="mi355x") -> tuple:
    """(the launch's arguments by name, [(commit, timing) per revision of ``revs``]): the launch
    ``call`` makes, its kernel built from each revision in turn; same inputs, grid and sampling
    for all (the output tensor holds the last revision's result)."""
    name, variant, grid, block, values = recorded_launch(call)
    out = []
    for rev in revs:
        art = artifact(rev, name, variant)
        args = kernel_at(rev, name).ordered_args(**values)
        with launcher.emulator_settings(timing=machine, timing_rounds=rounds or None, race_check=False):
            launcher.launch(art, grid, block, args, "emu")
            (_, t), = launcher.timings()
        out.append((commit(rev), t))
    return values, out
