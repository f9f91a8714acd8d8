"""Launch a built kernel through the C++ host extension's Launcher.

Backend per call, from where the tensors are: CPU tensors -> "emu" (mxgemm.emu runs the
gfx950 assembly), tensors on a gfx950 GPU -> "hip" (hipModuleLaunchKernel). The host
extension packs the kernarg from the kernel's own metadata either way, so the emulator sees
exactly the bytes a GPU would.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading

import torch

from . import toolchain

_EMU_SETTINGS = threading.local()
_DEFAULT_EMU = dict(race_check=True, wg_order="linear", seed=0, workgroups=None)


@contextlib.contextmanager
def emulator_settings(**kw):
    """Temporarily change emulator options for launches: race_check, wg_order, seed, and
    workgroups (iterable of (x, y, z) ids: run only those workgroups of each grid; None = all)."""
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


@functools.lru_cache(maxsize=1)
def host_ext():
    """The pybind11 host extension, JIT-built once with torch.utils.cpp_extension (ninja-cached
    in the mxgemm cache dir)."""
    from torch.utils import cpp_extension
    from .registry import source_root
    src = source_root() / "csrc" / "host" / "mxgemm_host.cpp"
    with_hip = bool(getattr(torch.version, "hip", None))
    tag = "hip" if with_hip else "cpu"
    build_dir = os.path.join(toolchain.cache_dir(), "host_ext", f"torch{torch.__version__}-{tag}")
    os.makedirs(build_dir, exist_ok=True)
    ext = cpp_extension.load(
        name=f"mxgemm_host_{tag}", sources=[str(src)], build_directory=build_dir,
        extra_cflags=["-O2"] + (["-DMXGEMM_WITH_HIP"] if with_hip else []),
        extra_ldflags=["-ldl"] if with_hip else [], verbose=False)
    ext.set_emu_callback(_emu_launch)
    return ext


_LAYOUTS: dict = {}


def _layout(art):
    """(kernarg slots, kernarg size) from the artefact's metadata, once per code object."""
    got = _LAYOUTS.get(art.asm_path)
    if got is None:
        info = art.isa()
        got = _LAYOUTS[art.asm_path] = ([(a[".offset"], a[".size"], a[".value_kind"]) for a in info.args],
                                        info.kernarg_size)
    return got


_PROGRAMS: dict = {}


def _emu_launch(code, kernel, grid, block, kernarg, buffers, dynamic_lds):
    """'emu' backend callback: ``code`` is the path of the kernel's assembly."""
    from .emu import Emulator
    s = _emu_settings()
    emu = Emulator(arch="gfx950", race_check=s["race_check"], wg_order=s["wg_order"], seed=s["seed"])
    prog = _PROGRAMS.get(code)
    if prog is None:
        prog = _PROGRAMS[code] = emu.load(open(code).read())
    emu.launch_kernarg(prog, kernel, grid, block, kernarg, list(buffers), dynamic_lds, s["workgroups"])


def backend_for(args) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            return "emu" if a.device.type == "cpu" else "hip"
    return "emu"


def launch(art, grid, block, args, dynamic_lds: int = 0, backend: str | None = None) -> None:
    """Run artefact ``art`` (mxgemm.build.Artifact) with ``args`` in kernel-argument order."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    backend = backend or backend_for(args)
    if backend == "emu" and art.arch != "gfx950":
        raise ValueError(f"the emulator runs gfx950 code only; {art.kernel} was built for {art.arch}")
    layout, size = _layout(art)
    ext = host_ext()
    kernarg = ext.pack_kernarg(layout, size, list(args), list(grid), list(block), dynamic_lds)
    buffers = [a for a in args if not isinstance(a, (int, float))]
    if backend == "emu":
        code, stream = str(art.asm_path), 0
    else:  # torch's current stream on the tensors' GPU, so launches order with torch's work
        code = _code_object(str(art.hsaco_path))
        stream = torch.cuda.current_stream(buffers[0].device).cuda_stream
    ext.launch(backend, code, art.symbol, list(grid), list(block), kernarg, buffers, dynamic_lds, stream)


@functools.lru_cache(maxsize=None)
def _code_object(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
