"""deep_gemm_fp8_grouped_gemm (ops/blockscale_grouped_gemm.py; DeepGEMM's names in mxgemm.deep_gemm): grouped FP8
(or FP8 x FP4) GEMM, NT, with 1x128 / 128x128 (1x32 for FP4) block scales, or unscaled BF16 (A_FMT
bf16), contiguous (m_indices or psum) or masked groups."""
from __future__ import annotations

import torch

from ..deep_gemm.layout import get_mn_major_tma_aligned_tensor
from .base import BITWISE, OUT_DTYPES, Call, Case, Inputs, OpSpec, Smoke, Work, grid, k_per_iteration, waves

OP = "deep_gemm_fp8_grouped_gemm"
KERNEL = "blockscale_grouped_gemm"


def _bf16(inp: Inputs, *shape):
    """A bf16 operand: Gaussian (torch.empty for the "empty" fill)."""
    if inp.fill == "empty":
        return torch.empty(shape, dtype=torch.bfloat16)
    return torch.randn(*shape, generator=inp.gen).bfloat16().to(inp.device)


def _call(inp: Inputs, v, G, group_rows, m_max, N, K, config="", zero_padding=False) -> Call:
    """Groups of ``group_rows`` rows: masked [G, m_max, K], or contiguous in G * m_max rows, each
    group padded to m_max rows (layout -1 past a group's rows) or, PSUM, DeepGEMM's psum layout (the
    groups' ends, each group starting at the previous end aligned to 128; m_max a multiple of 128);
    B_FMT e2m1: FP4 b with 1x32 e8m0 scales; A_FMT bf16: bf16 a and b, no scales; fp32 sfa row-major
    for SFA_KMAJOR, else MN-major (the layout each variant runs)."""
    sf = inp.scale if v["UE8M0"] else inp.fp32_scale
    psum = bool(v.get("PSUM"))
    if v["MASKED"]:
        rows, layout = (G, m_max), group_rows.to(torch.int32)
    elif psum:
        ends, start = [], 0
        for r in group_rows.tolist():
            ends.append(start + r)
            start = -(-ends[-1] // 128) * 128
        rows, layout = (G * m_max,), torch.tensor(ends, dtype=torch.int32)
    else:
        rows, layout = (G * m_max,), torch.arange(G, dtype=torch.int32).repeat_interleave(m_max)
        layout[torch.arange(G * m_max) % m_max >= group_rows.repeat_interleave(m_max)] = -1
    out = inp.zeros(*rows, N, dtype=OUT_DTYPES[v["OUT"]])
    kb = -(-K // 128)
    if v.get("A_FMT") == "bf16":
        a, sfa, b, sfb = _bf16(inp, *rows, K), None, _bf16(inp, G, N, K), None
    else:
        b, sfb = inp.mx(G, N, K, fmt="e2m1") if v.get("B_FMT") == "e2m1" else \
            (inp.fp8(G, N, K), sf(G, -(-N // 128), kb))
        a, sfa = inp.fp8(*rows, K), sf(*rows, kb)
        if not v["UE8M0"] and not v.get("SFA_KMAJOR"):  # the fp32 variants for MN-major activation scales
            sfa = get_mn_major_tma_aligned_tensor(sfa)
    args = (a, sfa, b, sfb, layout.to(inp.device), out)
    kw = dict(masked=bool(v["MASKED"]), config=config,
              **({} if v["MASKED"] else dict(psum=psum, zero_padding=zero_padding)))
    return Call(OP, args, kw, out=out)


def call(kernel, v, shape, inp: Inputs) -> Call:
    G, m = shape["groups"], shape["m"]
    rows = torch.full((G,), m)
    return _call(inp, v, G, rows, m, shape["N"], shape["K"])


def work(kernel, v, groups, m, N, K) -> Work:
    m_tiles = groups * -(-m // v["BM"])
    g = grid(kernel, v, N=N, m_tiles=m_tiles)
    wgs = g[0] * g[1]
    iters = -(-K // k_per_iteration(kernel, v, v["BM"], v["BN"]))
    rows = groups * m
    fp4, bf16 = v.get("B_FMT") == "e2m1", v.get("A_FMT") == "bf16"
    if bf16:
        return Work(2.0 * rows * N * K, 2 * rows * K + 2 * groups * N * K + 2 * rows * N, "bf16", g, wgs,
                    wgs * waves(kernel, v) * iters, iters)
    b_bytes = groups * N * K // 2 + groups * N * (K // 32) if fp4 else \
        groups * N * K + groups * -(-N // 128) * (K // 128) * 4
    scales = rows * (K // 128) * (1 if v["UE8M0"] else 4)
    return Work(2.0 * rows * N * K, rows * K + b_bytes + scales + 2 * rows * N, "fp8", g, wgs,
                wgs * waves(kernel, v) * iters, iters)


def race(kernel, v) -> list:
    """Groups of 40, 0 and 23 rows (full, skipped and partial BM tiles; masked, or contiguous with
    each group padded to 128 rows, or psum), K = 1, 6, 8 and 11 blocks of 128 bytes, the 11th partial
    (1360 bytes; 1376 for FP4 b, K % 32, and bf16, K % 16: K = 64, 384, 512, 688 elements) (the K loop
    runs 2, 3 or 4 steps per iteration, then the remainder: every remainder of 3 and of 4 occurs, 1
    takes the path that skips the loop; with 6 and 11 the dead prefetch DMA of the last step lands
    in LDS buffer 0, where the epilogue's C tile goes); contiguous calls with K = 6 blocks write their
    padding rows as zeros (padding-only tiles run with no K loop). SFA_KMAJOR runs 12 or 16 steps an
    iteration (its sfa window): those are all remainders; one iteration's K leaves the loop with no
    remainder, and K = 31 blocks, the last partial (3936 bytes), runs 15 or 7 steps after it."""
    rows = torch.tensor([40, 0, 23])
    bf16 = v.get("A_FMT") == "bf16"
    ks = (128, 768, 1024, 1376 if bf16 or v.get("B_FMT") == "e2m1" else 1360)
    if v.get("SFA_KMAJOR"):
        ks += (k_per_iteration(kernel, v, v["BM"], v["BN"]), 3936)
    return [_call(Inputs(seed=7), v, 3, rows, 40 if v["MASKED"] else 128, v["BN"], K // 2 if bf16 else K,
                  f"BM={v['BM']},BN={v['BN']}", zero_padding=K == 768) for K in ks]


def decode(inp: Inputs) -> dict:
    """DeepSeek-V3 masked decode: 8 groups of up to 64 rows, N=4096, K=7168."""
    v = dict(MASKED=1, UE8M0=0, OUT="bf16")
    return {OP: _call(inp, v, 8, torch.full((8,), 64), 64, 4096, 7168)}


def smoke(device) -> list:
    """Masked groups of 5, 0 and 17 rows, fp32 scales, vs the reference on the written rows."""
    from .. import reference
    v = dict(MASKED=1, UE8M0=0, OUT="bf16")
    rows = torch.tensor([5, 0, 17])
    c = _call(Inputs(device=device), v, 3, rows, 32, 64, 256)
    a, sfa, b, sfb, masked_m, _ = (t.cpu() for t in c.args)
    ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, masked_m)
    written = torch.arange(32)[None, :] < rows[:, None]
    return [Smoke(f"{OP} masked G=3 (rows 5, 0, 17) N=64 K=256", lambda: c().cpu()[written], ref[written])]


_DEEPGEMM_README = "DeepGEMM README (H800, not MI355X)"
DEEPGEMM_PUBLISHED = {  # (masked, groups, m per group, N, K) -> TFLOPS, deepseek-ai/DeepGEMM README
    (0, 4, 8192, 4096, 7168): 1297, (0, 4, 8192, 7168, 2048): 1099, (0, 8, 4096, 4096, 7168): 1288,
    (0, 8, 4096, 7168, 2048): 1093, (1, 1, 1024, 4096, 7168): 1233, (1, 1, 1024, 7168, 2048): 925,
    (1, 2, 512, 4096, 7168): 1040, (1, 2, 512, 7168, 2048): 916, (1, 4, 256, 4096, 7168): 932,
    (1, 4, 256, 7168, 2048): 815}


def preset_published():
    return [Case(KERNEL, {"BM": 128, "BN": 128, "MASKED": masked, "UE8M0": 0, "OUT": "bf16"},
                 dict(groups=g, m=m, N=N, K=K), f"{'masked' if masked else 'contig'} G={g} M={m} {N}x{K}",
                 f"{tf} TFLOPS", _DEEPGEMM_README) for (masked, g, m, N, K), tf in DEEPGEMM_PUBLISHED.items()]


def serves(kernel, v) -> str:
    """DeepGEMM's functions (mxgemm.deep_gemm) that run variant ``v``."""
    layout = "nt_masked" if v["MASKED"] else "nt_contiguous / nn_contiguous" + (
        " (use_psum_layout)" if v.get("PSUM") else " (m_indices)")
    if v.get("A_FMT") == "bf16":
        return f"m_grouped_bf16_gemm_{layout}" + (", einsum (per head)" if v["MASKED"] else "") + f", {v['OUT']} d"
    fns = f"m_grouped_fp8{'_fp4' if v.get('B_FMT') == 'e2m1' else ''}_gemm_{layout}"
    if v.get("B_FMT") == "e2m1":
        fns += " with FP4 b" + (", fp8_fp4_gemm_nt with FP4 b (one group)" if v["MASKED"] else "")
    elif v["MASKED"]:
        fns += ", fp8_einsum"
    return f"{fns}, {'UE8M0' if v['UE8M0'] else 'fp32'} scales, {v['OUT']} d"


SPEC = OpSpec(
    name="blockscale_grouped_gemm", ops=(OP,), kernels=(KERNEL,),
    tests=("tests/test_deep_gemm.py", "tests/test_deep_gemm_bf16.py"),
    reference=("m_grouped_fp8_gemm_nt_contiguous_ref", "m_grouped_fp8_gemm_nt_masked_ref",
               "m_grouped_bf16_gemm_nt_contiguous_ref", "m_grouped_bf16_gemm_nt_masked_ref"),
    hardware_script="op_tests/test_deep_gemm.py", contract=BITWISE, call=call, work=work, race=race,
    decode=decode, smoke=smoke, presets={"deep_gemm": preset_published}, serves=serves)
