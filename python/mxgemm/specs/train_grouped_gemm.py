"""grouped_gemm_fp8_kernel, grouped_gemm_fp8_variable_k, the autograd op grouped_gemm_fp8,
grouped_gemm_bf16_kernel / grouped_gemm_bf16_variable_k and grouped_gemm_fp4_kernel /
grouped_gemm_fp4_variable_k (ops/train_grouped_gemm.py): FP8 MoE grouped GEMM with tensorwise,
row-wise, 128-block or mx scales, BF16 / FP16 (FMT=bf16 / f16 variants, no scales), forward NT, dgrad
NN, wgrad TN, TT (a MN-major); MXFP4 (FMT=e2m1 variants) forward / dgrad NT and the K-contiguous wgrad NTK."""
from __future__ import annotations

import torch

from .. import registry
from .base import (
    BITWISE,
    FP8,
    OUT_DTYPES,
    Call,
    Case,
    Contract,
    Inputs,
    OpSpec,
    Smoke,
    Work,
    grid,
    k_per_iteration,
    waves,
)

ROWS, WGRAD, AUTOGRAD = "grouped_gemm_fp8_kernel", "grouped_gemm_fp8_variable_k", "grouped_gemm_fp8"
BF16_ROWS, BF16_WGRAD = "grouped_gemm_bf16_kernel", "grouped_gemm_bf16_variable_k"
FP4_ROWS, FP4_WGRAD = "grouped_gemm_fp4_kernel", "grouped_gemm_fp4_variable_k"
FP4_AUTOGRAD = "grouped_gemm_fp4"
KERNEL = "train_grouped_gemm"
DTYPES = {**FP8, "bf16": torch.bfloat16, "f16": torch.float16}
HALF = ("bf16", "f16")   # the unscaled ops' operand formats


def _bf16(inp: Inputs, *shape, dtype=torch.bfloat16):
    """A bf16 (or fp16) operand: Gaussians (torch.empty for the "empty" fill)."""
    if inp.fill == "empty":
        return torch.empty(shape, dtype=dtype, device=inp.device)
    return torch.randn(*shape, generator=inp.gen).to(dtype).to(inp.device)


def _call(v, rows: bool, a, sa, b, sb, lens, **out) -> Call:
    """The Call of variant v's op: the fp8 ops take the scales, the bf16 ones (FMT=bf16 or f16) none."""
    if v["FMT"] in HALF:
        return Call(BF16_ROWS if rows else BF16_WGRAD, (a, b, lens), **out)
    return Call(ROWS if rows else WGRAD, (a, sa, b, sb, lens), **out)


def _fp4_call(v, inp: Inputs, rows, N, K, lens, **opts) -> Call:
    """MXFP4 over `rows` grouped rows (lens): NT a [rows, K/2], b [G, N, K/2] (opts: the op's
    keywords); NTK (the wgrad, out [G, N, K]) a [N, rows/2], b [K, rows/2]."""
    G = len(lens)
    if v["LAYOUT"] == "NTK":
        (a, sa), (b, sb) = inp.mx(N, rows, fmt="e2m1"), inp.mx(K, rows, fmt="e2m1")
        return Call(FP4_WGRAD, (a, sa, b, sb, lens), **_out_kw(v, (G, N, K)))
    (a, sa), (b, sb) = inp.mx(rows, K, fmt="e2m1"), inp.mx(G, N, K, fmt="e2m1")
    out = _out_kw(v, (rows, N))
    out["kw"].update(opts)
    return Call(FP4_ROWS, (a, sa, b, sb, lens), **out)


