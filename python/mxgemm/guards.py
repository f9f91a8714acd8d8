"""Host-side guards. Each raises GuardError naming the rule and the offending value, before any
launch, so a rejected call never writes its outputs."""
from __future__ import annotations

import math

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
    check_bytes(t.numel() * t.element_size(), name, limit)


def check_output_bytes(shape, dtype, limit: int = VOFFSET_LIMIT) -> None:
    """The 2 GB rule for the output an out-less call allocates."""
    check_bytes(math.prod(shape) * dtype.itemsize, "out (allocated by the call)", limit)


def check_bytes(nbytes: int, name: str, limit: int = VOFFSET_LIMIT) -> None:
    if nbytes >= limit:
        fail("2GB-voffset", f"{name} spans {nbytes} bytes, addressed through one raw buffer resource "
                            f"it must be < {limit} bytes (2^31): split the call")


def check_multiple(value: int, name: str, mult: int, rule: str) -> None:
    if value % mult:
        fail(rule, f"{name} = {value} must be a multiple of {mult}")


def check_range(value: int, name: str, allowed, rule: str) -> None:
    if value not in allowed:
        fail(rule, f"{name} = {value} is outside the kernel envelope {sorted(allowed)}")


def check_routing(sorted_token_ids, sorted_expert_ids, num_valid_ids, block_m: int, tokens: int, topk,
                  experts: int) -> None:
    """The sorted MoE layout the kernels trust (each rule is one they would otherwise break by
    reading out of bounds or reading another row): 0 <= num_valid_ids[0] <= len(sorted_token_ids);
    every live entry (below num_valid_ids[0]) naming a real token (token < ``tokens``; larger
    token ids are padding) has slot < ``topk`` (None: the op reads no slot); every block holding
    live rows names an expert of w (< ``experts``; -1: none). Reads the tensors: a device-to-host
    copy and a sync on a GPU."""
    rows = sorted_token_ids.numel()
    live = int(num_valid_ids[0])
    if not 0 <= live <= rows:
        fail("num_valid_ids", f"num_valid_ids[0] = {live} must be within 0..{rows} (the length of sorted_token_ids)")
    ids = sorted_token_ids[:live]
    token, slot = ids & 0xFFFFFF, (ids >> 24) & 0xFF
    if topk is not None:
        bad = ((token < tokens) & (slot >= topk)).nonzero()
        if bad.numel():
            p = int(bad[0])
            fail("sorted_token_ids", f"sorted_token_ids[{p}] = {int(ids[p]) & 0xFFFFFFFF:#x} is token {int(token[p])} "
                                     f"slot {int(slot[p])}: a real token's slot must be < topk = {topk} "
                                     f"(entries are (slot << 24) | token; token >= {tokens} marks padding)")
    blocks = sorted_expert_ids[:-(-live // block_m)]
    bad = int(blocks.max()) if blocks.numel() else -1
    if bad >= experts:
        block = int((blocks == bad).nonzero()[0])
        fail("expert-id", f"sorted_expert_ids[{block}] = {bad} but w holds {experts} experts "
                          f"(ids 0..{experts - 1})")
