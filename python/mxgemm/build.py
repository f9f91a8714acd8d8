"""Compile registry kernels per (kernel, variant, arch) to gfx assembly (.s) and a code object
(.hsaco), cached by content hash.

The key hashes everything that can change the output: the kernel source, the shared device
headers (HIP) or the FlyDSL build driver (FlyDSL), the compile flags, the variant and the
compiler identity. A repeat build of unchanged sources compiles nothing; editing one kernel
source rebuilds only that kernel's artefacts. Each entry records the sha256 of its two files
(``.sha256``, in sha256sum's format), checked when a process first loads it: an entry that is
damaged, partial or has no record is rebuilt, never used.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from . import env, registry, toolchain


@dataclass
class Artifact:
    kernel: str
    variant: dict
    arch: str
    asm_path: Path
    hsaco_path: Path
    key: str
    seconds: float = 0.0            # compile time when this process compiled it, else 0
    rebuilt: str | None = None      # why this process rebuilt a cached entry: which file failed the check
    _asm: str | None = field(default=None, repr=False)

    @property
    def asm(self) -> str:
        if self._asm is None:
            self._asm = self.asm_path.read_text()
        return self._asm

    @property
    def sums_path(self) -> Path:
        """The entry's recorded sha256 of .s and .hsaco, written last: a complete entry has it."""
        return self.hsaco_path.with_suffix(".sha256")

    @property
    def symbol(self) -> str:
        return registry.get(self.kernel).symbol

    def isa(self):
        """Static facts of the kernel (registers, spills, LDS, occupancy): mxgemm.asm_facts."""
        from . import asm_facts
        return asm_facts.kernel_info(self.asm, self.symbol)


def cache_key(kernel: registry.Kernel, variant: dict, arch: str) -> str:
    h = hashlib.sha256()
    root = registry.source_root()
    h.update(kernel.path.read_bytes())
    if kernel.language == "hip":
        h.update(toolchain.hip_build_identity(arch, variant))
    else:
        for p in sorted((root / "flydsl_kernels").glob("*.py")):
            if p != kernel.path:
                h.update(p.name.encode())
                h.update(p.read_bytes())
        h.update(Path(__file__).with_name("flydsl_build.py").read_bytes())
        h.update(repr((toolchain.flydsl_version(), arch, sorted(variant.items()))).encode())
    h.update(kernel.symbol.encode())
    return h.hexdigest()[:20]


def _paths(kernel, variant, arch, key):
    d = Path(toolchain.cache_dir()) / "kernels" / arch / kernel.name
    stem = f"{registry.variant_id(variant)}-{key}"
    return d / f"{stem}.s", d / f"{stem}.hsaco"


def _sums(files: dict) -> str:
    """sha256sum's format (so `sha256sum -c` checks an entry by hand): file name -> bytes."""
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in files.items())


def _compile(kernel, variant, art: Artifact):
    art.asm_path.parent.mkdir(parents=True, exist_ok=True)
    tag = f".tmp{os.getpid()}_{id(variant)}"
    final = (art.asm_path, art.hsaco_path, art.sums_path)
    tmp_s, tmp_h, tmp_sums = tmp = [p.with_name(p.name + tag) for p in final]
    try:
        if kernel.language == "hip":
            toolchain.compile_hip_asm(kernel.path, art.arch, tmp_s, variant)
            toolchain.assemble(tmp_s, art.arch, tmp_h)
        else:
            from .flydsl_build import compile_flydsl
            compile_flydsl(kernel.path, art.arch, variant, tmp_s, tmp_h, kernel.symbol)
        tmp_sums.write_text(_sums({art.asm_path.name: tmp_s.read_bytes(), art.hsaco_path.name: tmp_h.read_bytes()}))
        for t, p in zip(tmp, final):   # the sums last: their presence marks a complete entry
            os.replace(t, p)
    finally:
        for t in tmp:
            t.unlink(missing_ok=True)


def _check(art: Artifact) -> str | None:
    """None when the cached entry of ``art`` matches its recorded sha256s (its assembly is then
    kept: it was read anyway), else what does not."""
    try:
        lines = art.sums_path.read_text().splitlines()
    except FileNotFoundError:
        return f"{art.sums_path} is missing"
    except UnicodeDecodeError:
        lines = []
    recorded = {name: digest for digest, _, name in (line.partition("  ") for line in lines)}
    if recorded.keys() != {art.asm_path.name, art.hsaco_path.name}:
        return f"{art.sums_path} is malformed"
    data = {}
    for p in (art.asm_path, art.hsaco_path):
        try:
            data[p] = p.read_bytes()
        except FileNotFoundError:
            return f"{p} is missing"
        if hashlib.sha256(data[p]).hexdigest() != recorded[p.name]:
            return f"{p} differs"
    art._asm = data[art.asm_path].decode()
    return None


_MEMO: dict = {}


def artifact(name: str, variant: dict | None = None, arch: str = "gfx950") -> Artifact:
    """The built artefact of one (kernel, variant, arch), compiling it if it is not cached.

    Memoised per process, so the dispatcher's steady state does no hashing or file I/O; the
    first load in a process checks the cached files against their recorded sha256.
    """
    return _artifact(name, variant, arch)[0]


