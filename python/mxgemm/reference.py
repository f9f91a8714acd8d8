"""Reference ops: the ground truth every kernel test compares against (pure torch, CPU).

Accumulation model (all ops): the reduction dimension is cut into chunks (32 for MX
scales and for bf16 operands (16x16x32 bf16 MFMAs), 128 for mx_gemm's scaled 16x16x128 MMA
steps, for DeepGEMM block scales and for tensorwise FP8). Each chunk's dot product
of the decoded, unscaled elements is computed exactly (float64 holds it exactly: every
e4m3*e4m3 or fp4 product has <= 8 significant bits and a chunk spans < 2^45; for e5m2
operands it is exact unless one chunk spans more than 2^53; mx_gemm's 128-K chunks, whose
four 32-blocks carry their own scales, are summed exactly whatever the span), then scaled
and rounded to fp32 once, and the fp32 chunk partials are added one by one in increasing chunk order
into an fp32 accumulator starting at +0. The output is bf16_rne(accumulator) (fp16 RNE for
out_dtype=torch.float16), or the fp32 accumulator itself with out_dtype=torch.float32 (MoE
gemm2 is bf16 by definition). A kernel whose MFMA sums in another order may differ from this by a
few fp32 ulps of the accumulator, i.e. rarely by 1 bf16 ulp.
"""
import math
import struct
from typing import Optional

import numpy as np
import torch

from . import formats as F
from .quant import MX_BLOCK, mx_values
from .routing import TOKEN_MASK

FP8_BLOCK = 128  # DeepGEMM's 1x128 / 128x128 scale granularity
TENSORWISE_CHUNK = 128  # the K of v_mfma_f32_16x16x128_f8f6f4, one exact sum per chunk


def _accumulate(a: torch.Tensor, b: torch.Tensor, chunk: int, combine=None) -> torch.Tensor:
    """a [M, R], b [N, R] exact element values -> fp32 [M, N] per the model above.

    combine(c, p) maps chunk c's exact float64 partial p [M, N] to the fp32 term added
    (default: round p to fp32)."""
    a, b = a.double(), b.double()
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    for c, k in enumerate(range(0, a.shape[1], chunk)):
        p = a[:, k:k + chunk] @ b[:, k:k + chunk].T
        acc = acc + (p.float() if combine is None else combine(c, p))
    return acc


