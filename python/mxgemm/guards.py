"""Host-side guards. Each raises GuardError naming the rule and the offending value, before any
launch, so a rejected call never writes its outputs."""
from __future__ import annotations

import torch

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


def check_expert_ids(sorted_expert_ids, num_valid_ids, block_m: int, experts: int) -> None:
    """Every block holding live rows (below num_valid_ids[0]) names an expert of ``w``: the
    kernels skip or misread a block whose id is >= the expert count. Reads the ids (a device
    sync on a GPU)."""
    ids = sorted_expert_ids[:-(-int(num_valid_ids[0]) // block_m)]
    bad = int(ids.max()) if ids.numel() else -1
    if bad >= experts:
        block = int((ids == bad).nonzero()[0])
        fail("expert-id", f"sorted_expert_ids[{block}] = {bad} but w holds {experts} experts "
                          f"(ids 0..{experts - 1})")