def _artifact(name, variant, arch):
    """(artifact, compiled_by_this_call)."""
    variant = dict(variant or {})
    memo_key = (name, registry.variant_id(variant), arch, env.get("MXGEMM_CACHE_DIR"))
    art = _MEMO.get(memo_key)
    if art is not None:
        return art, False
    kernel = registry.get(name)
    if arch not in kernel.archs:
        raise ValueError(f"kernel {name!r} is not built for {arch!r} (archs: {kernel.archs})")
    if variant not in kernel.variants_for(arch):
        raise ValueError(f"kernel {name!r} has no {arch} variant {variant}; registered: "
                         f"{list(kernel.variants_for(arch))}")
    key = cache_key(kernel, variant, arch)
    asm_path, hsaco_path = _paths(kernel, variant, arch, key)
    art = Artifact(name, variant, arch, asm_path, hsaco_path, key)
    cached = any(p.exists() for p in (asm_path, hsaco_path, art.sums_path))
    art.rebuilt = _check(art) if cached else None
    compiled = not cached or art.rebuilt is not None
    if compiled:
        t0 = time.perf_counter()
        _compile(kernel, variant, art)
        art.seconds = time.perf_counter() - t0
    _MEMO[memo_key] = art
    return art, compiled


def plan(kernels=None, archs=None):
    """All (kernel, variant, arch) triples selected by names and archs. An unknown kernel name, or
    an arch that none of the selected kernels is built for, is a ValueError naming what exists."""
    names = kernels or list(registry.KERNELS)
    unknown = [n for n in names if n not in registry.KERNELS]
    if unknown:
        raise ValueError(f"unknown kernel {', '.join(map(repr, unknown))}; registered kernels: "
                         f"{', '.join(registry.KERNELS)}")
    supported = sorted({a for n in names for a in registry.KERNELS[n].archs})
    orphan = [a for a in archs or () if a not in supported]
    if orphan:
        raise ValueError(f"no selected kernel is built for arch {', '.join(orphan)}; "
                         f"supported: {', '.join(supported)}")
    out = []
    for n in names:
        k = registry.get(n)
        for arch in k.archs:
            if archs and arch not in archs:
                continue
            out.extend((n, v, arch) for v in k.variants_for(arch))
    return out


def build(kernels=None, archs=None, jobs=None, progress=True) -> list[Artifact]:
    """Build (or find cached) every selected artefact, in parallel, printing progress to stderr."""
    todo = plan(kernels, archs)
    jobs = jobs or os.cpu_count() or 1
    errors, n_new = [], 0

    def say(msg):
        if progress:
            print(msg, file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = [pool.submit(_artifact, n, v, a) for n, v, a in todo]
        label = {f: f"{n} [{registry.variant_id(v)}] {a}" for f, (n, v, a) in zip(futs, todo)}
        for i, fut in enumerate(as_completed(futs), 1):   # progress in completion order
            e = fut.exception()
            if isinstance(e, env.EnvError):               # every artefact fails on it: say it once
                raise e
            if e is not None:                             # report all failures, then raise
                errors.append((label[fut], e))
                say(f"[{i}/{len(todo)}] FAILED {label[fut]}: {str(e).splitlines()[0]}")
                continue
            art, compiled = fut.result()
            n_new += compiled
            verb = "rebuilt " if art.rebuilt else "compiled" if compiled else "cached  "
            say(f"[{i}/{len(todo)}] {verb} {label[fut]}" + (f" ({art.seconds:.1f} s)" if compiled else "")
                + (f": the cached files did not match their recorded hash ({art.rebuilt})" if art.rebuilt else ""))
    if errors:
        raise toolchain.ToolchainError(f"build failed ({len(errors)} of {len(todo)} artefacts):\n"
                                       + "\n".join(f"  {l}: {e}" for l, e in errors))
    build.last_compiled = n_new  # for tests and the CLI summary
    return [f.result()[0] for f in futs]  # in plan order


def cmake_list() -> str:
    """The HIP half of the registry for CMakeLists.txt (csrc/kernels.cmake): one entry per
    (kernel, variant) and the compile flags of mxgemm.toolchain. tests/test_build.py checks the
    file is current and says how to regenerate it."""
    flags = [f for f in toolchain.hip_flags("ARCH") if not f.startswith(("--offload-arch=", "-I"))]
    lines = ["# Generated from python/mxgemm/registry.py by mxgemm.build.cmake_list(): do not edit.",
             f"set(MXGEMM_HIP_FLAGS {' '.join(flags)})",
             "# name|variant id|source|archs|defines",
             "set(MXGEMM_HIP_KERNELS"]
    for k in registry.KERNELS.values():
        if k.language == "hip":
            for v in k.variants:
                defines = ",".join(f"{d}={x}" for d, x in sorted(v.items()))
                lines.append(f'  "{k.name}|{registry.variant_id(v)}|{k.source}|{",".join(k.archs)}|{defines}"')
    return "\n".join(lines) + ")\n"
