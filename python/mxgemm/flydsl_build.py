"""Compile-only FlyDSL builds: kernel module -> final ISA (.s) + code object (.hsaco).

FlyDSL runs in a subprocess because (a) its target/compile-only/dump switches are read
from the environment, and (b) touching a compiled kernel without ROCm aborts the whole
process. Nothing here launches anything; the .s is executed by ``mxgemm.emu``.

Both outputs come from one FlyDSL compilation: the .s is FlyDSL's ``*_final_isa.s`` dump
(regenerated from the same LLVM module as the binary) and the .hsaco is the code object
embedded in the compiled module's ``gpu.binary`` op (FlyDSL links it with
``$ROCM_PATH/llvm/bin/ld.lld``; ``toolchain.ld_lld_dir()`` provides one without ROCm).
Facts relied on: docs/toolchain.md §2.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from .toolchain import ToolchainError, ld_lld_dir

_TIMEOUT_S = 600


def compile_flydsl(source: Path, arch: str, variant: dict, out_s: Path, out_hsaco: Path, symbol: str) -> None:
    """Compile the FlyDSL kernel module ``source`` for ``arch`` with compile-time ``variant``,
    naming the kernel ``symbol`` (its registry symbol).

    Writes ``out_s`` (FlyDSL's final ISA) and ``out_hsaco`` (its gpu.binary code object).
    Raises ToolchainError carrying FlyDSL's output on failure.
    """
    source, out_s, out_hsaco = Path(source).resolve(), Path(out_s), Path(out_hsaco)
    with tempfile.TemporaryDirectory(prefix="mxgemm-flydsl-") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ)
        env.update({
            "COMPILE_ONLY": "1",              # jit calls compile and return None
            "FLYDSL_GPU_ARCH": arch,          # the target; ARCH alone is not enough
            "ARCH": arch,
            "ROCM_PATH": str(ld_lld_dir()),   # FlyDSL links with $ROCM_PATH/llvm/bin/ld.lld
            "FLYDSL_DEBUG_DUMP_ASM": "1",     # writes <dump>/<kernel>/NN_final_isa.s
            "FLYDSL_DUMP_DIR": str(tmp / "dump"),
            # Private, disabled cache: a cache hit would skip both the dump and
            # _last_compiled; caching is the build layer's job.
            "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
            "FLYDSL_RUNTIME_CACHE_DIR": str(tmp / "cache"),
            "HOME": str(tmp / "home"),        # FlyDSL defaults write under ~/.flydsl
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                        env.get("PYTHONPATH")])),
        })
        env.pop("FLYDSL_DUMP_IR", None)
        job = {"source": str(source), "arch": arch, "variant": variant, "symbol": symbol,
               "dump": str(tmp / "dump"), "out_s": str(tmp / "k.s"), "out_hsaco": str(tmp / "k.hsaco")}
        argv = [sys.executable, "-c", "import sys; from mxgemm.flydsl_build import _worker; _worker(sys.argv[1])",
                json.dumps(job)]
        try:
            p = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise ToolchainError(f"FlyDSL compile of {source.name} for {arch} timed out after {_TIMEOUT_S}s") from e
        if p.returncode != 0:
            why = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
            raise ToolchainError(f"FlyDSL compile of {source.name} for {arch} {variant} failed ({why}):\n"
                                 f"{(p.stderr or '')[-6000:]}{(p.stdout or '')[-2000:]}")
        for out, tmp_out in ((out_s, job["out_s"]), (out_hsaco, job["out_hsaco"])):
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(f"{out.name}.tmp{os.getpid()}")
            shutil.copyfile(tmp_out, part)
            os.replace(part, out)  # atomic: concurrent builds never see half a file


# ---------------------------------------------------------------------------------------
# Subprocess side

def _load_module(source: Path):
    name = f"_mxgemm_flydsl_{source.stem}"
    if name in sys.modules:
        return sys.modules[name]
    if str(source.parent) not in sys.path:  # kernels import their shared helpers (ir_builder) by name
        sys.path.insert(0, str(source.parent))
    spec = importlib.util.spec_from_file_location(name, source)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _gpu_binaries(ir_text: str) -> list[bytes]:
    """Code objects of every ``gpu.binary`` op in a compiled FlyDSL module (object 0 each,
    the one FlyDSL itself loads)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    found = []

    def visit(op):
        if op.name == "gpu.binary":
            found.append(bytes(gpu.ObjectAttr(ir.ArrayAttr(op.attributes["objects"])[0]).object))
        return ir.WalkResult.ADVANCE

    with _create_mlir_context():
        ir.Module.parse(ir_text).operation.walk(visit)
    return found


def _worker(job_json: str) -> None:
    job = json.loads(job_json)
    mod = _load_module(Path(job["source"]))
    symbol = job["symbol"]
    jitfn = mod.compile_for_build(job["arch"], symbol, **job["variant"])
    last = getattr(jitfn, "_last_compiled", None)
    if last is None:
        sys.exit("compile_for_build did not compile (no _last_compiled): did it return the @flyc.jit function?")
    bins = _gpu_binaries(last[1].ir)
    if len(bins) != 1:
        sys.exit(f"expected one gpu.binary in the compiled module, found {len(bins)}")
    isa = sorted(Path(job["dump"]).glob("*/*_final_isa.s"))
    if len(isa) != 1:
        sys.exit(f"expected one *_final_isa.s dump, found {[str(p) for p in isa]}")
    text = isa[0].read_text()
    if f"\n{symbol}:" not in text or ".amdgpu_metadata" not in text:
        sys.exit(f"final ISA lacks kernel {symbol!r} or its metadata")
    if bins[0][:4] != b"\x7fELF" or symbol.encode() not in bins[0]:
        sys.exit(f"gpu.binary is not an ELF code object holding {symbol!r}")
    Path(job["out_s"]).write_text(normalize_target_id(text))
    Path(job["out_hsaco"]).write_bytes(bins[0])


def normalize_target_id(asm: str) -> str:
    """FlyDSL's triple has environment ``unknown`` (``amdgcn-amd-amdhsa-unknown-gfx950``);
    clang's assembler rejects a ``.amdgcn_target`` that differs from its own
    ``amdgcn-amd-amdhsa--gfx950``. Only the target id changes, so the code is untouched."""
    return re.sub(r"amdgcn-amd-amdhsa-unknown-(gfx\w+)", r"amdgcn-amd-amdhsa--\1", asm)


# ---------------------------------------------------------------------------------------
# ELF helpers (tests / build checks)

def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of a little-endian ELF64 file (enough for code objects)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
    strtab = hdrs[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for h in hdrs:
        name = names[h[0]:names.index(b"\0", h[0])].decode()
        out[name] = b"" if h[1] == 8 else data[h[4]:h[4] + h[5]]  # SHT_NOBITS has no bytes
    return out


def elf_machine(data: bytes) -> int:
    """``e_machine`` (0xE0 = EM_AMDGPU)."""
    return struct.unpack_from("<H", data, 0x12)[0]
