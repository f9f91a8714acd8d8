"""reference.py spec. Every op is checked two independent ways on small random cases:
  * bitwise against a numpy restatement of the documented accumulation model, decoding
    elements and scales with ml_dtypes (exact float64 chunk sums, fp32 running sum), and
  * against a plain float64 einsum of the dequantised operands, within the fp32
    summation error bound plus bf16 rounding.
"""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from mxgemm import reference as R
from mxgemm.metrics import assert_bitwise_equal
from mxgemm.routing import moe_sorting

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
f32, bf16 = np.float32, ml_dtypes.bfloat16


# ---- independent decoding (ml_dtypes) ----
def np_vals(codes: torch.Tensor, fmt: str) -> np.ndarray:
    c = codes.view(torch.uint8).numpy() if codes.dtype != torch.uint8 else codes.numpy()
    if fmt == "e2m1":  # byte i holds elements 2i (low nibble) and 2i+1 (high nibble)
        c = np.stack([c & 0xF, c >> 4], -1).reshape(*c.shape[:-1], -1)
    return c.astype(np.uint8).view(ML[fmt]).astype(np.float64)


def np_e8m0(s: torch.Tensor) -> np.ndarray:
    return s.numpy().view(ml_dtypes.float8_e8m0fnu).astype(np.float64)


def np_accumulate(a, b, chunk, combine=lambda c, p: p.astype(f32)):
    """numpy model: exact float64 chunk sums, fp32 running sum in chunk order."""
    acc = np.zeros((a.shape[0], b.shape[0]), f32)
    for c, k in enumerate(range(0, a.shape[1], chunk)):
        acc = (acc + combine(c, np.einsum("mk,nk->mn", a[:, k:k + chunk], b[:, k:k + chunk]))).astype(f32)
    return acc


def np_mx_dot(a, sa, b, sb):
    """a, b float64 values; sa, sb float64 scales per 32-block."""
    return np_accumulate(a, b, 32, lambda c, p: (p * sa[:, c, None] * sb[None, :, c]).astype(f32))


def to_bf16_torch(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x.astype(bf16)).view(np.int16)).view(torch.bfloat16)


def assert_near_exact(out: torch.Tensor, exact: np.ndarray, abs_terms: np.ndarray, nchunks: int, name: str):
    """|out - exact| <= fp32 sequential-sum bound (nchunks+2) u sum|terms| + bf16 half-ulp."""
    half_ulp = 2.0**-8 if out.dtype == torch.bfloat16 else 2.0**-24
    bound = (nchunks + 2) * 2.0**-24 * abs_terms * (1 + half_ulp) + half_ulp * np.abs(exact) + 1e-38
    err = np.abs(out.double().numpy() - exact)
    assert (err <= bound).all(), f"{name}: worst excess {np.max(err - bound)}"


# ---- random operands ----
def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand_codes(shape, fmt, g) -> torch.Tensor:
    """Realistic finite codes: N(0,1) scaled by 2^[-4, 4], cast by ml_dtypes (fp4: uniform codes, packed)."""
    if fmt == "e2m1":
        c = torch.randint(0, 16, (*shape[:-1], shape[-1]), generator=g, dtype=torch.uint8)
        return c[..., 0::2] | (c[..., 1::2] << 4)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-4, 5, shape, generator=g).float())
    u8 = torch.from_numpy(np.clip(x.numpy(), -400, 400).astype(ML[fmt]).view(np.uint8).copy())
    return u8.view(TORCH_FP8[fmt])


def rand_e8m0(shape, g, lo=117, hi=137) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.uint8)


