"""Kernel/config choice shared by all ops.

Each op registers a planner: a function taking the op's own arguments and returning a Plan
(which kernel, which variant, launch geometry, backend and why), after running the guards.
Ops then execute the plan; ``mxgemm.explain`` returns it without running anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field

_PLANNERS: dict = {}


@dataclass
class Plan:
    op: str
    kernel: str | None             # registry name, None for the fallback
    variant: dict = field(default_factory=dict)
    backend: str = "emu"           # "hip" | "emu" | "fallback"
    grid: tuple = (1, 1, 1)
    block: tuple = (256, 1, 1)
    reason: str = ""
    fallback: bool = False
    extra: dict = field(default_factory=dict)   # op-specific launch facts (e.g. split-K)

    def __str__(self):
        if self.fallback:
            return f"{self.op}: fallback (dequantise + torch matmul) because {self.reason}"
        v = ",".join(f"{k}={x}" for k, x in sorted(self.variant.items()))
        return (f"{self.op}: kernel {self.kernel} [{v}] on {self.backend}, grid={self.grid} "
                f"block={self.block}; {self.reason}")


def tensor_key(t):
    """What every guard reads of a tensor (shape, dtype, device, contiguity): planners memoise
    on it, so a cached call re-runs no guard and hashes no data. None stays None."""
    # .device, not get_device(): the latter is -1 for CPU and for "meta" alike.
    return None if t is None else (t.shape, t.dtype, t.device, t.is_contiguous())


def planner(op: str):
    def deco(fn):
        _PLANNERS[op] = fn
        return fn
    return deco


def explain(op: str, *args, **kw) -> Plan:
    """Which kernel and config ``op`` would run for these arguments and why (or why it falls
    back, or the guard it breaks: that GuardError is raised as the op would raise it)."""
    _load_ops()
    try:
        fn = _PLANNERS[op]
    except KeyError:
        raise KeyError(f"unknown op {op!r}; ops with planners: {sorted(_PLANNERS)}") from None
    return fn(*args, **kw)


def _load_ops():
    from . import ops  # noqa: F401  (importing registers every op's planner)
