"""Compile a header-free HIP test kernel to gfx950 assembly and run it on mxgemm.emu."""
from __future__ import annotations

import functools

import numpy as np

PRELUDE = r"""
#include "mxgemm/device.h"
typedef int v8i __attribute__((ext_vector_type(8)));
typedef int v4i __attribute__((ext_vector_type(4)));
typedef int v3i __attribute__((ext_vector_type(3)));
typedef int v2i __attribute__((ext_vector_type(2)));
typedef float v4f __attribute__((ext_vector_type(4)));
typedef float v16f __attribute__((ext_vector_type(16)));
typedef float v2f __attribute__((ext_vector_type(2)));
typedef __bf16 v8bf __attribute__((ext_vector_type(8)));
typedef _Float16 v8h __attribute__((ext_vector_type(8)));
typedef short v2s __attribute__((ext_vector_type(2)));
typedef _Float16 v2h __attribute__((ext_vector_type(2)));
typedef __bf16 v2bf __attribute__((ext_vector_type(2)));
#define LDS_PTR(T, p) ((__attribute__((address_space(3))) T*)(p))
"""


@functools.lru_cache(maxsize=None)
def program(source: str):
    """(emulator, program, asm) of a source; fails naming any mnemonic the emulator lacks."""
    from mxgemm import emu as emu_mod
    from mxgemm import toolchain
    asm = toolchain.compile_hip_source(PRELUDE + source, "gfx950")
    emu = emu_mod.Emulator(race_check=True)
    missing = emu.unsupported_mnemonics(asm)
    assert not missing, f"emulator lacks {sorted(missing)}"
    return emu, emu.load(asm), asm


def run(source: str, kernel: str, *arrays, grid=1, block=64, scalars=()):
    """Launch `kernel` with numpy arrays (copied into torch tensors) followed by scalars;
    returns the arrays after the run as numpy copies."""
    import torch
    emu, prog, _ = program(source)
    ts = [torch.from_numpy(np.ascontiguousarray(a).copy()) for a in arrays]
    emu.launch(prog, kernel, grid=(grid, 1, 1), block=(block, 1, 1), args=[*ts, *scalars])
    return [t.numpy() for t in ts]