# ---- MX GEMM (gfx1250 FP8xFP8, FP4xFP4, A8W4) and small-M MXFP8 ----
@pytest.mark.parametrize("a_fmt,b_fmt", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e2m1", "e2m1"), ("e4m3", "e2m1")])
def test_mx_gemm(a_fmt, b_fmt):
    g, M, N, K = gen(0), 5, 7, 256
    a, b = rand_codes((M, K), a_fmt, g), rand_codes((N, K), b_fmt, g)
    sa, sb = rand_e8m0((M, K // 32), g), rand_e8m0((N, K // 32), g)
    acc = R.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt, out_dtype=torch.float32)
    av, bv = np_vals(a, a_fmt), np_vals(b, b_fmt)
    ea, eb = np.repeat(np_e8m0(sa), 32, 1), np.repeat(np_e8m0(sb), 32, 1)
    model = np_mx_dot(av, np_e8m0(sa), bv, np_e8m0(sb))
    assert_bitwise_equal(acc, torch.from_numpy(model), "fp32 accumulator")
    assert_bitwise_equal(R.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt), to_bf16_torch(model), "bf16 out")
    exact = np.einsum("mk,nk->mn", av * ea, bv * eb)
    terms = np.einsum("mk,nk->mn", np.abs(av * ea), np.abs(bv * eb))
    assert_near_exact(R.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt), exact, terms, K // 32, "vs float64")


def f32_rne_of(x: Fraction) -> np.float32:
    """The fp32 nearest to the rational x (ties to the even code), by exact comparison."""
    f = f32(float(x))
    cands = [np.nextafter(f, f32(-np.inf)), f, np.nextafter(f, f32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))


@pytest.mark.parametrize("a_fmt,b_fmt,splits", [("e4m3", "e4m3", 1), ("e5m2", "e5m2", 2), ("e2m1", "e2m1", 3),
                                                ("e4m3", "e2m1", 1)])
def test_mx_gemm_mma_chunks(a_fmt, b_fmt, splits):
    """chunk=128 (the scaled MMA): each 128-K step's scaled products summed as exact rationals
    and rounded once to fp32; split partials from +0, then added in split order. Scales span
    2^-37 .. 2^32 so that float64 chunk sums would round (the reference's exact path)."""
    g, M, N, K = gen(9), 5, 7, 512
    a, b = rand_codes((M, K), a_fmt, g), rand_codes((N, K), b_fmt, g)
    sa, sb = rand_e8m0((M, K // 32), g, 90, 160), rand_e8m0((N, K // 32), g, 90, 160)
    xa = [[Fraction(v) for v in row] for row in np_vals(a, a_fmt) * np.repeat(np_e8m0(sa), 32, 1)]
    xb = [[Fraction(v) for v in row] for row in np_vals(b, b_fmt) * np.repeat(np_e8m0(sb), 32, 1)]
    chunks = [[[f32_rne_of(sum(x * y for x, y in zip(ra[k:k + 128], rb[k:k + 128]))) for rb in xb] for ra in xa]
              for k in range(0, K, 128)]
    per = -(-len(chunks) // splits)
    acc = np.zeros((M, N), f32)
    for s0 in range(0, len(chunks), per):
        part = np.zeros((M, N), f32)
        for c in chunks[s0:s0 + per]:
            part = (part + np.array(c, f32)).astype(f32)
        acc = (acc + part).astype(f32)
    got = R.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt, out_dtype=torch.float32, chunk=R.MX_MMA_K, splits=splits)
    assert_bitwise_equal(got, torch.from_numpy(acc), "fp32 accumulator")
    assert_bitwise_equal(R.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt, chunk=R.MX_MMA_K, splits=splits),
                         to_bf16_torch(acc), "bf16 out")


def test_mx_gemm_single_block_is_correctly_rounded():
    # one 32-block: the only rounding is exact sum -> fp32, so the result is fl32(exact)
    g = gen(1)
    a, b = rand_codes((9, 32), "e4m3", g), rand_codes((11, 32), "e4m3", g)
    sa, sb = rand_e8m0((9, 1), g, 100, 150), rand_e8m0((11, 1), g, 100, 150)
    exact = np.einsum("mk,nk->mn", np_vals(a, "e4m3") * np_e8m0(sa), np_vals(b, "e4m3") * np_e8m0(sb))
    assert_bitwise_equal(R.mx_gemm_ref(a, sa, b, sb, out_dtype=torch.float32),
                         torch.from_numpy(exact.astype(f32)), "single block")


def test_mx_gemm_k_lanes_sums_each_lane_then_the_lanes():
    """Chunk sums 1, 2^-24, -1 (one non-zero product per 32-block, scales 2^0, 2^-24, 2^0): in K
    order 1 + 2^-24 rounds to 1 (a tie, to even) and the sum is 0; with 2 lanes, lane 0 holds
    1 + -1 = 0 and lane 1 2^-24, so the sum is 2^-24; with 3 lanes each holds one chunk and the
    lane-order sum is the K-order one."""
    a = torch.zeros(1, 96)
    a[0, 0], a[0, 32], a[0, 64] = 1.0, 1.0, -1.0
    b = torch.zeros(1, 96)
    b[0, 0], b[0, 32], b[0, 64] = 1.0, 1.0, 1.0
    sa = torch.tensor([[127, 127 - 24, 127]], dtype=torch.uint8)
    sb = torch.full((1, 3), 127, dtype=torch.uint8)
    fp8 = TORCH_FP8["e4m3"]
    got = {k: R.mx_gemm_ref(a.to(fp8), sa, b.to(fp8), sb, out_dtype=torch.float32, k_lanes=k).item() for k in (1, 2, 3)}
    assert got == {1: 0.0, 2: 2.0 ** -24, 3: 0.0}


def test_smallm_mxfp8_is_e4m3_mx_gemm():
    g = gen(2)
    a, b = rand_codes((2, 128), "e4m3", g), rand_codes((16, 128), "e4m3", g)
    sa, sb = rand_e8m0((2, 4), g), rand_e8m0((16, 4), g)
    out = R.smallm_mxfp8_gemm_ref(a, sa, b, sb)
    model = np_mx_dot(np_vals(a, "e4m3"), np_e8m0(sa), np_vals(b, "e4m3"), np_e8m0(sb))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 16)
    assert_bitwise_equal(out, to_bf16_torch(model), "smallm")


# ---- MoE ----
def routed(T, E, topk, block_m, seed):
    g = gen(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)])
    w = torch.rand(T, topk, generator=g)
    return moe_sorting(ids, w, E, block_m), g


