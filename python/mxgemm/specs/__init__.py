"""One spec per op file: how to make each op's inputs and call it, its reference and numerical
contract, its named shape sets, its work model, the kernels it dispatches to and their tests.
Perf, timing, bench, demo, the race-deletion sweep, the GPU-path test and the mutation harness
are loops over ``SPECS``; adding an op adds a spec here (see the README's checklist)."""
from __future__ import annotations

from . import blockscale_grouped_gemm, dense_mx, dequant, moe_a4w4, moe_mxfp8, smallm_mxfp8, train_grouped_gemm
from .base import Call, Case, Contract, Inputs, OpSpec, Smoke, Work

SPECS: tuple[OpSpec, ...] = tuple(m.SPEC for m in (dequant, smallm_mxfp8, moe_mxfp8, moe_a4w4, train_grouped_gemm,
                                                     blockscale_grouped_gemm, dense_mx))
SMALL_PRESET = "small"   # CI: one case of every kernel that runs quickly

__all__ = ["Call", "Case", "Contract", "Inputs", "OpSpec", "SPECS", "Smoke", "Work", "SMALL_PRESET", "presets",
           "spec_of_kernel", "spec_of_op", "op_call", "work", "race_calls", "race_outputs",
           "gfx950_kernels_without_spec", "decode_calls", "kernel_tests", "readme_table"]


def spec_of_kernel(kernel: str) -> OpSpec:
    for s in SPECS:
        if kernel in s.kernels:
            return s
    raise KeyError(f"kernel {kernel!r} belongs to no op spec; specs: {[s.name for s in SPECS]}")


def spec_of_op(op: str) -> OpSpec:
    for s in SPECS:
        if op in s.ops:
            return s
    raise KeyError(f"op {op!r} has no spec; specs: {[s.name for s in SPECS]}")


def presets() -> dict:
    """Preset name -> () -> [Case]: every spec's named shape sets, and SMALL_PRESET."""
    out = {name: fn for s in SPECS for name, fn in s.presets.items()}
    out[SMALL_PRESET] = lambda: [c for s in SPECS for c in s.small()]
    return out


def op_call(case: Case, device="cpu", fill: str = "bytes") -> Call:
    """The Call that runs ``case`` through its public op on ``device``, checked to run its variant."""
    call = spec_of_kernel(case.kernel).call(case.kernel, case.variant, case.shape, Inputs(fill, device))
    return call.expect(case.kernel, case.variant)


def work(case: Case) -> Work:
    return spec_of_kernel(case.kernel).work(case.kernel, case.variant, **case.shape)


def race_calls(kernel: str, variant: dict) -> list:
    """Fresh Calls reaching ``kernel`` ``variant``'s code paths, each checked to run that variant."""
    return [c.expect(kernel, variant) for c in spec_of_kernel(kernel).race(kernel, variant)]


def race_outputs(kernel: str, variant: dict) -> list:
    """Run the race calls of ``kernel`` ``variant`` -> their outputs."""
    return [c() for c in race_calls(kernel, variant)]


def gfx950_kernels_without_spec() -> set:
    from .. import registry
    return {k for k, r in registry.KERNELS.items() if "gfx950" in r.archs} - {k for s in SPECS for k in s.kernels}


def decode_calls(fill: str = "empty") -> dict:
    """Public framework op -> a decode-sized Call (dispatch and host benchmarks)."""
    return {op: c for s in SPECS for op, c in s.decode(Inputs(fill)).items()}


def kernel_tests(kernel: str) -> tuple:
    return spec_of_kernel(kernel).tests


def readme_table() -> str:
    """The README's table of where each op lives, written from the specs and the registry."""
    from .. import registry
    rows = ["| op | op file + spec | kernel source (registry name) | reference (`mxgemm.reference`) | kernel tests "
            "| hardware script |", "|---|---|---|---|---|---|"]
    for s in SPECS:
        sources = {}
        for k in s.kernels:
            sources.setdefault(registry.get(k).source, []).append(f"`{k}`")
        code = lambda x: ", ".join(f"`{t}`" for t in x)  # noqa: E731
        rows.append(f"| {code(s.ops)} | `ops/{s.name}.py`, `specs/{s.name}.py` | "
                    + ", ".join(f"`{src}` ({', '.join(ks)})" for src, ks in sources.items())
                    + f" | {code(s.reference) or '—'} | {code(s.tests)} | "
                    + (f"`{s.hardware_script}`" if s.hardware_script else "—") + " |")
    return "\n".join(rows)