def _out(acc: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    assert out_dtype in (torch.bfloat16, torch.float16, torch.float32), out_dtype
    if out_dtype == torch.bfloat16:
        return F.bf16_rne(acc)
    return acc.to(torch.float16) if out_dtype == torch.float16 else acc  # torch's f16 cast is RNE


def _fmt(t: torch.Tensor) -> str:
    return "e5m2" if t.dtype == torch.float8_e5m2 else "e4m3"


def _fp32_scale(s: torch.Tensor) -> torch.Tensor:
    """Scales given as fp32 or as uint8 e8m0 codes -> fp32."""
    return F.decode_e8m0(s) if s.dtype == torch.uint8 else s.float()


def _mx_dot(a, a_scale, b, b_scale, a_fmt, b_fmt) -> torch.Tensor:
    """MX-scaled A [M, K] x B [N, K]^T -> fp32 accumulator [M, N]; the chunk scale
    2^(ea + eb - 254) is applied to the exact chunk sum before its single fp32 rounding."""
    sa, sb = F.decode_e8m0(a_scale).double(), F.decode_e8m0(b_scale).double()
    return _accumulate(mx_values(a, a_fmt), mx_values(b, b_fmt), MX_BLOCK,
                       lambda c, p: (p * (sa[:, c, None] * sb[None, :, c])).float())


MX_MMA_K = 128   # K of one scaled 16x16x128 MMA: the mx_gemm kernel's exact-sum chunk


def _f32_of_exact_sum(terms) -> float:
    """fp32 RNE of the exact sum of float64 terms: math.fsum rounds the sum correctly to float64
    and gives the sign of what that rounding dropped; rounding to odd in float64 (53 >= 24 + 2
    bits) then makes the one fp32 rounding correct."""
    s = math.fsum(terms)
    r = math.fsum(terms + [-s])
    if r != 0 and math.isfinite(s) and int.from_bytes(struct.pack("<d", s), "little") & 1 == 0:
        s = math.nextafter(s, math.copysign(math.inf, r))
    return float(np.float32(s))


def _lsb(v: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """A power of two dividing every value (float64), never above the value's own last bit."""
    e = torch.frexp(v.abs())[1].double()
    return torch.where(v == 0, torch.full_like(e, math.inf), torch.exp2(e - 1 - mantissa_bits))


def _mx_chunks(a, a_scale, b, b_scale, a_fmt, b_fmt, chunk) -> list:
    """fp32 [M, N] of each K chunk: the exact sum of its scaled products rounded once (RNE)."""
    av, bv = mx_values(a, a_fmt).double(), mx_values(b, b_fmt).double()
    sa = F.decode_e8m0(a_scale).double().repeat_interleave(MX_BLOCK, 1)
    sb = F.decode_e8m0(b_scale).double().repeat_interleave(MX_BLOCK, 1)
    xa, xb = av * sa, bv * sb                          # exact: power-of-two scaling
    return _exact_chunks(xa, xb, _lsb(av, F.SPECS[a_fmt][1]) * sa, _lsb(bv, F.SPECS[b_fmt][1]) * sb, chunk)


def _exact_chunks(xa, xb, qa, qb, chunk) -> list:
    """fp32 [M, N] of each K chunk of xa [M, K] . xb [N, K]^T (float64 values; qa, qb: powers of
    two dividing each element): the exact sum of the chunk's products rounded once (RNE).

    float64 sums are exact when every term is a multiple of a common quantum q and the sum of
    magnitudes stays below 2^52 q; the elements where that bound fails (e.g. block scales far
    apart within a chunk, or wide-range bf16) are summed exactly by _f32_of_exact_sum."""
    out = []
    for k in range(0, xa.shape[1], chunk):
        ka, kb = xa[:, k:k + chunk], xb[:, k:k + chunk]
        p = ka @ kb.T
        mag = ka.abs() @ kb.abs().T
        q = qa[:, k:k + chunk].min(1).values[:, None] * qb[:, k:k + chunk].min(1).values[None, :]
        r = p.float()
        for i, j in (torch.isfinite(mag) & (mag >= q * 2.0 ** 52)).nonzero().tolist():
            r[i, j] = _f32_of_exact_sum((ka[i] * kb[j]).tolist())   # products are exact in float64
        out.append(r)
    return out


BF16_MMA_K = 32    # K of v_mfma_f32_16x16x32_bf16 / _f16: one exact sum per chunk
BF16_MANTISSA = 7
HALF_MANTISSA = {torch.bfloat16: BF16_MANTISSA, torch.float16: 10}


def _bf16_dot(a, b) -> torch.Tensor:
    """a [M, K], b [N, K] bf16 (or both fp16) -> fp32 [M, N], v_mfma_f32_16x16x32_bf16 (_f16) as the
    emulator executes it (the bf16 / fp16 GEMM kernels' model): each 32-K chunk's exact sum of
    products rounded once to fp32, added into the fp32 accumulator (from +0) in K order, one RNE each."""
    xa, xb = a.double(), b.double()
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    qa, qb = _lsb(xa, HALF_MANTISSA[a.dtype]), _lsb(xb, HALF_MANTISSA[b.dtype])
    for p in _exact_chunks(xa, xb, qa, qb, BF16_MMA_K):
        acc = acc + p
    return acc


def mx_gemm_ref(a, a_scale, b, b_scale, a_fmt: str = "e4m3", b_fmt: str = "e4m3",
                out_dtype: torch.dtype = torch.bfloat16, chunk: int = MX_BLOCK, splits: int = 1,
                k_lanes: int = 1) -> torch.Tensor:
    """MX-scale GEMM: out[m, n] = sum_k A[m, k] * B[n, k] with 1x32 K-block scales.

    a: [M, K] fp8 codes (float8 dtype or uint8), [M, K/2] packed e2m1 or [M, 3K/4] packed
    e2m3 / e3m2 (quantize_mx's payloads); a_scale: [M, K/32] uint8 e8m0; b, b_scale: alike, N rows.
    a_fmt, b_fmt: each of e4m3, e5m2 (FP8), e2m3, e3m2 (FP6) and e2m1 (FP4), in any pair.
    chunk: K summed exactly (with every 32-block's scale) before one fp32 rounding: 32 (the
    module model) or MX_MMA_K = 128 (one scaled 16x16x128 MMA: mxgemm.mx_gemm's numerics).
    splits: the chunks are cut into `splits` contiguous ranges of ceil(chunks / splits) (the
    split-K workgroups); each range is accumulated from +0, then the partials are added in
    range order into +0 (fp32 atomics: any order gives the same bits for splits <= 2).
    k_lanes: the chunks are dealt round-robin to k_lanes lanes (chunk c to lane c % k_lanes), each
    accumulating its own from +0 in K order; the lane sums are then added in lane order into +0
    (the GEMV cores' split of K over lanes and their LDS reduction).
    Returns [M, N] out_dtype (bf16 RNE of the fp32 accumulator, or the accumulator itself).
    """
    if chunk == MX_BLOCK and splits == 1 and k_lanes == 1:
        return _out(_mx_dot(a, a_scale, b, b_scale, a_fmt, b_fmt), out_dtype)
    parts = _mx_chunks(a, a_scale, b, b_scale, a_fmt, b_fmt, chunk)
    if k_lanes > 1:
        groups = [parts[lane::k_lanes] for lane in range(k_lanes)]
    else:
        per = max(-(-len(parts) // splits), 1)   # K = 0: no chunk, the empty sum
        groups = [parts[s:s + per] for s in range(0, len(parts), per)]
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    for group in groups:
        partial = torch.zeros_like(acc)
        for p in group:
            partial = partial + p
        acc = acc + partial
    return _out(acc, out_dtype)


def smallm_mxfp8_gemm_ref(a, a_scale, b, b_scale) -> torch.Tensor:
    """Small-M MXFP8 GEMM: a [M, K] e4m3, a_scale [M, K/32] e8m0, b [N, K] e4m3,
    b_scale [N, K/32] e8m0 -> bf16 [M, N]. Each 32-block's products are exact; the block
    sums are scaled, rounded to fp32 and summed in increasing K (module docstring)."""
    return mx_gemm_ref(a, a_scale, b, b_scale, "e4m3", "e4m3")


def _sorted_rows(sorted_token_ids, sorted_expert_ids, num_valid_ids, block_m, num_tokens):
    """-> (token [n], slot [n], expert [n], real [n]) for the first num_valid rows."""
    n = int(num_valid_ids.reshape(-1)[0])
    ids = sorted_token_ids[:n].long()
    tok, slot = ids & TOKEN_MASK, ids >> 24
    exp = sorted_expert_ids.long()[torch.arange(n) // block_m]
    return tok, slot, exp, (tok < num_tokens) & (exp >= 0)


def moe_mxfp8_grouped_gemm_ref(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                               num_valid_ids, block_m: int, topk: int,
                               sorted_weights: Optional[torch.Tensor] = None,
                               out_dtype: torch.dtype = torch.bfloat16, fmt: str = "e4m3",
                               k_lanes: int = 1, chunk: int = MX_BLOCK) -> torch.Tensor:
    """MoE grouped GEMM (gemm1 style) on the moe_sorting layout, out in route order.

    a: [T, K] e4m3 (one row per token), a_scale [T, K/32] e8m0; w: [E, N, K], w_scale
    [E, N, K/32]. For each sorted row p < num_valid of a route (token(p) < T, its block's
    expert >= 0):
      acc = A[token(p)] . W[expert(block p // block_m)]^T     (fp32, module model)
      acc = acc * sorted_weights[p]                         (fp32, only if given)
      out[token(p), slot(p)] = acc
    -> [T, topk, N] out_dtype; routes no sorted row holds are 0. k_lanes, chunk: as mx_gemm_ref.
    """
    T = a.shape[0]
    tok, slot, exp, real = _sorted_rows(sorted_token_ids, sorted_expert_ids, num_valid_ids, block_m, T)
    acc = torch.zeros(len(tok), w.shape[1], dtype=torch.float32)
    for e in exp[real].unique().tolist():
        rows = (real & (exp == e)).nonzero().squeeze(1)
        acc[rows] = mx_gemm_ref(a[tok[rows]], a_scale[tok[rows]], w[e], w_scale[e], fmt, fmt, torch.float32,
                                chunk=chunk, k_lanes=k_lanes)
    if sorted_weights is not None:
        acc = acc * sorted_weights[:len(tok)].float()[:, None]
    out = torch.zeros(T * topk, w.shape[1], dtype=torch.float32)
    out[tok[real] * topk + slot[real]] = acc[real]
    return _out(out, out_dtype).reshape(T, topk, w.shape[1])


def moe_gemm2_a4w4_ref(a, a_scale, w, w_scale, sorted_token_ids, sorted_weights, sorted_expert_ids,
                       num_valid_ids, block_m: int, topk: int, order: Optional[torch.Tensor] = None,
                       route_rows: bool = False) -> torch.Tensor:
    """a4w4 MXFP4 MoE down-projection with bf16 atomic accumulation into token rows, or
    (route_rows) its addends v as a row per route: [T, topk, N], +0 where no real row routes.

    a: [T*topk, K/2] packed e2m1, row = token*topk + slot; a_scale [T*topk, K/32] e8m0;
    w: [E, N, K/2] packed e2m1, w_scale [E, N, K/32]. For each real sorted row p:
      acc = A[token*topk + slot] . W[expert]^T           (fp32, module model)
      v   = bf16_rne(sorted_weights[p] * acc)           (fp32 product)
      out[token] = bf16_rne(float(out[token]) + float(v))   -- one bf16 atomic add
    applied in increasing sorted position, or in `order` (a permutation of the real
    rows' sorted positions) to model another arrival order. out starts at +0: bf16 [T, N].
    """
    T = a.shape[0] // topk
    tok, slot, exp, real = _sorted_rows(sorted_token_ids, sorted_expert_ids, num_valid_ids, block_m, T)
    val = torch.zeros(len(tok), w.shape[1], dtype=torch.bfloat16)
    for e in exp[real].unique().tolist():
        rows = (real & (exp == e)).nonzero().squeeze(1)
        arow = tok[rows] * topk + slot[rows]
        acc = _mx_dot(a[arow], a_scale[arow], w[e], w_scale[e], "e2m1", "e2m1")
        val[rows] = F.bf16_rne(sorted_weights[rows].float()[:, None] * acc)
    if route_rows:
        out = torch.zeros(T * topk, w.shape[1], dtype=torch.bfloat16)
        out[tok[real] * topk + slot[real]] = val[real]
        return out.reshape(T, topk, -1)
    order = real.nonzero().squeeze(1) if order is None else order.long()
    assert torch.equal(order.sort().values, real.nonzero().squeeze(1)), "order must permute the real rows"
    # Adds to different tokens commute; run the k-th add of every token together.
    t = tok[order]
    by_tok = torch.sort(t, stable=True).indices
    start = torch.searchsorted(t[by_tok], t[by_tok], right=False)
    rank = torch.empty_like(t)
    rank[by_tok] = torch.arange(len(t)) - start
    out = torch.zeros(T, w.shape[1], dtype=torch.bfloat16)
    for r in range(int(rank.max()) + 1 if len(t) else 0):
        sel = order[rank == r]
        out[tok[sel]] = F.bf16_rne(out[tok[sel]].float() + val[sel].float())
    return out


# ---- FP8 / BF16 grouped GEMM (grouped_gemm_fp8: tensorwise, row-wise or 128-block fp32 scales, or bf16) ----
def _scaled_dot(a, sa, b, sb, granularity, out_dtype, old=None, kb0=0) -> torch.Tensor:
    """a [M, R] x b [N, R]^T fp8 -> out_dtype, the contraction summed exactly per TENSORWISE_CHUNK
    (= the f8f6f4 MFMA's K) chunk from the first element of R (fp32 rounding once per chunk).
      tensor / row: acc = the fp32 chunk sums added in order from +0; v = acc * fp32(sa * sb),
        sa a scalar or [M], sb a scalar or [N].
      block: acc = acc + fp32(chunk c) * fp32(sa[:, kb0 + c] * sb[:, kb0 + c]) (three RNE roundings
        per chunk), sa [M, kblocks], sb [N, kblocks]; v = acc.
      mx: sa [M, ceil(R/32)], sb [N, ceil(R/32)] e8m0 (uint8): each 128-wide chunk's products
        times 2^(ea + eb - 254) of their 32-blocks summed exactly, rounded once to fp32 (the scaled
        16x16x128 MFMA, _mx_chunks), added in order into acc from +0; v = acc.
      none (bf16 a and b, no scales): v = _bf16_dot (32-wide chunks, each exact then one fp32
        rounding, acc = fp32(acc + chunk) from +0 in order).
    out = rne(v) or, accumulating into ``old``, rne(v + fp32(old)) (one rounding)."""
    if granularity == "none":
        v = _bf16_dot(a, b)
        return _out(v if old is None else v + old.float(), out_dtype)
    if granularity == "mx":   # the contraction padded with +0 codes to whole 32-blocks
        pad = -a.shape[1] % MX_BLOCK
        av, bv = (torch.nn.functional.pad(t.view(torch.uint8), (0, pad)) for t in (a, b))
        v = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
        for p in _mx_chunks(av, sa.view(torch.uint8), bv, sb.view(torch.uint8), _fmt(a), _fmt(b), MX_MMA_K):
            v = v + p
        return _out(v if old is None else v + old.float(), out_dtype)
    av, bv = F.decode(a, _fmt(a)), F.decode(b, _fmt(b))
    if granularity == "block":
        sa, sb = sa.float(), sb.float()
        v = _accumulate(av, bv, TENSORWISE_CHUNK,
                        lambda c, p: p.float() * (sa[:, kb0 + c, None] * sb[None, :, kb0 + c]))
    else:
        v = _accumulate(av, bv, TENSORWISE_CHUNK) * (sa.float().reshape(-1, 1) * sb.float().reshape(1, -1))
    return _out(v if old is None else v + old.float(), out_dtype)


def _granularity(b_scale, granularity, dims):
    """mx for e8m0 (uint8) scales, tensor for one scale, else the given granularity or that of
    b_scale's rank (dims: rank -> name)."""
    if b_scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return "mx"
    if b_scale.numel() == 1 and b_scale.dim() <= 1:
        return "tensor"
    return granularity or dims[b_scale.dim()]


def _per_column_blocks(sb, n):
    """Block scales of b [rows, kblocks] with rows = n (one per column) or ceil(n / 128) -> [n, kblocks]."""
    return sb if sb.shape[0] == n else sb.repeat_interleave(FP8_BLOCK, 0)[:n]


def grouped_gemm_fp8_ref(a, a_scale, b, b_scale, group_offs, trans_b: bool = True, out_dtype=torch.bfloat16, *,
                         a_mn_major: bool = False, accumulate_into=None, granularity=None) -> torch.Tensor:
    """Groups along the rows of out: for the rows i of group g (group_offs[g] <= i < group_offs[g+1]),
    out[i] = A[i] . B_g^T with A [sum_m, K] = a (a [sum_m, K]) or a^T (a_mn_major: a [K, sum_m]) and
    B_g = b[g] (trans_b: b [G, N, K]) or b[g]^T (b [G, K, N]); fp8 operands. Scales (fp32):
      tensor: a_scale, b_scale one value each;
      row:    a_scale [sum_m] (per out row), b_scale [G, N] (per group and out column);
      block:  a_scale [sum_m, ceil(K/128)], b_scale [G, ceil(N/128) or N, ceil(K/128)] (128x128 or
              one per column), promoted per 128-K chunk (_scaled_dot);
      mx:     a_scale [sum_m, K/32], b_scale [G, N, K/32] e8m0 (uint8), applied per 32-block in
              each 128-K chunk's exact sum (_scaled_dot).
    The granularity is b_scale's (e8m0: mx / one value / rank 2 / rank 3). Rows past group_offs[G] (a padded
    tail) are 0 (accumulating: rne(+0 + old)). accumulate_into: [sum_m, N] of out_dtype, added in
    fp32 before the one rounding."""
    gran = "none" if b_scale is None else _granularity(b_scale, granularity, {2: "row", 3: "block"})
    n = b.shape[1] if trans_b else b.shape[2]
    rows = a.shape[1] if a_mn_major else a.shape[0]
    out = torch.zeros(rows, n, dtype=out_dtype)
    for g, s, e in _groups(group_offs):
        ag = a[:, s:e].T if a_mn_major else a[s:e]
        bg = b[g] if trans_b else b[g].T
        sa, sb = (a_scale, b_scale) if gran in ("tensor", "none") else (a_scale[s:e], b_scale[g])
        if gran == "block":
            sb = _per_column_blocks(sb, n)
        old = None if accumulate_into is None else accumulate_into[s:e]
        out[s:e] = _scaled_dot(ag, sa, bg, sb, gran, out_dtype, old)
    end = int(group_offs[-1])
    if accumulate_into is not None:   # the tail's product is +0: -0 becomes +0
        out[end:] = _out(accumulate_into[end:].float() + 0.0, out_dtype)
    return out


def grouped_gemm_fp8_variable_k_ref(a, a_scale, b, b_scale, group_offs, out_dtype=torch.bfloat16,
                                    accumulate_into=None, granularity=None) -> torch.Tensor:
    """Variable-K (wgrad): a [sum_k, M] fp8, b [sum_k, N] fp8 -> [G, M, N], out[g] = a_g^T b_g over
    the group's rows (empty group -> 0) with the group's scales; chunks start at the group's first
    row. Scales (fp32):
      tensor: one value each;
      row:    a_scale [M] or [G, M] (per out row, shared by the groups or per group), b_scale [N] or [G, N];
      block:  a_scale [ceil(sum_k/128), M], b_scale [ceil(sum_k/128), ceil(N/128) or N] (DeepGEMM's
              K-grouped layout: the 128-row block index is global, every group starts on a
              multiple of 128), promoted per chunk;
      mx:     a_scale [M, ceil(sum_k/32)], b_scale [N, ceil(sum_k/32)] e8m0 (uint8) per 32 rows of
              sum_k (global blocks: every group starts on a multiple of 32).
    granularity "row" or "block" must be given for non-scalar scales. accumulate_into: [G, M, N]
    of out_dtype, the result is then that + the product (fp32 add, one rounding)."""
    gran = "none" if b_scale is None else _granularity(b_scale, granularity, {})
    out = torch.zeros(len(group_offs) - 1, a.shape[1], b.shape[1], dtype=out_dtype)
    for g, s, e in _groups(group_offs):
        old = None if accumulate_into is None else accumulate_into[g]
        sa, sb, kb0 = a_scale, b_scale, 0
        if gran == "row":
            sa, sb = (x[g] if x.dim() == 2 else x for x in (a_scale, b_scale))
        elif gran == "block":
            assert s % FP8_BLOCK == 0, "block scales: each group starts on a 128-row block"
            sa, sb, kb0 = a_scale.T, _per_column_blocks(b_scale.T, b.shape[1]), s // FP8_BLOCK
        elif gran == "mx":
            assert s % MX_BLOCK == 0, "mx scales: each group starts on a 32-row block"
            blocks = slice(s // MX_BLOCK, -(-e // MX_BLOCK))
            sa, sb = a_scale[:, blocks], b_scale[:, blocks]
        out[g] = _scaled_dot(a[s:e].T, sa, b[s:e].T, sb, gran, out_dtype, old, kb0)
    return out


def grouped_gemm_bf16_ref(a, b, group_offs, trans_b: bool = True, out_dtype=torch.bfloat16, *,
                          a_mn_major: bool = False, accumulate_into=None) -> torch.Tensor:
    """grouped_gemm_fp8_ref's groups and layouts (a [sum_m, K] or, a_mn_major, [K, sum_m]; b
    [G, N, K] (trans_b) or [G, K, N]) with bf16 (or both fp16) a and b and no scales: each group's
    product is _bf16_dot (v_mfma_f32_16x16x32_bf16 / _f16 as the emulator executes it: every 32-wide
    contraction chunk summed exactly and rounded once to fp32, the chunks added in order into fp32
    from +0), then + fp32(accumulate_into) and one RNE to out_dtype (or the fp32 value; fp16 out:
    inf past 65504, as the kernel's fp16 store). Tail rows: 0."""
    return grouped_gemm_fp8_ref(a, None, b, None, group_offs, trans_b, out_dtype, a_mn_major=a_mn_major,
                                accumulate_into=accumulate_into)


def grouped_gemm_bf16_variable_k_ref(a, b, group_offs, out_dtype=torch.bfloat16, accumulate_into=None) -> torch.Tensor:
    """The wgrad of bf16 (or fp16) a [sum_k, M], b [sum_k, N] -> [G, M, N]: out[g] = a_g^T b_g in
    grouped_gemm_bf16_ref's order, the 32-wide chunks from the group's first row (empty group: 0)."""
    return grouped_gemm_fp8_variable_k_ref(a, None, b, None, group_offs, out_dtype, accumulate_into)


def _fp4_dot(a, sa, b, sb) -> torch.Tensor:
    """e2m1 a [M, R/2] x b [N, R/2]^T (uint8, two per byte, element 2i in the low nibble) with e8m0
    sa [M, R/32], sb [N, R/32] -> fp32 [M, N] as v_mfma_scale_f32_16x16x128_f8f6f4 sums them
    (mx_gemm_ref's chunk = 128 model: each 128-wide chunk's products times 2^(ea + eb - 254) of
    their 32-blocks summed exactly, rounded once to fp32, added in order into fp32 from +0)."""
    if a.shape[1] == 0:
        return torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    return mx_gemm_ref(a.view(torch.uint8), sa.view(torch.uint8), b.view(torch.uint8), sb.view(torch.uint8),
                       "e2m1", "e2m1", torch.float32, chunk=MX_MMA_K)


def grouped_gemm_fp4_ref(a, a_scale, b, b_scale, group_offs, out_dtype=torch.bfloat16) -> torch.Tensor:
    """MXFP4 grouped GEMM (NT), groups along the rows of out: a [sum_m, K/2] and b [G, N, K/2]
    packed e2m1, a_scale [sum_m, K/32] and b_scale [G, N, K/32] e8m0; for the rows of group g
    out = rne(_fp4_dot(a_g, b[g])) -> [sum_m, N]; rows past group_offs[G] (a padded tail) are 0."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)
    for g, s, e in _groups(group_offs):
        out[s:e] = _out(_fp4_dot(a[s:e], a_scale[s:e], b[g], b_scale[g]), out_dtype)
    return out


def grouped_gemm_fp4_variable_k_ref(a, a_scale, b, b_scale, group_offs, out_dtype=torch.bfloat16,
                                    accumulate_into=None) -> torch.Tensor:
    """MXFP4 variable-K (wgrad), both operands contraction-contiguous: a [M, sum_k/2], b [N, sum_k/2]
    packed e2m1, a_scale [M, sum_k/32], b_scale [N, sum_k/32] e8m0 (global 32-blocks: every group
    offset a multiple of 32) -> [G, M, N], out[g] = _fp4_dot over the group's contraction, its
    128-wide chunks from the group's first element (empty group: 0); accumulate_into [G, M, N]:
    rne(fp32(old) + the product), one rounding."""
    out = torch.zeros(len(group_offs) - 1, a.shape[0], b.shape[0], dtype=out_dtype)
    for g, s, e in _groups(group_offs):
        assert s % MX_BLOCK == 0 and e % MX_BLOCK == 0, "mx scales: each group is whole 32-blocks"
        ks, kx = slice(s // 2, e // 2), slice(s // MX_BLOCK, e // MX_BLOCK)
        v = _fp4_dot(a[:, ks], a_scale[:, kx], b[:, ks], b_scale[:, kx])
        out[g] = _out(v if accumulate_into is None else v + accumulate_into[g].float(), out_dtype)
    return out


def _groups(group_offs: torch.Tensor):
    o = group_offs.tolist()
    return [(g, o[g], o[g + 1]) for g in range(len(o) - 1)]


# ---- FP8 block-scale grouped GEMM (DeepGEMM semantics) ----
def _blockscale(a, sa, b, sb) -> torch.Tensor:
    """a [M, K] e4m3 with sa [M, K/128], b [N, K] with sb [ceil(N/128), K/128] (or [N, K/128]:
    one scale per row of b) -> fp32 [M, N].

    fp32 scales (software promotion): acc += fp32(chunk sum) * fp32(sa * sb), every operation
    an fp32 RNE rounding. e8m0 scales (uint8 codes, hardware-scaled MFMA): the power-of-two
    scales apply to the exact chunk sum before its one rounding, acc += fp32(sum * sa * sb)."""
    e8m0 = sa.dtype == torch.uint8
    sa = _fp32_scale(sa)
    sbn = _fp32_scale(sb)
    if sbn.shape[0] != b.shape[0]:
        sbn = sbn.repeat_interleave(FP8_BLOCK, 0)[:b.shape[0]]  # [N, K/128]
    if e8m0:
        sa, sbn = sa.double(), sbn.double()
        combine = lambda c, p: (p * (sa[:, c, None] * sbn[None, :, c])).float()  # noqa: E731
    else:
        combine = lambda c, p: p.float() * (sa[:, c, None] * sbn[None, :, c])  # noqa: E731
    return _accumulate(F.decode(a, _fmt(a)), F.decode(b, _fmt(b)), FP8_BLOCK, combine)


def _blockscale_fp4(a, sa, b, sb) -> torch.Tensor:
    """a [M, K] e4m3 with e8m0 codes sa [M, ceil(K/128)], b [N, K/2] e2m1 (two per byte, even K in
    the low nibble) with e8m0 codes sb [N, K/32] -> fp32 [M, N]: one scaled 16x16x128 MMA per
    128-K block (its products, each scaled by its 1x128 and 1x32 scales, summed exactly, one fp32
    rounding, then added into acc): mx_gemm_ref's chunk=128 model, sa repeated over its four
    32-K blocks."""
    sa32 = sa.repeat_interleave(FP8_BLOCK // MX_BLOCK, 1)[:, :sb.shape[1]]
    return mx_gemm_ref(a, sa32, b.view(torch.uint8), sb, "e4m3", "e2m1", torch.float32, chunk=MX_MMA_K)


def _group_gemm(a, sa, b, sb) -> torch.Tensor:
    """One group's product: FP4 b (int8 / uint8 packed e2m1) or e4m3 b."""
    return _blockscale_fp4(a, sa, b, sb) if b.dtype in (torch.int8, torch.uint8) else _blockscale(a, sa, b, sb)


def psum_group_rows(grouped_layout, alignment: int = FP8_BLOCK) -> list:
    """DeepGEMM's psum layout, grouped_layout int32 [G] of group ends -> [(g, start, end)]: group g
    is rows align(end[g-1], alignment) .. end[g] (from 0 for g = 0)."""
    out, start = [], 0
    for g, end in enumerate(grouped_layout.tolist()):
        out.append((g, start, end))
        start = -(-end // alignment) * alignment
    return out


def m_grouped_fp8_gemm_nt_contiguous_ref(a, a_scale, b, b_scale, grouped_layout,
                                         out_dtype=torch.bfloat16, psum: bool = False) -> torch.Tensor:
    """DeepGEMM m_grouped_fp8_gemm_nt_contiguous / m_grouped_fp8_fp4_gemm_nt_contiguous: a [M, K]
    e4m3, a_scale [M, ceil(K/128)] (fp32 or e8m0 uint8), b [G, N, K] e4m3 with b_scale
    [G, ceil(N/128), ceil(K/128)] (or [G, N, ceil(K/128)]: per row of b), or b [G, N, K/2] packed
    e2m1 (int8 / uint8) with e8m0 b_scale [G, N, K/32] (a_scale then e8m0 too);
    grouped_layout int32 [M] = group of each row (-1: skipped row), or with psum=True int32 [G] =
    each group's end row (psum_group_rows) -> [M, N] out_dtype (bf16, f16 or the fp32
    accumulator); rows of no group are 0."""
    return _out(_contiguous_groups(lambda r, g: _group_gemm(a[r], a_scale[r], b[g], b_scale[g]),
                                   (a.shape[0], b.shape[1]), grouped_layout, psum), out_dtype)


def _contiguous_groups(group_gemm, shape, grouped_layout, psum) -> torch.Tensor:
    """fp32 ``shape`` [M, N]: group_gemm(rows, g) (rows: a slice or the index tensor of group g's
    rows) in each group's rows (grouped_layout: m_indices, or with psum the group ends), 0 elsewhere."""
    out = torch.zeros(shape, dtype=torch.float32)
    if psum:
        groups = [(g, slice(start, end)) for g, start, end in psum_group_rows(grouped_layout)]
    else:
        layout = grouped_layout.long()
        groups = [(g, (layout == g).nonzero().squeeze(1)) for g in layout[layout >= 0].unique().tolist()]
    for g, rows in groups:
        out[rows] = group_gemm(rows, g)
    return out


def m_grouped_fp8_gemm_nt_masked_ref(a, a_scale, b, b_scale, masked_m, out_dtype=torch.bfloat16) -> torch.Tensor:
    """DeepGEMM m_grouped_fp8_gemm_nt_masked / m_grouped_fp8_fp4_gemm_nt_masked: a [G, M_max, K]
    e4m3, a_scale [G, M_max, ceil(K/128)], b and b_scale as the contiguous reference's (e4m3 or
    packed e2m1), masked_m int32 [G] = valid rows per group -> [G, M_max, N] out_dtype; rows >=
    masked_m[g] (unwritten by the kernel) are 0 here."""
    return _out(_masked_groups(lambda g, m: _group_gemm(a[g, :m], a_scale[g, :m], b[g], b_scale[g]),
                               (*a.shape[:2], b.shape[1]), masked_m), out_dtype)


def _masked_groups(group_gemm, shape, masked_m) -> torch.Tensor:
    """fp32 ``shape`` [G, M_max, N]: group_gemm(g, m) in rows :m = masked_m[g] of group g, 0 elsewhere."""
    out = torch.zeros(shape, dtype=torch.float32)
    for g, m in enumerate(masked_m.tolist()):
        out[g, :m] = group_gemm(g, m)
    return out


def m_grouped_bf16_gemm_nt_contiguous_ref(a, b, grouped_layout, psum: bool = False) -> torch.Tensor:
    """DeepGEMM m_grouped_bf16_gemm_nt_contiguous: a [M, K] bf16, b [G, N, K] bf16, grouped_layout as
    m_grouped_fp8_gemm_nt_contiguous_ref's (m_indices, or with psum=True the group ends) -> [M, N]
    bf16 (RNE of the fp32 accumulator of _bf16_dot); rows of no group are 0."""
    return _out(_contiguous_groups(lambda r, g: _bf16_dot(a[r], b[g]), (a.shape[0], b.shape[1]), grouped_layout,
                                   psum), torch.bfloat16)


def m_grouped_bf16_gemm_nt_masked_ref(a, b, masked_m) -> torch.Tensor:
    """DeepGEMM m_grouped_bf16_gemm_nt_masked: a [G, M_max, K] bf16, b [G, N, K] bf16, masked_m int32
    [G] -> [G, M_max, N] bf16; rows >= masked_m[g] (unwritten by the kernel) are 0 here."""
    return _out(_masked_groups(lambda g, m: _bf16_dot(a[g, :m], b[g]), (*a.shape[:2], b.shape[1]), masked_m),
                torch.bfloat16)
