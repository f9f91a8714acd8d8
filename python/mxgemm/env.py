"""Every environment variable mxgemm reads, in one table: name, meaning, default and the values
it takes. Code reads them through ``get``, which checks the value and names the variable in its
error; the README's table is checked against this one."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


class EnvError(ValueError):
    """An environment variable holds a value mxgemm cannot use."""


@dataclass(frozen=True)
class Var:
    name: str
    doc: str
    default: str | None = None
    choices: tuple | None = None    # the values it may take; None: any
    check: Callable[[str], str | None] | None = None   # a value -> what is wrong with it, None if nothing


def writable_dir(path: str) -> str | None:
    """What keeps ``path`` from being (made) a directory mxgemm can write to, None if nothing."""
    p = want = os.path.abspath(path)
    while not os.path.lexists(p):       # it will be created under its nearest existing ancestor
        p = os.path.dirname(p)
    where = "" if p == want else f"cannot be created: {p} is "
    if not os.path.isdir(p):
        return f"{where}not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{where}not writable"
    return None


VARS = {v.name: v for v in (
    Var("MXGEMM_BACKEND", "run every op on this backend: emu (the emulator, GPU tensors copied to the CPU) "
        "or hip (GPU tensors only)", choices=("emu", "hip")),
    Var("MXGEMM_EMU_ARCH", "the target whose build ops run on the emulator", "gfx950", ("gfx950", "gfx1250")),
    Var("MXGEMM_HIP_LIB", "the HIP runtime the hip backend loads: a library name or path; mock: the mock "
        "runtime (CPU tensors through the GPU launch path, launches on the emulator); mock-noop: the same, "
        "launching nothing", "libamdhip64.so"),
    Var("MXGEMM_CACHE_DIR", "where compiled kernels and host libraries are cached (unset: mxgemm in "
        "$XDG_CACHE_HOME, else in ~/.cache)", check=writable_dir),
    Var("MXGEMM_COMPILER", "the device compiler: rocm or ziglang (default: ROCm's clang if new enough, "
        "else ziglang's)", choices=("rocm", "ziglang")),
    Var("MXGEMM_SKIP_WARM", "any value: install without the warm-up build (setup.py)"),
    Var("MXGEMM_RACE_SWEEP", "all: the race-deletion test deletes waits in every variant, not a sample (tests)",
        choices=("all",)),
)}


# (name, value) whose check passed: checks may touch the file system, and build.artifact's memo
# lookup reads MXGEMM_CACHE_DIR on every call
_PASSED: set = set()


def get(name: str) -> str | None:
    """The value of ``name`` (a registered variable), its default when unset or empty; EnvError
    when it is not one of the variable's choices or fails its check."""
    var = VARS[name]
    value = os.environ.get(name) or None
    if value is None:
        return var.default
    if var.choices is not None and value not in var.choices:
        raise EnvError(f"{name}={value!r}: must be one of {', '.join(var.choices)} ({var.doc})")
    if var.check is not None and (name, value) not in _PASSED:
        problem = var.check(value)
        if problem is not None:
            raise EnvError(f"{name}={value!r}: {problem} ({var.doc})")
        _PASSED.add((name, value))
    return value
