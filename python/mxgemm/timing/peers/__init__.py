"""Peers timed beside our kernels on the same model, in the same run: one module per family.

A family module names its peer (``PEER``: what users run today, and after which public design
it is written here), lists the shapes its users run (``cells()``: dicts, the first item of each
a ``label``), and times one cell (``run(cell, machine)``: ours through the public op with its
own config choice, the peer compiled for gfx950 by its own compiler, both outputs checked
against each other first) -> dict(ours_us, peer_us, ours_kernel, ours_limiter, peer_limiter,
sampled). Triton is a benchmark dependency: only these modules import it.

    python -m mxgemm time --vs-peers smallm,blockscale     # a row per cell, then a markdown table
"""
from __future__ import annotations

import functools
import importlib
import sys
import time

from ...hardware import ARCH_LIMITS

FAMILIES = ("smallm", "moe_mxfp8", "moe_a4w4", "mx_gemm", "grouped_fp8", "blockscale")
WARP = ARCH_LIMITS["gfx950"]["wave_size"]     # lanes of a Triton warp on gfx950: a wave


class NoPeer(ValueError):
    """The peer kernel is not defined at this shape (the rule it would break is the message)."""


def family(name: str):
    if name not in FAMILIES:
        raise ValueError(f"unknown peer family {name!r}; known: {list(FAMILIES)}")
    return importlib.import_module(f".{name}", __name__)


@functools.lru_cache(maxsize=None)
def triton_gfx950(fn, signature: tuple, constexprs: tuple, warps: int, options: tuple = ()) -> tuple:
    """(assembly, dynamic LDS bytes) of the Triton kernel ``fn`` compiled for gfx950 with no GPU.
    signature: (parameter, Triton type) or (parameter, Triton type, specialisation key) in order,
    the key as Triton's launcher derives it from a value (compile_as_launched; a "constexpr" type
    folds the key in as the value); constexprs: (name, value) pairs; options: (name, value) pairs of
    the launch's compile options (num_stages, waves_per_eu, ...). Triton's kernels declare no static
    LDS: its launcher passes the kernel's `shared` size as dynamic LDS."""
    import os
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton 3.9's default, stated (it warns otherwise)
    import triton
    from triton.backends.amd.compiler import HIPBackend
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    spec = [(*p, None)[:3] for p in signature]
    sig = {n: t for n, t, _ in spec} | {k: "constexpr" for k, _ in constexprs}
    consts = {n: key for n, t, key in spec if t == "constexpr"} | dict(constexprs)
    attrs = {(fn.arg_names.index(n),): HIPBackend.parse_attr(key) for n, t, key in spec if t != "constexpr" and key}
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("hip", "gfx950", WARP),
                       options={"num_warps": warps, **dict(options)})
    return k.asm["amdgcn"], k.metadata.shared


def compile_as_launched(fn, args: dict, constexprs: tuple, warps: int, options: tuple = ()) -> tuple:
    """(assembly, dynamic LDS bytes, launch arguments) of ``fn`` compiled for gfx950 as Triton's
    launcher specialises it on these arguments (parameter -> value, in order): 16-byte aligned
    pointers and integers divisible by 16 marked so, tensors within 2 GB given a 32-bit pointer
    range (buffer loads), an integer equal to 1 folded in as a constant and left out of the
    arguments. Without these hints Triton emits byte loads a real launch never runs."""
    from triton.backends.amd.compiler import HIPBackend
    from triton.runtime.jit import native_specialize_impl
    spec = tuple((n, *native_specialize_impl(HIPBackend, v, False, True, True)) for n, v in args.items())
    asm, lds = triton_gfx950(fn, spec, tuple(constexprs), warps, tuple(options))
    return asm, lds, [args[n] for n, t, _ in spec if t != "constexpr"]


def launch_triton(emu, asm: str, name: str, args: list, grid: tuple, warps: int, lds: int, rounds=None,
                  xcd0=False, workgroups=None) -> None:
    """Run a Triton kernel on ``emu`` as Triton's launcher would: ``args`` in the kernel's order
    (constexprs apart), then its scratch pointers, unused here (null). ``rounds``: with a timing
    emulator, only that many rounds of XCD 0's workgroups (mxgemm.timing.rounds_sample), as
    ``time --rounds`` samples our kernels; ``xcd0``: XCD 0's workgroups only even when the rounds
    cover its share (mxgemm.timing.xcd0_rounds); ``workgroups``: only these (x, y, z) ids, instead."""
    from ... import asm_facts
    from .. import rounds_sample, xcd0_rounds
    prog = emu.load(asm)
    n_args = sum(not a[".value_kind"].startswith("hidden_") for a in asm_facts.kernel_info(asm, name).args)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = (WARP * warps, 1, 1)
    if workgroups is None and rounds and emu.timing is not None:
        workgroups = (xcd0_rounds if xcd0 else rounds_sample)(emu.timing, prog, name, grid, block, lds, rounds)
    emu.launch(prog, name, grid=grid, block=block, args=list(args) + [None] * (n_args - len(args)),
               dynamic_lds=lds, workgroups=workgroups)


def time_ours(call, machine="mi355x", rounds=None, xcd0=False) -> tuple:
    """(output of ``call()``, summed us, kernel symbols, the longest launch's timing) of a public
    op's call on the timing model (``rounds``, ``xcd0``: launcher.emulator_settings' timing_rounds,
    timing_xcd0)."""
    from ... import launcher
    with launcher.emulator_settings(timing=machine, race_check=False, timing_rounds=rounds or None,
                                    timing_xcd0=xcd0):
        out = call()
        ts = launcher.timings()
    top = max(ts, key=lambda st: st[1]["us"])[1]
    return out, sum(t["us"] for _, t in ts), "+".join(dict.fromkeys(s for s, _ in ts)), top


def vs_peers(names, machine="mi355x", out=print) -> list:
    """Ours vs the peer on every cell of each family: a row per cell as it finishes, then a
    markdown table (what docs/performance.md keeps)."""
    rows = []
    out(f"{'family':10s} {'cell':40s} {'ours_us':>9s} {'peer_us':>9s} {'peer/ours':>9s}  ours kernel  (seconds)")
    for name in names:
        fam = family(name)
        for cell in fam.cells():
            t0 = time.time()
            r = dict(family=name, cell=cell["label"], **fam.run(cell, machine))
            r["ratio"] = r["peer_us"] / r["ours_us"]
            rows.append(r)
            extra = " ".join(f"{k}={v:.2f}" for k, v in r.items()
                             if k.endswith("_us") and k not in ("ours_us", "peer_us"))   # the family's own columns
            out(f"{name:10s} {cell['label'][:40]:40s} {r['ours_us']:9.2f} {r['peer_us']:9.2f} {r['ratio']:9.2f}  "
                f"{r['ours_kernel']}  ({time.time() - t0:.0f} s) {extra}")
    out("")
    out("| family | cell | ours (us) | peer (us) | peer / ours | our kernel | limiter ours / peer |")
    out("|---|---|---|---|---|---|---|")
    for r in rows:
        out(f"| {r['family']} | {r['cell']} | {r['ours_us']:.2f} | {r['peer_us']:.2f} | {r['ratio']:.2f} | "
            f"`{r['ours_kernel']}` | {r['ours_limiter']} / {r['peer_limiter']}{' (sampled)' if r['sampled'] else ''} |")
    return rows


def main(names: str, machine="mi355x") -> int:
    vs_peers(names.split(","), machine, out=lambda s: print(s, flush=True, file=sys.stdout))
    return 0