def call(kernel, v, shape, inp: Inputs) -> Call:
    """Groups of m rows (NT / NN / TT) or m contraction rows (TN, NTK: out [G, N, K])."""
    G, m, N, K = shape["groups"], shape["m"], shape["N"], shape["K"]
    lens = torch.full((G,), m, dtype=torch.int64, device=inp.device)
    if v["FMT"] == "e2m1":
        return _fp4_call(v, inp, G * m, N, K, lens)
    operand = (lambda *s: _bf16(inp, *s, dtype=DTYPES[v["FMT"]])) if v["FMT"] in HALF else inp.fp8
    if v["LAYOUT"] == "TN":
        sa, sb = _scales(v, inp, (-(-G * m // 128), N), (-(-G * m // 128), -(-K // 128)),
                         ((N, -(-G * m // 32)), (K, -(-G * m // 32))))
        return _call(v, False, operand(G * m, N), sa, operand(G * m, K), sb, lens, **_out_kw(v, (G, N, K)))
    a = operand(K, G * m) if v["LAYOUT"] == "TT" else operand(G * m, K)
    b = operand(G, K, N) if v["LAYOUT"] == "NN" else operand(G, N, K)
    sa, sb = _scales(v, inp, (G * m, -(-K // 128)), (G, -(-N // 128), -(-K // 128)),
                     ((G * m, -(-K // 32)), (G, N, -(-K // 32))))
    out = _out_kw(v, (G * m, N))
    out["kw"].update(trans_b=v["LAYOUT"] != "NN", trans_a=v["LAYOUT"] == "TT")
    return _call(v, True, a, sa, b, sb, lens, **out)


def _scales(v, inp: Inputs, a_shape, b_shape, mx_shapes):
    """Ones: one each (tensorwise), block scales of these shapes (GRAN=block) or e8m0 bytes of the
    mx shapes (a's, b's; GRAN=mx)."""
    if v.get("GRAN") == "mx":
        return tuple(torch.full(s, 127, dtype=torch.uint8, device=inp.device) for s in mx_shapes)
    if v.get("GRAN") == "block":
        return torch.ones(a_shape, device=inp.device), torch.ones(b_shape, device=inp.device)
    return _one(inp), _one(inp)


def _out_kw(v, shape) -> dict:
    """A call's out arguments for variant v: its out_dtype, and for ACCUM=1 accumulate=True
    into an out holding values (a main_grad)."""
    dtype = OUT_DTYPES[v["OUT"]]
    if not v.get("ACCUM"):
        return dict(kw=dict(out_dtype=dtype))
    out = torch.randn(*shape, generator=torch.Generator().manual_seed(11)).to(dtype)
    return dict(kw=dict(out_dtype=dtype, out=out, accumulate=True), out=out)


def _one(inp: Inputs):
    """A tensorwise scale of 1 (a tensor of its own: the plan cache's C++ guard refuses a call that
    passes one tensor twice)."""
    return torch.ones(1, device=inp.device)


def work(kernel, v, groups, m, N, K) -> Work:
    """Forward NT / dgrad NN: groups of m rows; wgrad TN: groups of m contraction rows, out [G, N, K]
    read as [G, M=N, N=K] by the op (the preset passes the wgrad's own M, N)."""
    tn = v["LAYOUT"] in ("TN", "NTK")
    tiles = groups * -(-N // v["BM"]) * -(-K // v["BN"]) if tn else groups * -(-m // v["BM"]) * -(-N // v["BN"])
    bound = tiles if tn else (-(-groups * m // v["BM"]) + groups) * -(-N // v["BN"])
    k_iter = k_per_iteration(kernel, v, v["BM"], v["BN"])
    flops = 2.0 * groups * m * N * K
    if tn:           # per group: out[N, K] (the op's M, N) += a_g^T b_g over m rows
        nbytes, iters = groups * m * (N + K) + 2 * groups * N * K, -(-m // k_iter)
    else:
        nbytes, iters = groups * m * K + groups * N * K + 2 * groups * m * N, -(-K // k_iter)
    if v["FMT"] in HALF:
        nbytes += groups * m * (N + K) if tn else groups * m * K + groups * N * K   # 2-byte operands
    if v["FMT"] == "e2m1":   # half-byte operands and an e8m0 byte per 32 of them
        operands = groups * m * (N + K) if tn else groups * m * K + groups * N * K
        nbytes -= operands // 2 - operands // 32
    rate = {"bf16": "bf16", "f16": "bf16", "e2m1": "mxfp4"}.get(v["FMT"], "fp8")   # fp16: the bf16 MFMA rate
    return Work(flops, nbytes, rate, grid(kernel, v, grid=bound), tiles, tiles * waves(kernel, v) * iters, iters)


def race(kernel, v) -> list:
    """TN (variant forced by config, a workgroup per tile): one K step + a short group (block scales:
    the second group on the next 128-row block). NT / NN / TT (variant forced by config, a
    persistent grid of 1): nine groups, so the group scans run the compiler's 8- and 4-unrolled
    bodies and their remainders, of sizes bm + d, 0 x 7 and bm - d (a partial second row tile;
    d = 2, TT 16: its groups start on multiples of 16); K = three 128-byte steps (384 fp8 or 192
    16-bit elements), so the K loop runs its 2-unrolled body and its remainder step. Then G = 0
    (every row a padded tail): the tail's tile count waits on its own for the load of
    group_offs[G], which any group's scan retires."""
    bm, bn = v["BM"], v["BN"]
    if v["FMT"] == "e2m1":
        return _fp4_race(v, bm, bn)
    qa, qb = (lambda *s, f=f: torch.randn(*s, generator=torch.Generator().manual_seed(7)).to(DTYPES[v[f]])
              for f in ("FMT", "FMT_B"))
    inp = Inputs("data")
    if v["LAYOUT"] == "TN":
        lens = torch.tensor([128, 5] if v.get("GRAN") in ("block", "mx") else [130, 3])
        sa, sb = _scales(v, inp, (2, bm), (2, -(-bn // 128)), ((bm, 5), (bn, 5)))
        out = _out_kw(v, (2, bm, bn))
        out["kw"]["config"] = dict(BM=bm, BN=bn, GROUP_M=2, PERSISTENT=0)
        return [_call(v, False, qa(133, bm), sa, qb(133, bn), sb, lens, **out)]
    d, K = 16 if v["LAYOUT"] == "TT" else 2, 192 if v["FMT"] in HALF else 384
    lens = torch.tensor([bm + d] + [0] * 7 + [bm - d])
    out = _out_kw(v, (2 * bm, bn))
    out["kw"].update(trans_b=v["LAYOUT"] != "NN", trans_a=v["LAYOUT"] == "TT", num_cu=1,
                     config=dict(BM=bm, BN=bn, GROUP_M=2, PERSISTENT=0))
    a = qa(K, 2 * bm) if v["LAYOUT"] == "TT" else qa(2 * bm, K)
    b = qb(9, K, bn) if v["LAYOUT"] == "NN" else qb(9, bn, K)
    sa, sb = _scales(v, inp, (2 * bm, 3), (9, -(-bn // 128), 3), ((2 * bm, 12), (9, bn, 12)))
    tail_out = _out_kw(v, (2 * bm, bn))
    tail_out["kw"].update({k: out["kw"][k] for k in ("trans_b", "trans_a", "num_cu", "config")})
    sa0, sb0 = _scales(v, inp, (2 * bm, 3), (0, -(-bn // 128), 3), ((2 * bm, 12), (0, bn, 12)))
    return [_call(v, True, a, sa, b, sb, lens, **out), _call(v, True, a, sa0, b[:0], sb0, lens[:0], **tail_out)]


def _fp4_race(v, bm, bn) -> list:
    """MXFP4 NT: race()'s nine groups (bm + 2, 0 x 7, bm - 2 rows), K = 640 (two steps and a half:
    the second MFMA of the last step on zeros), persistent grid of 1, then G = 0 (all tail).
    NTK: groups of 32, 0 and 544 (two steps and an eighth) over an M and N of 1.5 tiles; with
    ACCUM, into an out holding values."""
    inp = Inputs("data", seed=7)
    if v["LAYOUT"] == "NTK":
        return [_fp4_call(v, inp, 576, bm + bm // 2, bn + bn // 2, torch.tensor([32, 0, 544]))]
    kw = dict(num_cu=1, config=dict(BM=bm, BN=bn, GROUP_M=2, PERSISTENT=0))
    return [_fp4_call(v, inp, 2 * bm, bn, 640, lens, **kw)
            for lens in (torch.tensor([bm + 2] + [0] * 7 + [bm - 2]), torch.tensor([], dtype=torch.int64))]


def decode(inp: Inputs) -> dict:
    """A training step's MoE layer: 8 experts, 4096 routed rows (fp8 and bf16)."""
    lens = torch.full((8,), 512, dtype=torch.int64)
    return {ROWS: Call(ROWS, (inp.fp8(4096, 2048), _one(inp), inp.fp8(8, 1024, 2048), _one(inp), lens)),
            WGRAD: Call(WGRAD, (inp.fp8(4096, 1024), _one(inp), inp.fp8(4096, 2048), _one(inp), lens)),
            BF16_ROWS: Call(BF16_ROWS, (_bf16(inp, 4096, 2048), _bf16(inp, 8, 1024, 2048), lens)),
            BF16_WGRAD: Call(BF16_WGRAD, (_bf16(inp, 4096, 1024), _bf16(inp, 4096, 2048), lens)),
            FP4_ROWS: Call(FP4_ROWS, (*inp.mx(4096, 2048, fmt="e2m1"), *inp.mx(8, 1024, 2048, fmt="e2m1"), lens)),
            FP4_WGRAD: Call(FP4_WGRAD, (*inp.mx(1024, 4096, fmt="e2m1"), *inp.mx(2048, 4096, fmt="e2m1"), lens))}


def smoke(device) -> list:
    """One forward + backward of each autograd op (three groups, one empty) vs fp32 autograd on the
    same bf16 inputs: out, grad_a, grad_b by SNR (grouped_gemm_fp8: e4m3 tensorwise, 25 dB;
    grouped_gemm_fp4: MXFP4, Primus-Turbo's bar for it, 8 dB)."""
    import mxgemm
    g = torch.Generator().manual_seed(0)
    lens, N, K = [24, 0, 40], 64, 128
    x, w, dy = torch.randn(sum(lens), K, generator=g), torch.randn(len(lens), N, K, generator=g) * 0.05, \
        torch.randn(sum(lens), N, generator=g)
    xf, wf = (t.bfloat16().float().requires_grad_() for t in (x, w))
    yf = torch.cat([xg @ wf[i].T for i, xg in enumerate(xf.split(lens))])
    yf.backward(dy.bfloat16().float())

    def run(fn):
        def once():
            xq, wq = (t.bfloat16().to(device).requires_grad_() for t in (x, w))
            y = fn(xq, wq, torch.tensor(lens, device=device))
            y.backward(dy.bfloat16().to(device))
            return y.detach(), xq.grad, wq.grad
        return once
    shape, ref = f"G={len(lens)} (rows {lens}) N={N} K={K}, out / grad_a / grad_b", (yf.detach(), xf.grad, wf.grad)
    return [Smoke(f"{AUTOGRAD} e4m3 {shape}", run(mxgemm.grouped_gemm_fp8), ref, Contract(snr_db=25.0)),
            Smoke(f"{FP4_AUTOGRAD} MXFP4 {shape}", run(mxgemm.grouped_gemm_fp4), ref, Contract(snr_db=8.0))]


def _variant(layout, m, N):
    """The planner's untuned tile for m rows per group (NT / NN) or m output rows (TN)."""
    from ..ops.train_grouped_gemm import heuristic_config
    cfg = heuristic_config(layout, 1, m, N)
    return registry.find_variant(registry.get(KERNEL), LAYOUT=layout, FMT="e4m3", FMT_B="e4m3", OUT="bf16",
                                 BM=cfg["BM"], BN=cfg["BN"])


def preset_deepseek_v3():
    """DeepSeek-V3 MoE (hidden 7168, inter 2048) with 8 local experts of 4096 routed rows each."""
    out, source = [], "Primus-Turbo PR #384 (per-shape TFLOPS not found)"
    for name, N, K in (("gemm1", 2 * 2048, 7168), ("gemm2", 7168, 2048)):
        for layout, (n, k) in (("NT", (N, K)), ("NN", (K, N))):
            out.append(Case(KERNEL, _variant(layout, 4096, n), dict(groups=8, m=4096, N=n, K=k),
                            f"DSV3 {name} {'fwd' if layout == 'NT' else 'dgrad'} G=8 M=4096", "not found", source))
        out.append(Case(KERNEL, _variant("TN", N, K), dict(groups=8, m=4096, N=N, K=K), f"DSV3 {name} wgrad G=8 M=4096",
                        "not found", source))
    return out


SPEC = OpSpec(
    name="train_grouped_gemm", ops=(ROWS, WGRAD, AUTOGRAD, BF16_ROWS, BF16_WGRAD, FP4_ROWS, FP4_WGRAD, FP4_AUTOGRAD),
    kernels=(KERNEL,),
    # the mutation harness runs them in order (-x), every variant rebuilt for a mutated source: the fp4 and bf16
    # tests first, they compile fewer variants (an FP4-path mutation is caught before the 100+ fp8 variants build)
    tests=("tests/test_grouped_gemm_fp4.py", "tests/test_grouped_gemm_bf16.py", "tests/test_grouped_gemm_fp8.py",
           "tests/test_grouped_gemm_fp4_autograd.py"),
    reference=("grouped_gemm_fp8_ref", "grouped_gemm_fp8_variable_k_ref", "grouped_gemm_bf16_ref",
               "grouped_gemm_bf16_variable_k_ref", "grouped_gemm_fp4_ref", "grouped_gemm_fp4_variable_k_ref"),
    hardware_script="op_tests/test_grouped_gemm_fp8.py",
    contract=BITWISE, call=call, work=work, race=race, decode=decode, smoke=smoke,
    presets={"grouped_fp8": preset_deepseek_v3})