def np_sorted_rows(s, block_m):
    n = int(s.num_valid_ids[0])
    ids = s.sorted_token_ids[:n].numpy().astype(np.int64)
    return [(p, int(ids[p] & 0xFFFFFF), int(ids[p] >> 24), int(s.sorted_expert_ids[p // block_m])) for p in range(n)]


@pytest.mark.parametrize("weighted", [False, True])
def test_moe_mxfp8_grouped_gemm(weighted):
    T, E, topk, N, K, block_m = 6, 4, 2, 8, 256, 4
    s, g = routed(T, E, topk, block_m, seed=3)
    a, sa = rand_codes((T, K), "e4m3", g), rand_e8m0((T, K // 32), g)
    w, sw = rand_codes((E, N, K), "e4m3", g), rand_e8m0((E, N, K // 32), g)
    args = (a, sa, w, sw, s.sorted_token_ids, s.sorted_expert_ids, s.num_valid_ids, block_m)
    kw = {"sorted_weights": s.sorted_weights} if weighted else {}
    out = R.moe_mxfp8_grouped_gemm_ref(*args, topk, out_dtype=torch.float32, **kw)
    want = np.zeros((T, topk, N), f32)   # route order: every route is a sorted row's
    av, wv = np_vals(a, "e4m3"), np_vals(w, "e4m3")
    for p, t, slot, e in np_sorted_rows(s, block_m):
        if t < T:
            want[t, slot] = np_mx_dot(av[t:t + 1], np_e8m0(sa)[t:t + 1], wv[e], np_e8m0(sw)[e])[0]
            want[t, slot] *= f32(s.sorted_weights[p]) if weighted else f32(1)
    assert_bitwise_equal(out, torch.from_numpy(want), "moe gemm1 fp32")
    assert_bitwise_equal(R.moe_mxfp8_grouped_gemm_ref(*args, topk, **kw), to_bf16_torch(want), "moe gemm1 bf16")


@pytest.mark.parametrize("permute", [False, True])
def test_moe_gemm2_a4w4_bf16_atomics(permute):
    T, E, topk, N, K, block_m = 5, 3, 3, 6, 256, 4
    s, g = routed(T, E, topk, block_m, seed=4)
    a, sa = rand_codes((T * topk, K), "e2m1", g), rand_e8m0((T * topk, K // 32), g, 125, 130)
    w, sw = rand_codes((E, N, K), "e2m1", g), rand_e8m0((E, N, K // 32), g, 125, 130)
    rows = [r for r in np_sorted_rows(s, block_m) if r[1] < T]
    order = [r[0] for r in rows]
    if permute:
        order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
    out = R.moe_gemm2_a4w4_ref(a, sa, w, sw, s.sorted_token_ids, s.sorted_weights, s.sorted_expert_ids,
                               s.num_valid_ids, block_m, topk, order=torch.tensor(order) if permute else None)
    by_pos = {p: (t, k, e) for p, t, k, e in rows}
    av, wv = np_vals(a, "e2m1"), np_vals(w, "e2m1")
    want = np.zeros((T, N), bf16)
    exact = np.zeros((T, N))
    for p in order:
        t, k, e = by_pos[p]
        r = t * topk + k
        acc = np_mx_dot(av[r:r + 1], np_e8m0(sa)[r:r + 1], wv[e], np_e8m0(sw)[e])[0]
        v = (f32(s.sorted_weights[p]) * acc).astype(bf16)
        want[t] = (want[t].astype(f32) + v.astype(f32)).astype(bf16)
        exact[t] += float(s.sorted_weights[p]) * np.einsum(
            "k,nk->n", av[r] * np.repeat(np_e8m0(sa)[r], 32), wv[e] * np.repeat(np_e8m0(sw)[e], 32, 1))
    assert_bitwise_equal(out, to_bf16_torch(want), "moe gemm2")
    # float64 check: topk bf16 roundings of the terms plus topk bf16 adds
    err = np.abs(out.double().numpy() - exact)
    assert (err <= 2 * topk * 2.0**-8 * np.abs(exact).max(1, keepdims=True) + 1e-30).all()


# ---- FP8 tensorwise grouped GEMM ----
def np_tensorwise(a, b, scale):
    return np_accumulate(a, b, 128) * (f32(scale[0]) * f32(scale[1]))  # one fp32 scale product


GROUP_OFFS = torch.tensor([0, 3, 3, 140, 150], dtype=torch.int64)  # includes an empty group


def tensorwise_case(seed):
    g = gen(seed)
    sc = (torch.rand((), generator=g) + 0.5, torch.rand((), generator=g) * 3)
    return g, sc, [float(sc[0]), float(sc[1])]


def test_grouped_fp8_fwd():
    g, (s1, s2), sc = tensorwise_case(5)
    a, b = rand_codes((150, 256), "e4m3", g), rand_codes((4, 10, 256), "e4m3", g)
    av, bv = np_vals(a, "e4m3"), np_vals(b, "e4m3")
    want = np.concatenate([np_tensorwise(av[s:e], bv[gi], sc) for gi, (s, e) in
                           enumerate(zip(GROUP_OFFS[:-1].tolist(), GROUP_OFFS[1:].tolist()))])
    out = R.grouped_gemm_fp8_ref(a, s1, b, s2, GROUP_OFFS)
    assert_bitwise_equal(R.grouped_gemm_fp8_ref(a, s1, b, s2, GROUP_OFFS, out_dtype=torch.float32), torch.from_numpy(want), "fwd fp32")
    assert_bitwise_equal(out, to_bf16_torch(want), "fwd")
    assert_bitwise_equal(R.grouped_gemm_fp8_ref(a, s1, b, s2, GROUP_OFFS, out_dtype=torch.float16),
                         torch.from_numpy(want.astype(np.float16)), "fwd fp16")  # numpy f32 -> f16 is RNE
    gi = np.searchsorted(GROUP_OFFS.numpy(), np.arange(150), side="right") - 1
    exact = np.einsum("mk,mnk->mn", av, bv[gi]) * sc[0] * sc[1]
    terms = np.einsum("mk,mnk->mn", np.abs(av), np.abs(bv[gi])) * sc[0] * sc[1]
    assert_near_exact(out, exact, terms, 2, "fwd vs float64")


def test_grouped_fp8_dgrad():
    g, (s1, s2), sc = tensorwise_case(6)
    dy, b = rand_codes((150, 200), "e5m2", g), rand_codes((4, 200, 24), "e4m3", g)
    dyv, bv = np_vals(dy, "e5m2"), np_vals(b, "e4m3")
    gi = np.searchsorted(GROUP_OFFS.numpy(), np.arange(150), side="right") - 1
    want = np.stack([np_tensorwise(dyv[m:m + 1], bv[gi[m]].T, sc)[0] for m in range(150)])
    out = R.grouped_gemm_fp8_ref(dy, s1, b, s2, GROUP_OFFS, trans_b=False)
    assert_bitwise_equal(R.grouped_gemm_fp8_ref(dy, s1, b, s2, GROUP_OFFS, trans_b=False, out_dtype=torch.float32), torch.from_numpy(want), "dgrad fp32")
    assert_bitwise_equal(out, to_bf16_torch(want), "dgrad")
    exact = np.einsum("mn,mnk->mk", dyv, bv[gi]) * sc[0] * sc[1]
    terms = np.einsum("mn,mnk->mk", np.abs(dyv), np.abs(bv[gi])) * sc[0] * sc[1]
    assert_near_exact(out, exact, terms, 2, "dgrad vs float64")


def test_grouped_fp8_wgrad_variable_k():
    g, (s1, s2), sc = tensorwise_case(7)
    dy, x = rand_codes((150, 12), "e5m2", g), rand_codes((150, 20), "e4m3", g)
    dyv, xv = np_vals(dy, "e5m2"), np_vals(x, "e4m3")
    out = R.grouped_gemm_fp8_variable_k_ref(dy, s1, x, s2, GROUP_OFFS)
    out32 = R.grouped_gemm_fp8_variable_k_ref(dy, s1, x, s2, GROUP_OFFS, torch.float32)
    assert out.shape == (4, 12, 20) and (out[1] == 0).all()  # empty group -> 0
    for gi, (s, e) in enumerate(zip(GROUP_OFFS[:-1].tolist(), GROUP_OFFS[1:].tolist())):
        want = np_tensorwise(dyv[s:e].T, xv[s:e].T, sc)
        assert_bitwise_equal(out32[gi], torch.from_numpy(want), f"wgrad group {gi} fp32")
        assert_bitwise_equal(out[gi], to_bf16_torch(want), f"wgrad group {gi}")
        exact = dyv[s:e].T @ xv[s:e] * sc[0] * sc[1]
        terms = np.abs(dyv[s:e]).T @ np.abs(xv[s:e]) * sc[0] * sc[1]
        assert_near_exact(out[gi], exact, terms, -(-(e - s) // 128), f"wgrad {gi} vs float64")


# ---- DeepGEMM block-scale grouped GEMM ----
def np_blockscale(av, sa, bv, sb, ue8m0=False):
    """av [M, K] values, sa [M, K/128] fp32, bv [N, K], sb [ceil(N/128), K/128] fp32.
    fp32 scales: fp32(chunk) * fp32(sa*sb); e8m0 scales: fp32(chunk * sa * sb) (one rounding)."""
    sbn = np.repeat(sb, 128, 0)[:bv.shape[0]]
    if ue8m0:
        return np_accumulate(av, bv, 128, lambda c, p: (p * sa[:, c, None].astype(np.float64)
                                                        * sbn[None, :, c].astype(np.float64)).astype(f32))
    return np_accumulate(av, bv, 128, lambda c, p: p.astype(f32) * (sa[:, c, None] * sbn[None, :, c]).astype(f32))


def blockscale_operands(g, G, M, N, K, ue8m0):
    a, b = rand_codes((*M, K), "e4m3", g), rand_codes((G, N, K), "e4m3", g)
    nk, nn = -(-K // 128), -(-N // 128)
    if ue8m0:
        sa, sb = rand_e8m0((*M, nk), g), rand_e8m0((G, nn, nk), g)
        return a, sa, b, sb, np_e8m0(sa).astype(f32), np_e8m0(sb).astype(f32)
    sa, sb = torch.rand((*M, nk), generator=g) / 100, torch.rand((G, nn, nk), generator=g) / 100
    return a, sa, b, sb, sa.numpy(), sb.numpy()


@pytest.mark.parametrize("ue8m0", [False, True])
def test_m_grouped_contiguous(ue8m0):
    g = gen(8)
    G, M, N, K = 3, 20, 192, 640
    a, sa, b, sb, nsa, nsb = blockscale_operands(g, G, (M,), N, K, ue8m0)
    layout = torch.randint(-1, G, (M,), generator=g, dtype=torch.int32)
    out = R.m_grouped_fp8_gemm_nt_contiguous_ref(a, sa, b, sb, layout)
    av, bv = np_vals(a, "e4m3"), np_vals(b, "e4m3")
    want = np.zeros((M, N), f32)
    for m, gi in enumerate(layout.tolist()):
        if gi >= 0:
            want[m] = np_blockscale(av[m:m + 1], nsa[m:m + 1], bv[gi], nsb[gi], ue8m0)[0]
    out32 = R.m_grouped_fp8_gemm_nt_contiguous_ref(a, sa, b, sb, layout, torch.float32)
    assert_bitwise_equal(out32, torch.from_numpy(want), "contiguous fp32")
    assert_bitwise_equal(out, to_bf16_torch(want), "contiguous")
    ea = av * np.repeat(nsa, 128, 1).astype(np.float64)
    for m, gi in enumerate(layout.tolist()):
        eb = bv[gi] * np.repeat(np.repeat(nsb[gi], 128, 0)[:N], 128, 1).astype(np.float64)
        exact, terms = (ea[m] @ eb.T, np.abs(ea[m]) @ np.abs(eb).T) if gi >= 0 else (np.zeros(N), np.zeros(N))
        assert_near_exact(out[m], exact, 2 * terms, K // 128, f"row {m} vs float64")


def test_m_grouped_masked():
    g = gen(9)
    G, Mmax, N, K = 3, 8, 128, 640
    a, sa, b, sb, nsa, nsb = blockscale_operands(g, G, (G, Mmax), N, K, False)
    masked_m = torch.tensor([8, 0, 5], dtype=torch.int32)
    out = R.m_grouped_fp8_gemm_nt_masked_ref(a, sa, b, sb, masked_m)
    av, bv = np_vals(a, "e4m3"), np_vals(b, "e4m3")
    want = np.zeros((G, Mmax, N), f32)
    for gi, m in enumerate(masked_m.tolist()):
        want[gi, :m] = np_blockscale(av[gi, :m], nsa[gi, :m], bv[gi], nsb[gi])
    out32 = R.m_grouped_fp8_gemm_nt_masked_ref(a, sa, b, sb, masked_m, torch.float32)
    assert_bitwise_equal(out32, torch.from_numpy(want), "masked fp32")
    assert_bitwise_equal(out, to_bf16_torch(want), "masked")
    for gi, m in enumerate(masked_m.tolist()):
        ea = av[gi, :m] * np.repeat(nsa[gi, :m], 128, 1)
        eb = bv[gi] * np.repeat(np.repeat(nsb[gi], 128, 0), 128, 1)
        assert_near_exact(out[gi, :m], ea @ eb.T, 2 * np.abs(ea) @ np.abs(eb).T, K // 128, f"group {gi}")
