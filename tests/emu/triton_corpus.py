"""Peer kernels for the emulator: Triton kernels compiled for gfx950 by Triton's own compiler
(the Triton wheel; no GPU: ``triton.compile`` with a hip target), each with its inputs and a
torch reference. Triton emits code mxgemm's kernels never do (its own buffer-op addressing,
scheduling, reductions through LDS), which is what a corpus of peers is for.

The kernels follow the algorithms of Triton's tutorials (vector add, fused softmax, layer norm,
matmul, low-memory dropout's element-wise style, fused attention) and the `tl.dot_scaled` MX
matmul vLLM / SGLang use on ROCm; they are written here. A case is (kernel, constexprs, grid,
warps, inputs, reference, comparison)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from mxgemm.timing.peers import launch_triton, triton_gfx950


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def softmax(x, out, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + row * cols + offs, mask=offs < cols, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(out + row * cols + offs, e / tl.sum(e, axis=0), mask=offs < cols)


@triton.jit
def log_softmax(x, out, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + row * cols + offs, mask=offs < cols, other=-float("inf"))
    s = v - tl.max(v, axis=0)
    tl.store(out + row * cols + offs, s - tl.log(tl.sum(tl.exp(s), axis=0)), mask=offs < cols)


@triton.jit
def layer_norm(x, w, b, out, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < cols
    v = tl.load(x + row * cols + offs, mask=m, other=0.0)
    mean = tl.sum(v, axis=0) / cols
    d = tl.where(m, v - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    y = d * rstd * tl.load(w + offs, mask=m) + tl.load(b + offs, mask=m)
    tl.store(out + row * cols + offs, y, mask=m)


@triton.jit
def rms_norm(x, w, out, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < cols
    v = tl.load(x + row * cols + offs, mask=m, other=0.0).to(tl.float32)
    y = v / tl.sqrt(tl.sum(v * v, axis=0) / cols + eps) * tl.load(w + offs, mask=m).to(tl.float32)
    tl.store(out + row * cols + offs, y.to(tl.bfloat16), mask=m)


@triton.jit
def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACC_INT: tl.constexpr):
    """c[M, N] = a[M, K] @ b[K, N], row-major, masked edges; fp32 (or int32) accumulation."""
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.int32 if ACC_INT else tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        x = tl.load(a + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        y = tl.load(b + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def mx_matmul(a, a_scale, b, b_scale, c, M, N, K, FMT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr):
    """c[M, N] (bf16) = a[M, K] b[N, K]^T with e8m0 scales [rows, K / 32] (tl.dot_scaled); FMT
    'e4m3' (one byte per element) or 'e2m1' (two per byte, K packed)."""
    PACK: tl.constexpr = 2 if FMT == "e2m1" else 1
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm, rn = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN)
    rkp, rks = tl.arange(0, BK // PACK), tl.arange(0, BK // 32)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K // BK):
        x = tl.load(a + rm[:, None] * (K // PACK) + k * (BK // PACK) + rkp[None, :])
        y = tl.load(b + rn[:, None] * (K // PACK) + k * (BK // PACK) + rkp[None, :])
        xs = tl.load(a_scale + rm[:, None] * (K // 32) + k * (BK // 32) + rks[None, :])
        ys = tl.load(b_scale + rn[:, None] * (K // 32) + k * (BK // 32) + rks[None, :])
        acc = tl.dot_scaled(x, xs, FMT, y.T, ys, FMT, acc)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def transpose(x, out, R, C, B: tl.constexpr):
    r, c = tl.program_id(0) * B + tl.arange(0, B), tl.program_id(1) * B + tl.arange(0, B)
    m = (r[:, None] < R) & (c[None, :] < C)
    tile = tl.load(x + r[:, None] * C + c[None, :], mask=m)
    tl.store(out + c[None, :] * R + r[:, None], tile, mask=m)


@triton.jit
def gelu_tanh(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m).to(tl.float32)
    inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    t = 2 * tl.sigmoid(2 * inner) - 1                       # tanh
    tl.store(out + offs, (0.5 * v * (1 + t)).to(tl.float16), mask=m)


@triton.jit
def swiglu(g, u, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(g + offs, mask=m)
    tl.store(out + offs, a * tl.sigmoid(a) * tl.load(u + offs, mask=m), mask=m)


@triton.jit
def row_sum_atomic(x, out, cols, BLOCK: tl.constexpr):
    """out[0] += sum of row program_id(0): every program adds its row into one float."""
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + tl.program_id(0) * cols + offs, mask=offs < cols, other=0.0)
    tl.atomic_add(out, tl.sum(v, axis=0))


@triton.jit
def row_argmax(x, out, cols, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + tl.program_id(0) * cols + offs, mask=offs < cols, other=-float("inf"))
    tl.store(out + tl.program_id(0), tl.argmax(v, axis=0))


@triton.jit
def row_cumsum(x, out, cols, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < cols
    v = tl.load(x + tl.program_id(0) * cols + offs, mask=m, other=0)
    tl.store(out + tl.program_id(0) * cols + offs, tl.cumsum(v, axis=0), mask=m)


@triton.jit
def embedding(ids, table, out, dim, BLOCK: tl.constexpr):
    row = tl.load(ids + tl.program_id(0))
    offs = tl.arange(0, BLOCK)
    m = offs < dim
    tl.store(out + tl.program_id(0) * dim + offs, tl.load(table + row * dim + offs, mask=m), mask=m)


@triton.jit
def histogram(x, bins, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.atomic_add(bins + tl.load(x + offs, mask=m, other=0), 1, mask=m)


@triton.jit
def attention(q, k, v, out, seq, scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """One head: out = softmax(q k^T * scale) v, rows of q in blocks of BM, keys in blocks of BN
    with the online softmax (running max and sum)."""
    rm, rn, rd = tl.program_id(0) * BM + tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, D)
    qt = tl.load(q + rm[:, None] * D + rd[None, :])
    m_i = tl.full((BM,), -float("inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for start in range(0, seq, BN):
        kt = tl.load(k + (start + rn)[:, None] * D + rd[None, :])
        s = tl.dot(qt, tl.trans(kt)) * scale
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(v + (start + rn)[:, None] * D + rd[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), vt)
        m_i = m_new
    tl.store(out + rm[:, None] * D + rd[None, :], (acc / l_i[:, None]).to(tl.float16))


_TY = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int32: "*i32",
       torch.int64: "*i64", torch.int8: "*i8", torch.uint8: "*u8", torch.float8_e4m3fn: "*fp8e4nv"}


@dataclass
class Case:
    fn: object
    args: list                  # tensors and scalars in the kernel's order (constexprs apart)
    constexprs: dict
    grid: tuple
    want: object                # torch result(s) the outputs are compared with
    outputs: tuple              # indices into args of the tensors the kernel writes
    warps: int = 4
    atol: float = 0.0
    rtol: float = 0.0
    names: tuple = field(default=())
    spills: bool = False        # compiled so that it spills VGPRs to scratch (checked by the test)

    def signature(self):
        params = [p for p in self.fn.arg_names if p not in self.constexprs]
        return tuple((n, _TY[a.dtype] if isinstance(a, torch.Tensor) else ("fp32" if isinstance(a, float) else "i32"))
                     for n, a in zip(params, self.args))


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _mx(rows, k, fmt, g):
    from mxgemm.quant import quantize_mx
    return quantize_mx(torch.randn(rows, k, generator=g), fmt)


def cases() -> dict:
    from mxgemm import reference
    g = _g(0)
    x = torch.randn(1000, generator=g)
    y = torch.randn(1000, generator=g)
    rows = torch.randn(7, 200, generator=g)
    w, b = torch.randn(200, generator=g), torch.randn(200, generator=g)
    xb, wb = torch.randn(5, 96, generator=g).to(torch.bfloat16), torch.randn(96, generator=g).to(torch.bfloat16)
    a16, b16 = torch.randn(40, 72, generator=g).half(), torch.randn(72, 56, generator=g).half()
    abf, bbf = torch.randn(40, 72, generator=g).bfloat16(), torch.randn(72, 56, generator=g).bfloat16()
    a8, b8 = (torch.randn(40, 96, generator=g) * 2).to(torch.float8_e4m3fn), \
        (torch.randn(96, 64, generator=g) * 2).to(torch.float8_e4m3fn)
    ai, bi = torch.randint(-128, 128, (40, 96), generator=g, dtype=torch.int8), \
        torch.randint(-128, 128, (96, 64), generator=g, dtype=torch.int8)
    (ma, mas), (mb, mbs) = _mx(64, 256, "e4m3", g), _mx(32, 256, "e4m3", g)
    (fa, fas), (fb, fbs) = _mx(64, 256, "e2m1", g), _mx(32, 256, "e2m1", g)
    t = torch.randn(37, 50, generator=g)
    h = torch.randn(1000, generator=g).half()
    ints = torch.randint(-50, 50, (6, 100), generator=g, dtype=torch.int32)
    ids, table = torch.randint(0, 30, (9,), generator=g, dtype=torch.int64), torch.randn(30, 40, generator=g)
    hist = torch.randint(0, 16, (777,), generator=g, dtype=torch.int32)
    q, k, v = (torch.randn(64, 32, generator=g).half() for _ in range(3))
    a32, b32 = torch.randn(100, 64, generator=g), torch.randn(64, 120, generator=g)
    f32 = lambda *s: torch.zeros(*s)  # noqa: E731
    mm_ref = lambda p, r, dt: (p.float() @ r.float()).to(dt)  # noqa: E731
    c = {
        "add": Case(add, [x, y, f32(1000), 1000], {"BLOCK": 256}, (4,), x + y, (2,)),
        "softmax": Case(softmax, [rows, f32(7, 200), 200], {"BLOCK": 256}, (7,), torch.softmax(rows, 1), (1,),
                        atol=1e-6, rtol=1e-5),
        "log_softmax": Case(log_softmax, [rows, f32(7, 200), 200], {"BLOCK": 256}, (7,), torch.log_softmax(rows, 1),
                            (1,), atol=1e-5, rtol=1e-5),
        "layer_norm": Case(layer_norm, [rows, w, b, f32(7, 200), 200, 1e-5], {"BLOCK": 256}, (7,),
                           torch.nn.functional.layer_norm(rows, (200,), w, b, 1e-5), (3,), atol=1e-5, rtol=1e-5),
        "rms_norm_bf16": Case(rms_norm, [xb, wb, torch.zeros(5, 96, dtype=torch.bfloat16), 96, 1e-6], {"BLOCK": 128},
                              (5,), (xb.float() * torch.rsqrt(xb.float().pow(2).mean(1, keepdim=True) + 1e-6)
                                     * wb.float()).bfloat16(), (2,), atol=0, rtol=2 ** -7),
        "matmul_f16": Case(matmul, [a16, b16, torch.zeros(40, 56, dtype=torch.float16), 40, 56, 72],
                           {"BM": 32, "BN": 32, "BK": 32, "ACC_INT": 0}, (2, 2), mm_ref(a16, b16, torch.float16), (2,),
                           atol=1e-2, rtol=1e-3),
        "matmul_bf16": Case(matmul, [abf, bbf, torch.zeros(40, 56, dtype=torch.bfloat16), 40, 56, 72],
                            {"BM": 32, "BN": 32, "BK": 32, "ACC_INT": 0}, (2, 2), mm_ref(abf, bbf, torch.bfloat16),
                            (2,), atol=1e-1, rtol=1e-2),
        "matmul_fp8": Case(matmul, [a8, b8, torch.zeros(40, 64, dtype=torch.float32), 40, 64, 96],
                           {"BM": 32, "BN": 32, "BK": 64, "ACC_INT": 0}, (2, 2), mm_ref(a8, b8, torch.float32), (2,),
                           atol=1e-3, rtol=1e-5),
        # one warp holding a 128 x 128 fp32 accumulator (256 values a lane): Triton 3.9 spills
        # ~1100 VGPRs to scratch; a partial tile (100 x 120) keeps the masks in play
        "matmul_f32_spill": Case(matmul, [a32, b32, f32(100, 120), 100, 120, 64],
                                 {"BM": 128, "BN": 128, "BK": 32, "ACC_INT": 0}, (1, 1), a32 @ b32, (2,), warps=1,
                                 atol=1e-4, rtol=1e-5, spills=True),
        "matmul_int8": Case(matmul, [ai, bi, torch.zeros(40, 64, dtype=torch.int32), 40, 64, 96],
                            {"BM": 32, "BN": 32, "BK": 64, "ACC_INT": 1}, (2, 2), ai.int() @ bi.int(), (2,)),
        "matmul_int8_16x16": Case(matmul, [ai, bi, torch.zeros(40, 64, dtype=torch.int32), 40, 64, 96],
                                  {"BM": 16, "BN": 16, "BK": 64, "ACC_INT": 1}, (3, 4), ai.int() @ bi.int(), (2,)),
        "dot_scaled_mxfp8": Case(mx_matmul, [ma, mas, mb, mbs, torch.zeros(64, 32, dtype=torch.bfloat16), 64, 32, 256],
                                 {"FMT": "e4m3", "BM": 32, "BN": 32, "BK": 128}, (2, 1),
                                 reference.mx_gemm_ref(ma, mas, mb, mbs, "e4m3", "e4m3", torch.bfloat16), (4,),
                                 atol=0, rtol=2 ** -7),
        "dot_scaled_mxfp4": Case(mx_matmul, [fa, fas, fb, fbs, torch.zeros(64, 32, dtype=torch.bfloat16), 64, 32, 256],
                                 {"FMT": "e2m1", "BM": 32, "BN": 32, "BK": 128}, (2, 1),
                                 reference.mx_gemm_ref(fa, fas, fb, fbs, "e2m1", "e2m1", torch.bfloat16), (4,),
                                 atol=0, rtol=2 ** -7),
        "transpose": Case(transpose, [t, f32(50, 37), 37, 50], {"B": 16}, (3, 4), t.T.contiguous(), (1,)),
        "gelu_tanh_f16": Case(gelu_tanh, [h, torch.zeros(1000, dtype=torch.float16), 1000], {"BLOCK": 512}, (2,),
                              torch.nn.functional.gelu(h.float(), approximate="tanh").half(), (1,), atol=1e-3,
                              rtol=1e-3),
        "swiglu": Case(swiglu, [x, y, f32(1000), 1000], {"BLOCK": 256}, (4,), torch.nn.functional.silu(x) * y, (2,),
                       atol=1e-6, rtol=1e-5),
        "row_sum_atomic": Case(row_sum_atomic, [rows, f32(1), 200], {"BLOCK": 256}, (7,), rows.sum().reshape(1), (1,),
                               atol=1e-4, rtol=1e-5),
        "row_argmax": Case(row_argmax, [rows, torch.zeros(7, dtype=torch.int32), 200], {"BLOCK": 256}, (7,),
                           rows.argmax(1).int(), (1,)),
        "row_cumsum_i32": Case(row_cumsum, [ints, torch.zeros(6, 100, dtype=torch.int32), 100], {"BLOCK": 128}, (6,),
                               ints.cumsum(1).int(), (1,)),
        "embedding": Case(embedding, [ids, table, f32(9, 40), 40], {"BLOCK": 64}, (9,), table[ids], (2,)),
        "histogram": Case(histogram, [hist, torch.zeros(16, dtype=torch.int32), 777], {"BLOCK": 256}, (4,),
                          torch.bincount(hist, minlength=16).int(), (1,)),
        "attention": Case(attention, [q, k, v, torch.zeros(64, 32, dtype=torch.float16), 64, 32 ** -0.5],
                          {"D": 32, "BM": 32, "BN": 32}, (2,),
                          torch.softmax(q.float() @ k.float().T * 32 ** -0.5, 1) @ v.float(), (3,),
                          atol=2e-3, rtol=1e-2),
    }
    return c


def assembly(case: Case) -> tuple:
    """(assembly, dynamic LDS bytes) of ``case`` compiled for gfx950 by Triton (cached by Triton)."""
    return triton_gfx950(case.fn, case.signature(), tuple(sorted(case.constexprs.items())), case.warps)


def run(case: Case, emu) -> list:
    """Compile ``case`` for gfx950 with Triton and run it on ``emu``; the written tensors."""
    asm, lds = assembly(case)
    launch_triton(emu, asm, case.fn.__name__, case.args, case.grid, case.warps, lds)
    return [case.args[i] for i in case.outputs]
