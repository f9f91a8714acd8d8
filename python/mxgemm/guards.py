"""Host-side guards. Each raises GuardError naming the rule and the offending value, before any
launch, so a rejected call never writes its outputs."""
from __future__ import annotations

import torch

from . import toolchain

VOFFSET_LIMIT = 2 ** 31  # >= 2^31 breaks the OOB sentinel offsets (docs/gfx950_isa.md §6)


class GuardError(ValueError):
    """A call broke one of the dispatcher's rules; the message names the rule and the value.
    ``rule`` and ``detail`` are kept apart for callers that turn a rule into a fallback."""

    def __init__(self, rule: str, detail: str):
        super().__init__(f"[{rule}] {detail}")
        self.rule, self.detail = rule, detail

    def __reduce__(self):  # picklable (multiprocessing, pytest-xdist) despite two arguments
        return GuardError, (self.rule, self.detail)


def fail(rule: str, detail: str):
    raise GuardError(rule, detail)


def check_dtype(t: torch.Tensor, name: str, allowed) -> None:
    allowed = tuple(allowed) if isinstance(allowed, (tuple, list, set)) else (allowed,)
    if t.dtype not in allowed:
        fail("dtype", f"{name} has dtype {t.dtype}; expected {' or '.join(map(str, allowed))}")


def check_shape(t: torch.Tensor, name: str, shape) -> None:
    """``shape`` may hold None for a free dimension."""
    ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        fail("shape", f"{name} has shape {list(t.shape)}; expected {want}")


def check_contiguous(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        fail("contiguity", f"{name} must be contiguous (row-major); got strides {t.stride()} "
                           f"for shape {list(t.shape)}")


def check_same_device(**tensors) -> torch.device:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    first = next(iter(devs.values()))
    if any(d != first for d in devs.values()):
        fail("device", "all tensors must be on one device; got "
                       + ", ".join(f"{n}={d}" for n, d in devs.items()))
    return first


def check_voffset(t: torch.Tensor, name: str, limit: int = VOFFSET_LIMIT) -> None:
    nbytes = t.numel() * t.element_size()
    if nbytes >= limit:
        fail("2GB-voffset", f"{name} spans {nbytes} bytes, addressed through one raw buffer resource "
                            f"it must be < {limit} bytes (2^31): split the call")


def check_multiple(value: int, name: str, mult: int, rule: str) -> None:
    if value % mult:
        fail(rule, f"{name} = {value} must be a multiple of {mult}")


def check_range(value: int, name: str, allowed, rule: str) -> None:
    if value not in allowed:
        fail(rule, f"{name} = {value} is outside the kernel envelope {sorted(allowed)}")


def check_arch(*tensors) -> str:
    """Backend for tensors on this device: 'emu' for CPU tensors (the gfx950 emulator),
    'hip' for tensors on a gfx950 GPU; anything else is rejected naming the detected arch."""
    dev = tensors[0].device
    if dev.type == "cpu":
        return "emu"
    arch = toolchain.gpu_arch()
    if dev.type == "cuda" and arch == "gfx950":
        return "hip"
    fail("arch", f"HIP kernels run on gfx950 GPUs or on the emulator (CPU tensors); tensors are on "
                 f"{dev} whose arch is {arch or ('CUDA/non-ROCm' if dev.type == 'cuda' else dev.type)}")
