"""smallm_mxfp8_gemm (ops/smallm_mxfp8.py): decode MXFP8 GEMM on the GEMV and scaled-MFMA kernels."""
from __future__ import annotations

from .base import Call, Case, Contract, Inputs, OpSpec, Smoke, Work, grid, mx_bytes, waves

OP = "smallm_mxfp8_gemm"


def call(kernel, v, shape, inp: Inputs) -> Call:
    M, N, K = shape["M"], shape["N"], shape["K"]
    return Call(OP, (*inp.mx(M, K), *inp.mx(N, K)), dict(config={"kernel": kernel, **v}, fallback="error"))


def compulsory_bytes(M, N, K) -> int:
    """A, B and their scales read once, the bf16 output written once."""
    return mx_bytes(M, K, 8) + mx_bytes(N, K, 8) + 2 * M * N


def work(kernel, v, M, N, K) -> Work:
    g = grid(kernel, v, N=N, M=M)
    wgs = g[0] * g[1]
    # GEMV: 16 lanes split a row's K blocks (32 wide); MFMA: SPLIT_K waves share 128-wide K steps,
    # two a loop iteration (an odd last step runs after the loop)
    iters = -(-K // 512) if kernel.endswith("gemv") else -(-K // (128 * v["SPLIT_K"])) // 2
    return Work(2.0 * M * N * K, compulsory_bytes(M, N, K), "fp8", g, wgs, wgs * waves(kernel, v) * iters, iters)


def race(kernel, v) -> list:
    """One workgroup; K covers several K steps per lane (GEMV) / per slice (MFMA: two, where the
    two-step loop ends with the next step's loads in flight, and five, where the loop runs twice
    and its one-step tail runs)."""
    if "N_SUB" in v:
        return [call(kernel, v, dict(M=v["M_TILE"], N=16 * v["N_SUB"], K=1024), Inputs(seed=1))]
    return [call(kernel, v, dict(M=v["M_TILE"], N=64 // v["SPLIT_K"], K=steps * 128 * v["SPLIT_K"]), Inputs(seed=1))
            for steps in (2, 5)]


def decode(inp: Inputs) -> dict:
    M, N, K = 1, 4096, 4096
    return {OP: Call(OP, (*inp.mx(M, K), *inp.mx(N, K)))}


def smoke(device) -> list:
    from .. import reference
    inp = Inputs(device=device)
    M, N, K = 2, 128, 256
    c = Call(OP, (*inp.mx(M, K), *inp.mx(N, K)))
    return [Smoke(f"{OP} {M}x{N}x{K} [{c.plan().kernel}]", c,
                  reference.smallm_mxfp8_gemm_ref(*(t.cpu() for t in c.args)))]


# The seed's decode shapes: MiniMax-M3 (hidden 6144) qkv / gate_up / o_proj / down per GPU at TP1..8,
# (K, N) as in aiter's op_tests/tune_smallm_mxfp8.py (PR #3783); TP1's gate_up and down are both 6144 x 6144.
MINIMAX_M3_LINEARS = {
    1: {"qkv": (6144, 9216), "gate_up/down": (6144, 6144), "o_proj": (8192, 6144)},
    2: {"qkv": (6144, 4608), "gate_up": (6144, 3072), "o_proj": (4096, 6144), "down": (3072, 6144)},
    4: {"qkv": (6144, 2304), "gate_up": (6144, 1536), "o_proj": (2048, 6144), "down": (1536, 6144)},
    8: {"qkv": (6144, 1152), "gate_up": (6144, 768), "o_proj": (1024, 6144), "down": (768, 6144)},
}
# aiter's tuned table (aiter/configs/smallm_mxfp8_tuned.csv, ROCm/aiter): for the TP4 shapes, whether its
# HIP kernel beat the Triton dot_scaled fallback by > 3% (use_hip). The microseconds behind it were not found.
AITER_USE_HIP_TP4 = {(6144, 2304): "1111111", (2048, 6144): "1111110", (6144, 1536): "1111111",
                     (1536, 6144): "1111111"}   # one digit per M in 1, 2, 4, 8, 16, 32, 64
DECODE_MS = (1, 2, 4, 8, 16, 32, 64)


def _published(K, N, M):
    flags = AITER_USE_HIP_TP4.get((K, N))
    if flags is None:
        return "not found", "aiter PR #3783: HIP/Triton us not found"
    won = flags[DECODE_MS.index(M)] == "1"
    return f"HIP {'>' if won else '<='} Triton+3%", "aiter smallm_mxfp8_tuned.csv (use_hip); us not found"


def preset_decode():
    from ..ops.smallm_mxfp8 import heuristic_config, tuned_config
    out = []
    for tp, linears in MINIMAX_M3_LINEARS.items():
        for name, (K, N) in linears.items():
            for M in DECODE_MS:
                choice = tuned_config(M, N, K) or heuristic_config(M, N, K)
                out.append(Case(choice.kernel, choice.variant, dict(M=M, N=N, K=K), f"M3 {name} TP{tp} M={M}",
                                *_published(K, N, M)))
    return out


def small():
    return [Case("smallm_mxfp8_gemv", {"M_TILE": 1, "N_SUB": 1}, dict(M=1, N=1280, K=8192), "small gemv"),
            Case("smallm_mxfp8_mfma", {"M_TILE": 16, "SPLIT_K": 4}, dict(M=16, N=1280, K=8192), "small mfma")]


SPEC = OpSpec(
    name="smallm_mxfp8", ops=(OP,), kernels=("smallm_mxfp8_gemv", "smallm_mxfp8_mfma"),
    tests=("tests/test_smallm_mxfp8_gemm.py",), reference=("smallm_mxfp8_gemm_ref",),
    hardware_script="op_tests/test_smallm_mxfp8.py", contract=Contract(ulp=1, exact=0.99),
    call=call, work=work, race=race, decode=decode, smoke=smoke, presets={"smallm": preset_decode}, small=small)
