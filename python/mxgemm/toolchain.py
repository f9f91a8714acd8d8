"""Find and drive the device compilers.

HIP C++ is compiled header-free (``-nogpuinc -nogpulib``; kernels include only
``csrc/include/mxgemm``), which works the same with a ROCm clang and with the clang 22
bundled in the ``ziglang`` wheel. Compilation is two steps so the code object is exactly
the assembly we inspect and emulate: source -> ``.s`` (clang -S), then ``.s`` -> ``.o``
(clang's integrated assembler) -> ``.hsaco`` (ld.lld -shared). Facts relied on:
docs/toolchain.md §1.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import env

ARCHS = ("gfx950", "gfx1250")
# ROCm clang learned gfx950 in LLVM 19 (ROCm 6.3/6.4) and gfx1250 later; we require the
# major version below for each arch and otherwise fall back to the ziglang clang.
_MIN_CLANG_MAJOR = {"gfx950": 19, "gfx1250": 22}


@dataclass(frozen=True)
class Compiler:
    kind: str            # "rocm" or "ziglang"
    clang: tuple         # argv prefix that runs clang
    lld: tuple           # argv prefix that runs ld.lld
    version: str         # e.g. "22.1.8"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def describe(self) -> str:
        return f"{self.kind} clang {self.version} ({' '.join(self.clang)})"


class ToolchainError(RuntimeError):
    pass


def _clang_version(argv) -> str | None:
    try:
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"clang version (\d+\.\d+\.\d+)", out)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=None)
def _rocm_compiler() -> Compiler | None:
    roots = [os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm"]
    for root in filter(None, roots):
        clang = Path(root) / "llvm" / "bin" / "clang"
        lld = Path(root) / "llvm" / "bin" / "ld.lld"
        if clang.exists() and lld.exists():
            ver = _clang_version([str(clang)])
            if ver:
                return Compiler("rocm", (str(clang),), (str(lld),), ver)
    return None


def _zig_compiler() -> Compiler | None:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return None
    clang = (sys.executable, "-m", "ziglang", "clang")
    ver = _clang_version(clang)
    if not ver:
        return None
    return Compiler("ziglang", clang, (sys.executable, "-m", "ziglang", "ld.lld"), ver)


@functools.lru_cache(maxsize=None)
def find_compiler(arch: str = "gfx950") -> Compiler:
    """The HIP device compiler for ``arch``: a new-enough ROCm clang, else ziglang's clang.

    ``MXGEMM_COMPILER=ziglang`` (or ``rocm``) forces a choice.
    """
    if arch not in ARCHS:
        raise ToolchainError(f"unsupported arch {arch!r}; mxgemm targets {ARCHS}")
    forced = env.get("MXGEMM_COMPILER")
    candidates = {"rocm": _rocm_compiler, "ziglang": _zig_compiler}
    order = [forced] if forced else ["rocm", "ziglang"]
    for kind in order:
        comp = candidates[kind]()
        if comp and comp.major >= _MIN_CLANG_MAJOR[arch]:
            return comp
    raise ToolchainError(
        f"no HIP device compiler for {arch}: need a ROCm clang >= {_MIN_CLANG_MAJOR[arch]} "
        "(set ROCM_PATH) or `pip install ziglang==0.17.0`")


def ld_lld_dir() -> Path:
    """A directory laid out like ``$ROCM_PATH`` whose ``llvm/bin/ld.lld`` works.

    FlyDSL runs ``$ROCM_PATH/llvm/bin/ld.lld`` and does not ship one; without ROCm we
    provide a one-line wrapper around ziglang's lld.
    """
    rocm = _rocm_compiler()
    if rocm is not None:
        return Path(rocm.lld[0]).parents[2]
    root = Path(cache_dir()) / "fake_rocm"
    lld = root / "llvm" / "bin" / "ld.lld"
    script = f'#!/bin/sh\nexec "{sys.executable}" -m ziglang ld.lld "$@"\n'
    if not lld.exists() or lld.read_text() != script:
        lld.parent.mkdir(parents=True, exist_ok=True)
        tmp = lld.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(script)
        tmp.chmod(0o755)
        os.replace(tmp, lld)
    return root


def cache_dir() -> str:
    """``MXGEMM_CACHE_DIR`` or ``~/.cache/mxgemm`` (XDG_CACHE_HOME honoured), created if missing;
    EnvError naming MXGEMM_CACHE_DIR when it is not, and cannot be made, a writable directory."""
    d = env.get("MXGEMM_CACHE_DIR")
    if d is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "mxgemm")
    os.makedirs(d, exist_ok=True)
    return d


def include_dir() -> Path:
    from .registry import source_root
    return source_root() / "csrc" / "include"


def hip_flags(arch: str, defines: dict | None = None) -> list[str]:
    flags = ["-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpuinc", "-nogpulib",
             "-O3", "-std=c++17", f"--offload-arch={arch}", f"-I{include_dir()}"]
    for k, v in sorted((defines or {}).items()):
        flags.append(f"-D{k}={int(v) if isinstance(v, bool) else v}")
    return flags


def hip_build_identity(arch: str, defines: dict | None = None) -> bytes:
    """Everything besides the source that decides a HIP compile's output: the shared headers'
    contents, the flags (minus the checkout's absolute include path, so two checkouts or an
    editable and an installed copy share cache entries) and the compiler."""
    import hashlib
    h = hashlib.sha256()
    inc = include_dir()
    for p in sorted(inc.rglob("*.h")):
        h.update(str(p.relative_to(inc)).encode())
        h.update(p.read_bytes())
    comp = find_compiler(arch)
    flags = [f for f in hip_flags(arch, defines) if not f.startswith("-I")]
    h.update(repr((comp.kind, comp.version, flags)).encode())
    return h.digest()


def _run(argv, what):
    env = dict(os.environ)
    env.setdefault("TMPDIR", tempfile.gettempdir())
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise ToolchainError(f"{what} failed ({' '.join(map(str, argv))}):\n{p.stderr[-4000:]}")
    return p


def compile_hip_asm(source: str | Path, arch: str, out_s: str | Path, defines: dict | None = None) -> None:
    """HIP C++ file -> gfx assembly text."""
    comp = find_compiler(arch)
    _run([*comp.clang, *hip_flags(arch, defines), "-S", str(source), "-o", str(out_s)], "HIP compile")


def assemble(asm: str | Path, arch: str, out_hsaco: str | Path) -> None:
    """gfx assembly -> linked code object (.hsaco)."""
    comp = find_compiler(arch)
    out_hsaco = Path(out_hsaco)
    obj = out_hsaco.with_suffix(f".o{os.getpid()}")
    try:
        _run([*comp.clang, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}", "-c", str(asm),
              "-o", str(obj)], "assemble")
        _run([*comp.lld, "-shared", str(obj), "-o", str(out_hsaco)], "link")
    finally:
        if obj.exists():
            obj.unlink()


def compile_hip_source(text: str, arch: str = "gfx950", defines: dict | None = None) -> str:
    """Compile HIP C++ given as text and return the assembly text (for tests / corpora).

    Results are cached by content hash like every other build (headers included).
    """
    import hashlib
    key = hashlib.sha256(text.encode() + hip_build_identity(arch, defines)).hexdigest()[:24]
    d = Path(cache_dir()) / "snippets"
    d.mkdir(parents=True, exist_ok=True)
    s = d / f"{key}.{arch}.s"
    if not s.exists():
        src = d / f"{key}.{os.getpid()}.hip"
        src.write_text(text)
        tmp = s.with_suffix(f".tmp{os.getpid()}")
        try:
            compile_hip_asm(src, arch, tmp, defines)
            os.replace(tmp, s)
        finally:
            src.unlink(missing_ok=True)
    return s.read_text()


def host_library(source: str | Path, python_ext: bool = False) -> Path:
    """A C/C++ source for the host (``CC`` / ``CXX``, default cc / c++) built into a shared
    library in the cache, keyed by its content, the compiler and, for a Python extension
    (``python_ext``: named for import, built against this interpreter's headers), the Python ABI."""
    import hashlib
    import sysconfig
    source = Path(source)
    cxx = source.suffix == ".cpp"
    compiler = os.environ.get("CXX" if cxx else "CC") or ("c++" if cxx else "cc")
    flags = ["-O2", "-shared", "-fPIC", "-fvisibility=hidden" if python_ext else "-fvisibility=default"]
    flags += ["-std=c++17", "-fno-exceptions"] if cxx else ["-std=c11"]
    suffix = ".so"
    if python_ext:
        flags += [f"-I{sysconfig.get_paths()['include']}"]
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256(source.read_bytes() + repr((compiler, flags, suffix)).encode()).hexdigest()[:16]
    d = Path(cache_dir()) / "host"
    out = d / f"{source.stem}-{key}{suffix}" if not python_ext else d / key / f"{source.stem}{suffix}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        try:
            _run([compiler, *flags, str(source), "-o", str(tmp), "-ldl"], f"host build of {source.name}")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def flydsl_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("flydsl")
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def gpu_arch() -> str | None:
    """gfx name of GPU 0 when a ROCm GPU is present (via torch), else None."""
    try:
        import torch
        if getattr(torch.version, "hip", None) and torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    except Exception:
        pass
    return None

