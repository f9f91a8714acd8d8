"""The launch path: backend choice, kernarg packing, and the two backends.

Backend per call, decided once by ``backend_for`` (and carried by the op's plan): CPU tensors
-> "emu" (mxgemm.emu executes the gfx950 assembly), tensors on a ROCm GPU -> "hip"
(hipModuleLaunchKernel through the C++ host extension). ``MXGEMM_BACKEND=emu`` forces the
emulator for GPU tensors too (they are copied to the CPU and the outputs back): that is how a
GPU user cross-checks a kernel. Both backends get the same kernarg bytes, packed by
mxgemm.kernarg from the kernel's own metadata.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading

import torch

from . import guards, kernarg, toolchain

# the arch ops run on the emulator: gfx950, or any mxgemm.emu target via MXGEMM_EMU_ARCH (e.g. gfx1250)
EMU_ARCH = os.environ.get("MXGEMM_EMU_ARCH") or "gfx950"
BACKENDS = ("emu", "hip")

_EMU_SETTINGS = threading.local()
_DEFAULT_EMU = dict(race_check=True, wg_order="linear", seed=0, workgroups=None, asm_edit=None)


@contextlib.contextmanager
def emulator_settings(**kw):
    """Temporarily change emulator options for launches: race_check, wg_order, seed, and
    workgroups (iterable of (x, y, z) ids: run only those workgroups of each grid; None = all), and
    asm_edit (a function assembly text -> text applied before loading, e.g. to delete one
    s_waitcnt; edited programs are not cached)."""
    unknown = set(kw) - set(_DEFAULT_EMU)
    if unknown:
        raise TypeError(f"unknown emulator settings {sorted(unknown)}; known: {sorted(_DEFAULT_EMU)}")
    old = getattr(_EMU_SETTINGS, "value", dict(_DEFAULT_EMU))
    _EMU_SETTINGS.value = {**old, **kw}
    try:
        yield
    finally:
        _EMU_SETTINGS.value = old


def _emu_settings():
    return getattr(_EMU_SETTINGS, "value", _DEFAULT_EMU)


# ---------------------------------------------------------------------------------------------
# Backend choice
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def forced_backend() -> str | None:
    """``MXGEMM_BACKEND`` (emu|hip), read once per process; None when unset."""
    forced = os.environ.get("MXGEMM_BACKEND") or None
    if forced not in (None, *BACKENDS):
        raise ValueError(f"MXGEMM_BACKEND must be one of {BACKENDS}; got {forced!r}")
    return forced


def default_backend() -> str:
    """The backend for tensors on the default device: hip on a ROCm GPU, else emu."""
    return forced_backend() or ("hip" if toolchain.gpu_arch() else "emu")


def backend_for(device: torch.device, archs: tuple) -> tuple[str, str]:
    """(backend, arch) that runs a kernel built for ``archs`` on tensors on ``device``, or
    GuardError [arch] / [backend] naming the device and what it is."""
    forced = forced_backend()
    if device.type == "cpu" or (device.type == "cuda" and forced == "emu"):
        if forced == "hip":
            guards.fail("backend", f"MXGEMM_BACKEND=hip needs tensors on a ROCm GPU; they are on {device}")
        if EMU_ARCH not in archs:
            guards.fail("arch", f"the emulator runs {EMU_ARCH} code; this kernel is built for {archs}")
        return "emu", EMU_ARCH
    gpu = toolchain.gpu_arch() if device.type == "cuda" else None
    if gpu in archs:
        return "hip", gpu
    what = gpu or ("a CUDA/non-ROCm GPU" if device.type == "cuda" else device.type)
    guards.fail("arch", f"the kernel runs on {'/'.join(archs)} GPUs or on the emulator (CPU tensors); "
                        f"tensors are on {device} ({what})")


# ---------------------------------------------------------------------------------------------
# Kernarg layout (packing: mxgemm.kernarg)
# ---------------------------------------------------------------------------------------------
_LAYOUTS: dict = {}


def layout(art):
    """(kernarg slots (offset, size, value_kind), kernarg size) of an artefact, read once."""
    got = _LAYOUTS.get(art.asm_path)
    if got is None:
        info = art.isa()
        got = _LAYOUTS[art.asm_path] = ([(a[".offset"], a[".size"], a[".value_kind"]) for a in info.args],
                                        info.kernarg_size)
    return got


def last_emulator_stats() -> dict | None:
    """Counters (mxgemm.emu.stats) of this thread's last emulator launch through ``launch``."""
    return getattr(_EMU_SETTINGS, "last_stats", None)


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def launch(art, grid, block, args, backend: str, writes=(), dynamic_lds: int = 0) -> None:
    """Run artefact ``art`` (mxgemm.build.Artifact) with ``args`` in kernel-argument order.
    ``writes``: the tensors the kernel writes (copied back when GPU tensors run on the emulator)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    slots, size = layout(art)
    if backend == "emu":
        _emu_launch(art, grid, block, slots, size, args, writes, dynamic_lds)
    else:
        kernarg_bytes = kernarg.pack(slots, size, args, grid, block, dynamic_lds)
        dev = next(a.device for a in args if isinstance(a, torch.Tensor))
        # torch's current stream on the tensors' GPU, so launches order with torch's work
        host_ext().launch(_code_object(str(art.hsaco_path)), art.symbol, list(grid), list(block), kernarg_bytes,
                          dynamic_lds, torch.cuda.current_stream(dev).cuda_stream)


def launch_variant(kernel: str, variant: dict, arch: str, backend: str, writes=(), **values) -> None:
    """Run registered ``kernel``'s ``variant`` built for ``arch``, without an op's plan: grid and
    workgroup size from the registry, ``values`` = its kernel arguments and grid dims by name."""
    from . import build, registry
    k = registry.get(kernel)
    launch(build.artifact(kernel, variant, arch), k.launch_grid(variant, **values), (k.threads_for(arch),),
           [values[a] for a in k.args], backend, writes=writes)


_PROGRAMS: dict = {}


def _emu_launch(art, grid, block, slots, size, args, writes, dynamic_lds):
    from .emu import Emulator
    from .emu.launch import TARGETS
    if art.arch not in TARGETS:
        raise ValueError(f"the emulator runs {'/'.join(TARGETS)} code; {art.kernel} was built for {art.arch}")
    # GPU tensors (MXGEMM_BACKEND=emu on a ROCm machine) run on CPU copies
    host = [a.cpu() if isinstance(a, torch.Tensor) and a.device.type != "cpu" else a for a in args]
    settings = _emu_settings()
    emu = Emulator(arch=art.arch, race_check=settings["race_check"], wg_order=settings["wg_order"],
                   seed=settings["seed"])
    key = (art.asm_path, settings["race_check"])
    prog = emu.load(settings["asm_edit"](art.asm)) if settings["asm_edit"] else _PROGRAMS.get(key)
    if prog is None:
        prog = _PROGRAMS[key] = emu.load(art.asm)
    kernarg_bytes = kernarg.pack(slots, size, host, grid, block, dynamic_lds, runtime=emu.hidden_runtime)
    emu.launch_kernarg(prog, art.symbol, grid, block, kernarg_bytes,
                       [a for a in host if isinstance(a, torch.Tensor)], dynamic_lds, settings["workgroups"])
    _EMU_SETTINGS.last_stats = emu.last_stats
    for a, h in zip(args, host):
        if h is not a and any(a is w for w in writes):
            a.copy_(h)


def hip_available() -> bool:
    """Whether this torch is a ROCm build (the only place the HIP launcher can be built)."""
    return bool(getattr(torch.version, "hip", None))


@functools.lru_cache(maxsize=1)
def host_ext():
    """The HIP launcher (csrc/host/mxgemm_host.cpp), JIT-built once with
    torch.utils.cpp_extension; it exists only with a ROCm torch."""
    if not hip_available():
        raise RuntimeError("the hip backend needs a ROCm build of torch; CPU tensors run on the emulator")
    from torch.utils import cpp_extension

    from .registry import source_root
    src = source_root() / "csrc" / "host" / "mxgemm_host.cpp"
    build_dir = os.path.join(toolchain.cache_dir(), "host_ext", f"torch{torch.__version__}-hip")
    os.makedirs(build_dir, exist_ok=True)
    return cpp_extension.load(name="mxgemm_host_hip", sources=[str(src)], build_directory=build_dir,
                              extra_cflags=["-O2"], extra_ldflags=["-ldl"], verbose=False)


@functools.lru_cache(maxsize=None)
def _code_object(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
