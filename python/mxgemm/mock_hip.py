"""A mock HIP runtime: the GPU launch path, run on the emulator.

``MXGEMM_HIP_LIB=mock`` (or ``launcher.use_hip_library("mock")``) sends CPU tensors through the
hip backend: the C++ launcher loads csrc/mock_hip/mock_hip.c (built here) in place of
libamdhip64.so, and that library hands every module load, function lookup and launch to the
callbacks below. A launch runs on mxgemm.emu with exactly the kernarg bytes, grid, block and
dynamic LDS the launcher passed to hipModuleLaunchKernel, the pointers being the tensors' host
addresses (tinygrad's MOCKGPU idea, for the HIP module API). Like the real runtime, the mock
writes the hidden kernel arguments itself, from the launch's own grid, block and LDS size.

What it checks that a real runtime also would: the code object is one mxgemm built (found by its
content among the build cache's artefacts), the symbol is a kernel in it, the kernarg segment has
the size the kernel's metadata gives, the workgroup size is the one the code was built for (the
emulator's check). What it cannot: device memory. The mock takes the call's tensors as the
device allocations the kernel may touch.

``MXGEMM_HIP_LIB=mock-noop`` takes the same path to a copy of the library whose launches do
nothing: the host cost of a call, measured by ``python -m mxgemm bench host``.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import threading
from pathlib import Path

from . import toolchain

_CALL = threading.local()   # .buffers: the tensors of the launch in flight; .error: what a callback raised

_LOAD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)
_FUNCTION = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p)
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32),
                           ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p,
                           ctypes.c_uint64)
INVALID_VALUE, INVALID_IMAGE, NOT_FOUND, LAUNCH_FAILURE = 1, 200, 500, 719   # hipError_t

_MODULES: dict = {}   # module id -> (asm path, arch)
LAUNCHES: list = []   # (symbol, grid, block, dynamic LDS) of every launch the mock ran, in order


class MockLaunchError(RuntimeError):
    """A launch the mock runtime refused (what a GPU would fault on or reject)."""


def _callback(fn):
    """A callback that reports an exception as HIP error code (the launcher re-raises it)."""
    def wrapped(*a):
        try:
            return fn(*a)
        except BaseException as e:
            _CALL.error = e
            return LAUNCH_FAILURE
    return functools.wraps(fn)(wrapped)


@functools.lru_cache(maxsize=None)
def _artefacts() -> dict:
    """sha256 of every code object in the build cache -> (assembly path, arch)."""
    root = Path(toolchain.cache_dir()) / "kernels"
    return {hashlib.sha256(h.read_bytes()).hexdigest(): (h.with_suffix(".s"), h.parent.parent.name)
            for h in root.glob("*/*/*.hsaco")}


@_callback
def _on_load(module, image, size):
    digest = hashlib.sha256(ctypes.string_at(image, size)).hexdigest()
    found = _artefacts().get(digest)
    if found is None:
        _artefacts.cache_clear()
        found = _artefacts().get(digest)
    if found is None:   # not a code object mxgemm built
        return INVALID_IMAGE
    _MODULES[module] = found
    return 0


@functools.lru_cache(maxsize=None)
def _kernels(asm_path: Path) -> dict:
    """symbol -> (kernarg slots, kernarg size) of every kernel in an assembly file."""
    from . import asm_facts, kernarg
    text = asm_path.read_text()
    return {symbol: kernarg.layout(asm_facts.kernel_info(text, symbol)) for symbol in asm_facts.kernel_names(text)}


@_callback
def _on_function(module, name):
    return 0 if name.decode() in _kernels(_MODULES[module][0]) else NOT_FOUND


@_callback
def _on_launch(module, name, grid, block, dynamic_lds, stream, args, size):
    asm_path, arch = _MODULES[module]
    symbol = name.decode()
    slots, want = _kernels(asm_path)[symbol]
    if size != want:
        raise MockLaunchError(f"hipModuleLaunchKernel({symbol}): a kernarg segment of {size} bytes; the "
                              f"kernel's metadata says {want}")
    grid, block = tuple(grid[:3]), tuple(block[:3])
    LAUNCHES.append((symbol, grid, block, dynamic_lds))
    _EXECUTE[0](arch, asm_path, symbol, slots, grid, block, dynamic_lds, ctypes.string_at(args, size),
                _CALL.buffers)
    return 0


_CALLBACKS = (_LOAD(_on_load), _FUNCTION(_on_function), _LAUNCH(_on_launch))   # kept alive here


_EXECUTE: list = [None]   # execute(arch, asm path, symbol, slots, grid, block, lds, kernarg, buffers)


def _built() -> Path:
    from .registry import source_root
    return toolchain.host_library(source_root() / "csrc" / "mock_hip" / "mock_hip.c")


@functools.lru_cache(maxsize=1)
def library(execute) -> Path:
    """The mock runtime library (built once, cached by content), its callbacks installed; a launch
    is handed to ``execute`` (mxgemm.launcher.run_handed_over)."""
    path = _built()
    _EXECUTE[0] = execute
    ctypes.CDLL(str(path)).mock_hip_set_callbacks(*_CALLBACKS)
    return path


@functools.lru_cache(maxsize=1)
def noop_library() -> Path:
    """A second copy of the mock runtime, loaded on its own and never given callbacks: module
    loads and lookups succeed and launches return at once (the host-time benchmark's GPU)."""
    path = _built()
    noop = path.with_name(path.stem + "-noop" + path.suffix)
    if not noop.exists():
        tmp = noop.with_name(noop.name + f".tmp{os.getpid()}")
        shutil.copyfile(path, tmp)
        os.replace(tmp, noop)
    return noop


def run(kernel, args, tensors) -> None:
    """Launch ``kernel(*args)`` through the mock runtime with ``tensors`` as the device memory;
    an exception raised on the emulator (a fault, a race) is raised here, from the HIP error."""
    _CALL.buffers, _CALL.error = tensors, None
    try:
        kernel(*args)
    except RuntimeError as e:
        err, _CALL.error = _CALL.error, None
        if err is not None:
            raise err from e
        raise
    finally:
        _CALL.buffers = None
