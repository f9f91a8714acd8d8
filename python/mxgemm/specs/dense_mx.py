"""mx_gemm (ops/dense_mx.py): prefill MX GEMM, MXFP8 / MXFP6 / MXFP4 / A8W4, gfx950 and gfx1250."""
from __future__ import annotations

import torch

from .. import quant
from .base import (
    BITWISE,
    MX_BITS,
    OUT_DTYPES,
    Call,
    Case,
    Inputs,
    OpSpec,
    Smoke,
    Work,
    grid,
    k_per_iteration,
    mx_bytes,
    waves,
)

OP = KERNEL = "mx_gemm"
# the MFMA's rate per operand format (asm_facts: cbsz / blgp), slowest first: the slower operand sets it
RATE = {"e4m3": "fp8", "e5m2": "fp8", "e2m3": "mxfp6", "e3m2": "mxfp6", "e2m1": "mxfp4"}
RATES = ("fp8", "mxfp6", "mxfp4")


def _call(inp: Inputs, v, M, N, K, splits) -> Call:
    (a, sa), (b, sb) = inp.mx(M, K, fmt=v["A_FMT"]), inp.mx(N, K, fmt=v["B_FMT"])
    kw = dict(a_format=v["A_FMT"], b_format=v["B_FMT"], out_dtype=OUT_DTYPES[v["OUT"]],
              config=f"BM={v['BM']},BN={v['BN']},SPLITS={splits}")
    if v.get("SCALE_SHUFFLED"):
        sa, sb, kw["shuffled_scales"] = quant.shuffle_scales(sa), quant.shuffle_scales(sb), True
    return Call(OP, (a, sa, b, sb), kw)


def call(kernel, v, shape, inp: Inputs) -> Call:
    return _call(inp, v, shape["M"], shape["N"], shape["K"], shape.get("splits", 1))


def work(kernel, v, M, N, K, splits=1) -> Work:
    """BM x BN tiles, ``splits`` K ranges along grid z (fp32 atomics: out read + written)."""
    g = grid(kernel, v, M=M, N=N, splits=splits)
    wgs = g[0] * g[1] * g[2]
    iters = -(-K // splits // k_per_iteration(kernel, v, v["BM"], v["BN"]))
    out_bytes = {"bf16": 2, "f16": 2, "f32": 4}[v["OUT"]] * (2 if splits > 1 else 1)
    rate = min(RATE[v["A_FMT"]], RATE[v["B_FMT"]], key=RATES.index)
    return Work(2.0 * M * N * K, mx_bytes(M, K, MX_BITS[v["A_FMT"]]) + mx_bytes(N, K, MX_BITS[v["B_FMT"]])
                + out_bytes * M * N, rate, g, wgs, wgs * waves(kernel, v) * iters, iters)


def race(kernel, v) -> list:
    """One workgroup with a partial row and column tile; 3 and 4 K steps per split (odd and even:
    the compiler unrolls the K loop by 2), two K splits for SPLITK variants; then a workgroup
    with no K step (K = 0, or a K split past the last step), whose epilogue waits alone for
    the kernel arguments."""
    splits = 2 if v["SPLITK"] else 1
    cases = [(128 * steps * splits, splits) for steps in (3, 4)] + [(384, 4) if v["SPLITK"] else (0, 1)]
    return [_call(Inputs(seed=8), v, v["BM"] - 3, max(32, v["BN"] - 32), K, s) for K, s in cases]


def decode(inp: Inputs) -> dict:
    """Prefill: 4096 tokens through a DeepSeek-V3 7168 -> 2112 projection, MXFP4 weights (A8W4)."""
    return {OP: Call(OP, (*inp.mx(4096, 7168), *inp.mx(2112, 7168, fmt="e2m1")), dict(b_format="e2m1"))}


def smoke(device) -> list:
    """MXFP4 and MXFP8 on the default backend, and MXFP8 built for gfx1250 (scaled WMMA, Tensor
    Data Mover) on the gfx1250 emulator target: bitwise, the reference follows the kernel's
    128-K MMA order."""
    from .. import launcher, reference, registry
    out = []
    for fmt, (M, N, K) in (("e2m1", (96, 128, 512)), ("e4m3", (80, 96, 384))):
        inp = Inputs(device=device)
        c = Call(OP, (*inp.mx(M, K, fmt=fmt), *inp.mx(N, K, fmt=fmt)), dict(a_format=fmt, b_format=fmt))
        ref = reference.mx_gemm_ref(*(t.cpu() for t in c.args), fmt, fmt, chunk=reference.MX_MMA_K)
        v = c.plan().variant
        out.append(Smoke(f"{OP} {'MXFP4' if fmt == 'e2m1' else 'MXFP8'} {M}x{N}x{K} [{v['BM']}x{v['BN']}]", c, ref))
    v = registry.get(KERNEL).variants_for("gfx1250")[0]
    M, N, K = 80, 96, 384
    a, sa, b, sb = *Inputs().mx(M, K, fmt=v["A_FMT"]), *Inputs(seed=1).mx(N, K, fmt=v["B_FMT"])

    def gfx1250():
        d = torch.zeros(M, N, dtype=torch.bfloat16)
        launcher.launch_variant(KERNEL, v, "gfx1250", "emu", writes=(d,), a=a, a_scale=sa, b=b, b_scale=sb, out=d,
                                M=M, N=N, K=K, splits=1)
        return d
    out.append(Smoke(f"{OP} gfx1250 MXFP8 {M}x{N}x{K} [{v['BM']}x{v['BN']}, scales by {v['SCALE_PATH']}] on the "
                     "gfx1250 emulator", gfx1250,
                     reference.mx_gemm_ref(a, sa, b, sb, v["A_FMT"], v["B_FMT"], chunk=reference.MX_MMA_K)))
    return out


def preset_prefill():
    """MX GEMM (prefill) at 1024^3 and 8192^3, MXFP8 and MXFP4, with the op's own gfx950 tile choice."""
    from ..ops.dense_mx import heuristic_config
    cases = []
    for s in (1024, 8192):
        for fmt in ("e4m3", "e2m1"):
            choice = heuristic_config("gfx950", fmt, fmt, "bf16", s, s, s)
            cases.append(Case(KERNEL, choice.variant, dict(M=s, N=s, K=s, **choice.options), f"MX GEMM {fmt} {s}^3",
                              "not found", "FlyDSL gfx1250 MX GEMM (numbers not found)"))
    return cases


SPEC = OpSpec(
    name="dense_mx", ops=(OP,), kernels=(KERNEL,), tests=("tests/test_mx_gemm.py",),
    reference=("mx_gemm_ref",), hardware_script="op_tests/test_mx_gemm.py", contract=BITWISE,
    call=call, work=work, race=race, decode=decode, smoke=smoke, presets={"mx_gemm": preset_prefill},
    small=lambda: preset_prefill()[:1])
