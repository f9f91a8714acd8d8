"""train_grouped_gemm kernel family (FlyDSL, gfx950) on the emulator: forward NT, dgrad NN, variable-K wgrad TN, TT.

Spec: every layout x format (e4m3, e5m2; mixed a / b formats of the hybrid backward) x output (bf16, fp16)
is bit-identical to
mxgemm.reference (grouped_gemm_fp8_ref / grouped_gemm_fp8_variable_k_ref model the kernel's
order: one exact fp32-rounded sum per 128-wide contraction chunk, chunks added in order, times
fp32(a_scale * b_scale), RNE) in race mode, for G in {1, 2, 3, 8}, uneven groups with an empty one,
group sizes and N / K (M for TN) off the 64-tile, one tile per workgroup (over-launched grid)
and persistent grids smaller than the tile count, group_m 1 and 2, linear and shuffled
workgroup order. Row-wise scales (per out row x per group and column; TN also Primus-Turbo's
shared [M], [N]) and 128-block scales (1x128 with 128x128 or per-column b scales, row-major
and MN-major, promoted per contraction step; TN's block index global) in every layout incl.
TT (a MN-major), fp32 out and out += result, through the ops (which derive the scale strides),
bit-identical to the same references; tensorwise equals row scales of one value. MX scales
(e8m0 per 32, GRAN=mx, on the scaled MFMA) in every layout, e4m3 and e5m2, bf16 / fp32 out and
out += result, over-allocated tails whose scales are NaN bytes, bit-identical to the reference.
Code objects: no spills, LDS <= 160 KiB, the MFMA in the contraction loop.
Beyond 4 GB (sparse emulator buffers): A and out (NT/NN), A and B (TN) whole; B (NT/NN) and
the TN output through a workgroup window running one tile.
Launches go through mxgemm.launcher.launch (artefact + grid/block/kernel arguments).
"""
import re

import pytest
import torch

from mxgemm import asm_facts, build, launcher, metrics, reference, registry

KERNEL = "train_grouped_gemm"
ORDER = registry.get(KERNEL).ordered_args   # raw emulator launches take the arguments by name too
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
LDS_LIMIT = 160 * 1024


def ceil_div(a, b):
    return -(-a // b)


def tile_bound(layout, lens, m, n, bm, bn):
    """Workgroups that cover every tile without reading group sizes on the host: NT/NN
    sum ceil(len_g / BM) + ceil(tail / BM) <= ceil(m / BM) + G, m the rows of a (the kernel's
    own scan drops the excess)."""
    if layout == "TN":
        return len(lens) * ceil_div(m, bm) * ceil_div(n, bn)
    return (ceil_div(m, bm) + len(lens)) * ceil_div(n, bn)


def formats(fmt):
    """(a's, b's) format of a case's "e4m3", "e5m2" or mixed "e4m3/e5m2" (a / b)."""
    fa, _, fb = fmt.partition("/")
    return fa, fb or fa


def make_case(layout, fmt, lens, n, k, seed=0, tail=0):
    """fp8 operands + fp32 scales; NT/NN: a [sum_m, k], b [G, n, k] / [G, k, n], out [sum_m, n];
    TN: a [sum_k, n] (out rows), b [sum_k, k] (out columns), out [G, n, k]. tail: rows of a
    (and TN's b) past the groups, as of an over-allocated buffer."""
    g = torch.Generator().manual_seed(seed)
    fa, fb = formats(fmt)
    qa = lambda *s: (torch.randn(*s, generator=g) * 3).to(FP8[fa])  # noqa: E731
    qb = lambda *s: (torch.randn(*s, generator=g) * 3).to(FP8[fb])  # noqa: E731
    s = sum(lens) + tail
    offs = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    if layout == "TN":
        a, b = qa(s, n), qb(s, k)
    else:
        a, b = qa(s, k), (qb(len(lens), n, k) if layout == "NT" else qb(len(lens), k, n))
    scales = torch.rand(2, generator=g) + 0.25
    return dict(a=a, b=b, a_scale=scales[:1].clone(), b_scale=scales[1:].clone(), group_offs=offs, lens=lens)


def reference_out(layout, c, out_dtype, init=None):
    if layout == "TN":
        return reference.grouped_gemm_fp8_variable_k_ref(c["a"], c["a_scale"][0], c["b"], c["b_scale"][0],
                                                         c["group_offs"], out_dtype, accumulate_into=init)
    return reference.grouped_gemm_fp8_ref(c["a"], c["a_scale"][0], c["b"], c["b_scale"][0], c["group_offs"],
                                          trans_b=layout == "NT", out_dtype=out_dtype)


def run(variant, c, grid=None, group_m=2, wg_order="linear", init=None):
    """Launch on the emulator; grid None = one workgroup per tile bound (over-launch); init: out's
    values before the launch (else NaN, which no written element may keep)."""
    layout, a, b = variant["LAYOUT"], c["a"], c["b"]
    G = len(c["lens"])
    if layout == "TN":
        m, n, k = a.shape[1], b.shape[1], a.shape[0]
        out = torch.full((G, m, n), float("nan"), dtype=OUT[variant["OUT"]]) if init is None else init.clone()
    else:
        m, k = a.shape
        n = b.shape[1] if layout == "NT" else b.shape[2]
        out = torch.full((m, n), float("nan"), dtype=OUT[variant["OUT"]])
    grid = grid or tile_bound(layout, c["lens"], m, n, variant["BM"], variant["BN"])
    with launcher.emulator_settings(race_check=True, wg_order=wg_order, seed=3):
        launcher.launch_variant(KERNEL, variant, "gfx950", "emu", writes=(out,), **args_of(c, a, b, out, G, m, n, k,
                                                                                          group_m, grid))
    return out


TENSORWISE = dict(sa_sg=0, sa_si=0, sa_sk=0, sb_sg=0, sb_sj=0, sb_sk=0, sb_shift=0)   # scale strides 0: one scale


def args_of(c, a, b, out, G, M, N, K, group_m, grid) -> dict:
    """The kernel's arguments by name (registry order is the kernel's business); the scales'
    byte strides from c["strides"], else tensorwise."""
    return dict(a=a.view(torch.uint8) if isinstance(a, torch.Tensor) else a, a_scale=c["a_scale"],
                b=b.view(torch.uint8) if isinstance(b, torch.Tensor) else b, b_scale=c["b_scale"],
                group_offs=c["group_offs"], out=out, G=G, M=M, N=N, K=K, group_m=group_m, grid=grid,
                **c.get("strides", TENSORWISE))


def small(layout, fmt, out):
    fa, fb = formats(fmt)
    return registry.find_variant(registry.get(KERNEL), LAYOUT=layout, FMT=fa, FMT_B=fb, OUT=out, BM=64, BN=64)


# ---- row-wise and 128-block scales (strided, through the ops), the TT layout ----
# The ops derive the kernel's scale strides from the scale tensors: row-major and MN-major
# (transposed, padded) scales are read in place. Block scales promote per 128-wide contraction
# step (acc += fp32 sum * fp32(sa * sb)); TN's block index is global ((offs[g] + c) / 128).
CFG64 = "BM=64,BN=64,GROUP_M=2,PERSISTENT=0"


def _scales(g, *shape, mn_major=False):
    """fp32 scales in [0.25, 4) of a logical shape; mn_major: the last two dims swapped in memory, the
    swapped-in first one padded to a multiple of 4 (DeepGEMM's TMA-aligned layout)."""
    if not mn_major:
        return torch.rand(*shape, generator=g) * 3.75 + 0.25
    *lead, r, c = shape
    store = torch.rand(*lead, c, -(-r // 4) * 4, generator=g) * 3.75 + 0.25
    return store.transpose(-1, -2)[..., :r, :]


def scaled_case(layout, gran, lens, n, k, seed, mn_major=False, per_column=False, group_scales=True, tail=0):
    """Operands as make_case (TT: a [k, sum_m]) and the granularity's scales: rows layouts
    sa [R] / [R, kb], sb [G, n] / [G, n or ceil(n/128), kb]; TN sa [n] or [G, n] / [kb, n],
    sb [k] or [G, k] / [kb, k or ceil(k/128)] (kb: 128-blocks of the contraction)."""
    c = make_case("NT" if layout == "TT" else layout, "e4m3", lens, n, k, seed=seed, tail=tail)
    g = torch.Generator().manual_seed(seed + 1)
    G, rows = len(lens), c["a"].shape[0]
    if layout == "TT":
        c["a"] = c["a"].T.contiguous()
    if layout == "TN":
        kb = -(-rows // 128)
        if gran == "row":
            c["a_scale"] = _scales(g, *((G, n) if group_scales else (n,)))
            c["b_scale"] = _scales(g, *((G, k) if group_scales else (k,)))
        else:
            c["a_scale"] = _scales(g, kb, n, mn_major=mn_major)
            c["b_scale"] = _scales(g, kb, k if per_column else -(-k // 128), mn_major=mn_major)
    elif gran == "row":
        c["a_scale"], c["b_scale"] = _scales(g, rows), _scales(g, G, n)
    else:
        kb = -(-k // 128)
        c["a_scale"] = _scales(g, rows, kb, mn_major=mn_major)
        c["b_scale"] = _scales(g, G, n if per_column else -(-n // 128), kb, mn_major=mn_major)
    return c


def run_op(layout, c, out_dtype, config=CFG64, init=None, granularity=None, num_cu=None):
    """The op on the emulator (race mode, shuffled workgroups); out starts NaN, or init (accumulate)."""
    import mxgemm
    lens = torch.tensor(c["lens"], dtype=torch.int64)
    kw = dict(out_dtype=out_dtype, config=config, granularity=granularity)
    if init is not None:
        kw.update(out=init.clone(), accumulate=True)
    with launcher.emulator_settings(race_check=True, wg_order="shuffled", seed=5):
        if layout == "TN":
            return mxgemm.grouped_gemm_fp8_variable_k(c["a"], c["a_scale"], c["b"], c["b_scale"], lens, **kw)
        return mxgemm.grouped_gemm_fp8_kernel(c["a"], c["a_scale"], c["b"], c["b_scale"], lens,
                                              trans_b=layout != "NN", trans_a=layout == "TT", num_cu=num_cu, **kw)


def scaled_reference(layout, c, out_dtype, init=None, granularity=None):
    if layout == "TN":
        return reference.grouped_gemm_fp8_variable_k_ref(c["a"], c["a_scale"], c["b"], c["b_scale"], c["group_offs"],
                                                         out_dtype, accumulate_into=init, granularity=granularity)
    return reference.grouped_gemm_fp8_ref(c["a"], c["a_scale"], c["b"], c["b_scale"], c["group_offs"],
                                          trans_b=layout != "NN", out_dtype=out_dtype, a_mn_major=layout == "TT",
                                          accumulate_into=init)


def _init(shape, out_dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(out_dtype)


# ---- MX scales (GRAN=mx: e8m0 per 32 contraction elements, applied by the scaled MFMA) ----
# a_scale [R, K/32] and b_scale [G, N, K/32] (TN: [M, sum_k/32] and [N, sum_k/32], groups on
# multiples of 32), uint8; rows with scales 2^-8 .. 2^8 apart, so a scale read for the wrong row
# or block changes the bits. The padded tail's scales hold 0xFF (NaN) and are never applied.
def mx_case(layout, fmt, lens, n, k, seed, tail=0):
    from mxgemm.quant import quantize_mx
    g = torch.Generator().manual_seed(seed)

    def q(rows, cols):   # (payload [rows, cols], e8m0 [rows, cols / 32]) of rows with spread magnitudes
        x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, 1), generator=g).float())
        return quantize_mx(x, fmt)
    G, rows = len(lens), sum(lens) + tail
    offs = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    if layout == "TN":   # a [rows, n], b [rows, k]: quantised along the contraction (rows)
        (a, sa), (b, sb) = q(n, rows), q(k, rows)
        return dict(a=a.T.contiguous(), a_scale=sa, b=b.T.contiguous(), b_scale=sb, group_offs=offs, lens=lens)
    a, sa = q(rows, k)
    b, sb = q(G * n, k)
    b, sb = b.reshape(G, n, k), sb.reshape(G, n, k // 32)
    sa[sum(lens):] = 0xFF
    return dict(a=a.T.contiguous() if layout == "TT" else a, a_scale=sa,
                b=b.transpose(1, 2).contiguous() if layout == "NN" else b, b_scale=sb, group_offs=offs, lens=lens)


# (layout, fmt, out, accumulate, group sizes, N, K, tail); TN: sizes along the contraction
MX_CASES = [
    ("NT", "e4m3", "bf16", False, [40, 0, 77], 80, 160, 9),
    ("NN", "e4m3", "f32", True, [3, 70, 0], 48, 96, 0),
    ("TT", "e4m3", "f32", False, [16, 0, 80], 64, 224, 16),
    ("TT", "e4m3", "bf16", False, [32, 48], 48, 96, 0),
    ("NT", "e4m3", "f32", True, [65, 12], 64, 288, 0),
    ("TN", "e4m3", "bf16", False, [64, 0, 96, 37], 48, 80, 27),
    ("TN", "e4m3", "f32", True, [32, 0, 70], 80, 48, 26),
    ("TN", "e4m3", "f32", False, [160, 3], 64, 64, 29),
    ("NT", "e5m2", "bf16", False, [17, 50], 64, 128, 0),
    ("TN", "e5m2", "bf16", False, [96, 33], 48, 64, 31),
]


@pytest.mark.parametrize("case", MX_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}{'-acc' if c[3] else ''}-G{len(c[4])}"
                                                for c in MX_CASES])
def test_mx_bit_exact_vs_reference(case):
    layout, fmt, out_t, accumulate, lens, n, k, tail = case
    c = mx_case(layout, fmt, lens, n, k, seed=n + k + len(lens), tail=tail)
    out_dtype = OUT[out_t]
    shape = (len(lens), n, k) if layout == "TN" else (sum(lens) + tail, n)
    init = _init(shape, out_dtype, 4) if accumulate else None
    out = run_op(layout, c, out_dtype, init=init)
    ref = scaled_reference(layout, c, out_dtype, init)
    assert ref.float().abs().max() > 0 and not ref.float().isnan().any()
    metrics.assert_bitwise_equal(out, ref, f"{layout} mx {fmt} {out_t}")
    # the scales matter: the same payloads with every scale 1.0 give other bits
    ones = dict(c, a_scale=torch.full_like(c["a_scale"], 127), b_scale=torch.full_like(c["b_scale"], 127))
    assert not torch.equal(scaled_reference(layout, ones, out_dtype, init), ref)


def test_mx_hardware_tile_bit_exact():
    c = mx_case("NT", "e4m3", [130, 0, 77], 144, 256, seed=31)
    out = run_op("NT", c, torch.bfloat16, config="BM=128,BN=128,GROUP_M=2,PERSISTENT=0")
    metrics.assert_bitwise_equal(out, scaled_reference("NT", c, torch.bfloat16), "NT mx 128 x 128")


def test_mx_guards():
    import mxgemm
    from mxgemm import guards
    c = mx_case("TN", "e4m3", [40, 24], 48, 64, seed=1)
    lens = torch.tensor([40, 24])
    with pytest.raises(guards.GuardError, match=r"\[group_offs\] group 1 starts at row 40, not a multiple of 32"):
        mxgemm.grouped_gemm_fp8_variable_k(c["a"], c["a_scale"], c["b"], c["b_scale"], lens)
    with pytest.raises(guards.GuardError, match=r"\[dtype\] a_scale is torch.uint8 and b_scale torch.float32"):
        mxgemm.grouped_gemm_fp8_variable_k(c["a"], c["a_scale"], c["b"], c["b_scale"].float(), lens)
    with pytest.raises(guards.GuardError, match=r"\[dtype\] granularity = 'block' with a_scale torch.uint8"):
        mxgemm.grouped_gemm_fp8_variable_k(c["a"], c["a_scale"], c["b"], c["b_scale"], lens, granularity="block")
    r = mx_case("NT", "e4m3", [40, 24], 48, 64, seed=2)
    with pytest.raises(guards.GuardError, match=r"\[K%32\] K = 48 must be a multiple of 32"):
        mxgemm.grouped_gemm_fp8_kernel(r["a"][:, :48].contiguous(), r["a_scale"][:, :2].contiguous(),
                                       r["b"][:, :, :48].contiguous(), r["b_scale"][:, :, :2].contiguous(), lens)
    with pytest.raises(guards.GuardError, match=r"\[scale-shape\] a_scale \[64, 1\] and b_scale \[2, 48, 2\]"):
        mxgemm.grouped_gemm_fp8_kernel(r["a"], r["a_scale"][:, :1].contiguous(), r["b"], r["b_scale"], lens)


# (layout, granularity, out, accumulate, group sizes, N, K, options); TN: sizes along the contraction,
# (N, K) the output's [rows, columns]. K off 128 where allowed (NT / NN / TT; TN's last group);
# TT's groups start on multiples of 16. Block cases first: a seeded bug there fails before the
# row variants are compiled.
SCALED = [
    ("NT", "block", "bf16", False, [40, 0, 77], 80, 272, dict(mn_major=True)),
    ("NN", "block", "bf16", False, [3, 70, 0], 144, 400, dict(per_column=True, num_cu=2)),
    ("TT", "block", "bf16", False, [16, 0, 80], 144, 208, dict(mn_major=True)),
    ("TN", "block", "bf16", False, [256, 0, 57], 48, 144, {}),
    ("TN", "block", "f32", False, [128, 0, 128, 70], 80, 48, dict(per_column=True, mn_major=True)),
    ("NT", "block", "f32", True, [40, 0, 77], 144, 272, dict(per_column=True)),
    ("NN", "block", "f32", False, [3, 70, 0], 96, 144, dict(mn_major=True)),
    ("NN", "block", "f32", True, [65, 0, 12], 80, 256, {}),
    ("TT", "block", "f32", True, [32, 0, 48], 64, 144, dict(per_column=True)),
    ("TN", "block", "f32", True, [256, 0, 57], 80, 144, dict(per_column=True)),
    ("NT", "row", "bf16", False, [40, 0, 77], 80, 144, {}),
    ("NN", "row", "f32", False, [3, 70, 0], 96, 48, dict(num_cu=2)),
    ("TT", "row", "bf16", False, [16, 0, 80], 48, 272, {}),
    ("TN", "row", "bf16", False, [130, 0, 57], 48, 80, dict(group_scales=False)),   # Primus-Turbo's [M], [N]
    ("TN", "row", "f32", False, [130, 0, 57], 48, 80, {}),                           # per group [G, M], [G, N]
    ("NT", "row", "f32", True, [40, 0, 77], 80, 144, {}),
    ("TT", "row", "f32", True, [32, 0, 48], 64, 144, {}),
]


@pytest.mark.parametrize("case", SCALED, ids=[f"{c[0]}-{c[1]}-{c[2]}{'-acc' if c[3] else ''}-G{len(c[4])}"
                                                f"{''.join('-' + k for k, v in c[7].items() if v is True)}"
                                                for c in SCALED])
def test_scaled_bit_exact_vs_reference(case):
    """Row-wise and block scales in every layout, 64 x 64 tiles: bit-identical to the reference
    (an empty group, group sizes and N / K off the tile; fp32 out; out += result into values)."""
    layout, gran, out_t, accumulate, lens, n, k, opts = case
    opts = dict(opts)
    num_cu = opts.pop("num_cu", None)
    c = scaled_case(layout, gran, lens, n, k, seed=len(lens) * 7 + n + k, **opts)
    out_dtype = OUT[out_t]
    shape = (len(lens), n, k) if layout == "TN" else (sum(lens), n)
    init = _init(shape, out_dtype, 4) if accumulate else None
    gran_kw = gran if layout == "TN" else None   # TN: [G, X] vs [kb, X] may coincide; rows infer from ranks
    out = run_op(layout, c, out_dtype, init=init, granularity=gran_kw, num_cu=num_cu)
    ref = scaled_reference(layout, c, out_dtype, init, gran_kw)
    assert ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(out, ref, f"{layout} {gran} {out_t}")
    if layout == "TN" and not accumulate:
        for g, length in enumerate(lens):
            assert length or bool((out[g] == 0).all())


@pytest.mark.parametrize("layout", ["NT", "NN"])
def test_block_hardware_tile_bit_exact(layout):
    """The 128 x 128 block-scale tiles (bf16), a two-workgroup persistent grid."""
    c = scaled_case(layout, "block", [130, 0, 77], 144, 272, seed=21)
    out = run_op(layout, c, torch.bfloat16, config="BM=128,BN=128,GROUP_M=2,PERSISTENT=0")
    metrics.assert_bitwise_equal(out, scaled_reference(layout, c, torch.bfloat16), f"{layout} block 128 x 128")


@pytest.mark.parametrize("gran", ["row", "block"])
def test_scaled_padded_tail_is_zero(gran):
    """NT rows past the groups (over-allocated a whose tail scales hold NaN): out rows 0."""
    c = scaled_case("NT", gran, [40, 0, 30], 80, 144, seed=23, tail=90)
    c["a_scale"][70:] = float("nan")
    out = run_op("NT", c, torch.bfloat16)
    metrics.assert_bitwise_equal(out, scaled_reference("NT", c, torch.bfloat16), f"{gran} padded tail")
    assert bool((out[70:] == 0).all())


def test_tensorwise_equals_row_of_constant_scales():
    """Tensorwise is the row path with zero strides: the same bits as row scales all equal."""
    c = make_case("NT", "e4m3", [40, 0, 77], 80, 144, seed=29)
    out_t = run_op("NT", c, torch.bfloat16)
    rows = dict(c, a_scale=c["a_scale"].expand(117).contiguous(), b_scale=c["b_scale"].expand(3, 80).contiguous())
    metrics.assert_bitwise_equal(run_op("NT", rows, torch.bfloat16), out_t, "row of constants vs tensorwise")
    metrics.assert_bitwise_equal(out_t, reference_out("NT", c, torch.bfloat16), "tensorwise")


# (layout, fmt, out, group sizes, N, K, grid, group_m, workgroup order); for TN the group sizes
# are the contraction lengths and (N, K) the output's [rows, columns].
CASES = [
    ("NT", "e4m3", "bf16", [40, 0, 77], 80, 144, None, 2, "linear"),
    ("NT", "e5m2", "f16", [150], 48, 272, 2, 1, "shuffled"),
    ("NN", "e4m3", "f16", [3, 70, 0], 96, 48, 3, 2, "linear"),
    ("NN", "e5m2", "bf16", [65], 144, 80, None, 1, "shuffled"),
    ("TN", "e4m3", "bf16", [130, 0, 57], 48, 80, None, 1, "linear"),
    ("TN", "e5m2", "f16", [200], 80, 112, 2, 2, "shuffled"),
    ("TN", "e4m3", "f16", [0, 9], 16, 64, None, 2, "linear"),
    ("NT", "e4m3", "bf16", [5, 0, 0, 70, 1, 0, 33, 16], 64, 128, 5, 2, "shuffled"),
    ("TN", "e5m2", "bf16", [5, 0, 0, 130, 1, 0, 33, 16], 32, 48, 7, 1, "shuffled"),
    # mixed formats (hybrid training's backward: e5m2 gradients x e4m3 activations / weights)
    ("NN", "e5m2/e4m3", "bf16", [3, 70, 0], 96, 48, 3, 2, "shuffled"),
    ("TN", "e5m2/e4m3", "bf16", [130, 0, 57], 48, 80, None, 1, "linear"),
    ("TN", "e4m3/e5m2", "bf16", [200], 80, 112, 2, 2, "shuffled"),
    # 45 tiles: workgroup slots past the first 32 (two whole blocks of 16 handed to the XCDs in pairs) keep
    # their tile order
    ("NN", "e4m3", "bf16", [130, 70, 0, 200], 320, 64, 16, 2, "shuffled"),
    ("NT", "e5m2", "bf16", [130, 70, 0, 200], 320, 64, None, 4, "linear"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-G{len(c[3])}-grid{c[6] or 'all'}-gm{c[7]}"
                                             for c in CASES])
def test_bit_exact_vs_reference(case):
    layout, fmt, out_t, lens, n, k, grid, group_m, order = case
    variant = small(layout, fmt, out_t)
    c = make_case(layout, fmt, lens, n, k, seed=len(lens) * 31 + n)
    out = run(variant, c, grid=grid, group_m=group_m, wg_order=order)
    ref = reference_out(layout, c, OUT[out_t])
    assert ref.float().abs().max() > 0
    metrics.assert_bitwise_equal(out, ref, f"{KERNEL} {registry.variant_id(variant)}")
    if layout == "TN":  # an empty group's slice is written as zeros
        for g, length in enumerate(lens):
            assert length or bool((out[g] == 0).all())


@pytest.mark.parametrize("layout,grid", [("NT", None), ("NN", 2), ("TN", None)])
def test_padded_tail_past_the_groups(layout, grid):
    """Rows of a past group_offs[G] (an over-allocated activation buffer, Primus-Turbo's padded
    tail): NT / NN write their out rows as zeros (out starts NaN), TN ignores them; a tail of
    more than one row tile, and groups ending mid-tile."""
    variant = small(layout, "e4m3", "bf16")
    c = make_case(layout, "e4m3", [40, 0, 30], 80, 144, seed=9, tail=150)
    out = run(variant, c, grid=grid)
    metrics.assert_bitwise_equal(out, reference_out(layout, c, torch.bfloat16), f"{layout} padded tail")
    if layout != "TN":
        assert bool((out[70:] == 0).all()) and not bool((out[:70] == 0).all())


def test_persistent_grid_equals_one_tile_per_workgroup():
    """Same bits whatever the grid: one workgroup looping over all tiles vs one per tile."""
    variant = small("NT", "e4m3", "bf16")
    c = make_case("NT", "e4m3", [33, 0, 20], 64, 128, seed=5)
    metrics.assert_bitwise_equal(run(variant, c, grid=1), run(variant, c), "grid 1 vs full")


ISA_VARIANTS = [v for v in registry.get(KERNEL).variants
                if v["FMT"] == v["FMT_B"] == "e4m3" and v["OUT"] in ("bf16", "f32")]


def _main_grad(layout, c, out_dtype, seed):
    """A non-zero out to accumulate into (TN: [G, n, k])."""
    G, n, k = len(c["lens"]), c["a"].shape[1], c["b"].shape[1]
    return torch.randn(G, n, k, generator=torch.Generator().manual_seed(seed)).to(out_dtype)


@pytest.mark.parametrize("variant", [v for v in ISA_VARIANTS if v["BM"] > 64 and "GRAN" not in v],
                         ids=registry.variant_id)
def test_hardware_tiles_bit_exact(variant):
    """The 128 x 128 / 256 x 128 tiles (accumulators partly in AGPRs) on a two-workgroup persistent grid."""
    layout, out_dtype = variant["LAYOUT"], OUT[variant["OUT"]]
    c = make_case(layout, "e4m3", [140, 0, 20] if layout == "TN" else [130, 0, 77], 144, 160, seed=variant["BM"])
    init = _main_grad(layout, c, out_dtype, 1) if variant.get("ACCUM") else None
    metrics.assert_bitwise_equal(run(variant, c, grid=2, init=init), reference_out(layout, c, out_dtype, init),
                                 f"{KERNEL} {registry.variant_id(variant)}")


@pytest.mark.parametrize("layout,lens,k,bn", [("NT", [130, 0, 77], 304, 256), ("NN", [130, 0, 77], 304, 256),
                                              ("TN", [20, 0, 140], None, 256), ("NT", [130, 0, 77], 304, 224)])
def test_dma_tiles_one_workgroup_bit_exact(layout, lens, k, bn):
    """256-row tiles (operands by DMA) on a grid of one: the workgroup runs every tile in turn, and a
    tile whose last step reads LDS buffer 0 (NT, NN: 3 steps; TN: group 0's one) is followed by one whose
    first DMA writes it: the tile's first barrier keeps that DMA off the slower waves' reads."""
    variant = dict(LAYOUT=layout, FMT="e4m3", FMT_B="e4m3", OUT="bf16", BM=256, BN=bn)
    c = make_case(layout, "e4m3", lens, 144, 160 if k is None else k, seed=3)
    metrics.assert_bitwise_equal(run(variant, c, grid=1), reference_out(layout, c, torch.bfloat16),
                                 f"{KERNEL} {registry.variant_id(variant)} grid 1")


WGRAD_VARIANTS = [v for v in registry.get(KERNEL).variants
                  if "ACCUM" in v and v["BM"] == 64 and v["LAYOUT"] == "TN" and "GRAN" not in v and v["FMT"] in ("e4m3", "e5m2")]


@pytest.mark.parametrize("variant", WGRAD_VARIANTS, ids=registry.variant_id)
def test_wgrad_fp32_out_and_accumulation_bit_exact(variant):
    """fp32 out, and out += result (Megatron's fused main_grad) into a non-zero out: every format
    pair, an empty group (its slice keeps out's values), a partial tile each way, a shuffled
    two-workgroup persistent grid."""
    fmt = f"{variant['FMT']}/{variant['FMT_B']}"
    out_dtype = OUT[variant["OUT"]]
    c = make_case("TN", fmt, [130, 0, 57], 80, 112, seed=7)
    init = _main_grad("TN", c, out_dtype, 2) if variant["ACCUM"] else None
    out = run(variant, c, grid=2, wg_order="shuffled", init=init)
    metrics.assert_bitwise_equal(out, reference_out("TN", c, out_dtype, init), f"{KERNEL} {registry.variant_id(variant)}")
    if variant["ACCUM"]:
        assert torch.equal(out[1], init[1]) and not torch.equal(out[0], init[0])


# ---- code objects ----


@pytest.mark.parametrize("variant", ISA_VARIANTS, ids=registry.variant_id)
def test_code_object(variant):
    art = build.artifact(KERNEL, variant)
    info = art.isa()
    print(f"\n{KERNEL} [{registry.variant_id(variant)}]: {info.summary(256)}")
    # no VGPR spills, nothing in scratch; the DMA tiles two steps deep (NT, NN) keep SGPRs in VGPR lanes (the
    # compiler's SGPR spill; docs/peers/grouped_fp8.md counts them), the others none
    dma, depth = variant["BM"] == 256 and variant["BN"] > 128, 1 if variant["LAYOUT"] == "TN" else 2
    assert info.vgpr_spills == 0 and info.scratch_bytes == 0
    assert info.sgpr_spills == 0 or (dma and depth == 2)
    assert 0 < info.lds_bytes <= LDS_LIMIT
    assert info.occupancy(256) >= 1
    loops = asm_facts.loop_bodies(art.asm, KERNEL)
    # the contraction loop: MFMAs between barriers, a whole number of steps of a wave's 16 x 16 tiles (waves in
    # 2 columns, 4 waves; 8 at 256 rows, as many as the registry launches)
    waves = registry.get(KERNEL).threads_for("gfx950", variant) // 64
    assert waves == (8 if variant["BM"] == 256 else 4)
    a_tiles, b_tiles = variant["BM"] // (8 * waves), variant["BN"] // 32
    per_step = a_tiles * b_tiles
    # GRAN=mx: the scaled opcode (e8m0 scale VGPRs); the others: constant-0 scales fold to the unscaled one
    mfma = "v_mfma_scale_f32_16x16x128_f8f6f4" if variant.get("GRAN") == "mx" else "v_mfma_f32_16x16x128_f8f6f4"
    k_loops = [body for body in loops if any(l.startswith(mfma) for l in body)]
    inner = min(k_loops, key=len)
    mfmas = sum(l.startswith(mfma) for l in inner)
    barriers = sum(l.startswith("s_barrier") for l in inner)
    # the DMA tiles two steps deep: a second barrier a step, before the DMA refills the buffer just read
    per_barrier = depth if dma else 1
    assert barriers >= 1 and barriers % per_barrier == 0 and mfmas == per_step * barriers // per_barrier
    tr_reads = sum(l.startswith("ds_read_b64_tr_b8") for l in inner)
    # 16-row operand tiles per wave and step read through ds_read_b64_tr_b8 (4 reads each)
    transposed = {"NT": 0, "NN": b_tiles, "TN": a_tiles + b_tiles, "TT": a_tiles}
    assert tr_reads == 4 * barriers // per_barrier * transposed[variant["LAYOUT"]]
    # fp8 128 x 128 and 256 x 128 with epilogue scales run two steps per iteration, a register set per step
    # in flight: their waits keep the later step's loads in flight, and no loaded register is copied (a copy at
    # the back edge waits for its load)
    if variant["BN"] == 128 and "GRAN" not in variant:
        waits = [int(n) for l in inner for n in re.findall(r"s_waitcnt vmcnt\((\d+)\)", l)]
        assert barriers == 2 and waits and min(waits) > 0, (barriers, waits)
        loaded = {r for l in inner for a, b in re.findall(r"buffer_load_dwordx4 v\[(\d+):(\d+)\]", l)
                  for r in range(int(a), int(b) + 1)}
        copied = {int(a) for l in inner for a in re.findall(r"v_mov_b(?:32|64)_e32 v\S+, v\[?(\d+)", l)}
        assert not loaded & copied, sorted(loaded & copied)
    # 256 x 192 .. 256: both tiles reach LDS by DMA, unpadded in two buffers, (BM + BN) x 128 bytes a step (BN
    # held to whole issues of 64 lines) in 16-byte DMAs of every thread, and no VGPR is written to LDS
    if dma:
        held = -(-variant["BN"] // 64) * 64
        assert info.lds_bytes == 2 * (variant["BM"] + held) * 128
        dmas = sum(bool(re.match(r"buffer_load_dwordx4 .* lds$", l)) for l in inner)
        assert dmas == barriers // depth * (variant["BM"] + held) * 128 // (64 * waves * 16), dmas
        assert not any(l.startswith(("ds_write", "ds_store")) for l in inner)
    # no waterfall loop around a buffer access (every buffer resource is uniform)
    assert not any("s_and_saveexec_b64" in " ".join(body) and any(l.startswith("buffer_") for l in body)
                   for body in loops)


# ---- 64-bit addressing: operands and output beyond 4 GB ----
# Rows before group_offs[0] belong to no group, so a single group that starts past 2^32 bytes
# runs only its own tiles. Sparse emulator buffers hold the > 4 GB tensors (pages materialise
# where written) and sit 4 GB apart, so a 32-bit offset that wrapped would fault or read zeros.
BIG_ROWS = {"NT": 1 << 25, "NN": 1 << 25, "TN": 1 << 26}   # rows before the group: 4 GB of a (and out)


@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
def test_beyond_4gb(layout):
    from mxgemm.emu import Emulator
    variant = small(layout, "e4m3", "bf16")
    lens, n, k = [70], 64, 128
    c = make_case(layout, "e4m3", lens, n, k, seed=11)
    s0 = BIG_ROWS[layout]
    emu = Emulator(arch="gfx950", race_check=True)
    prog = emu.load(build.artifact(KERNEL, variant).asm)

    def big(rows_data):   # sparse [s0 + rows, cols] fp8 buffer holding rows_data at rows s0..
        rows, cols = rows_data.shape
        buf = emu.sparse_buffer((s0 + rows) * cols)
        buf.write(s0 * cols, rows_data.view(torch.uint8).contiguous().view(-1))
        return buf

    offs = torch.tensor([s0, s0 + lens[0]], dtype=torch.int64)
    a = big(c["a"])
    if layout == "TN":
        b, m, nn, kk = big(c["b"]), c["a"].shape[1], c["b"].shape[1], s0 + lens[0]
        out = torch.full((1, m, nn), float("nan"), dtype=torch.bfloat16)
    else:
        b, m, nn, kk = c["b"].view(torch.uint8), s0 + lens[0], n, k
        out = emu.sparse_buffer(m * n * 2)
        assert m * n * 2 > 1 << 32
    assert (s0 + lens[0]) * c["a"].shape[1] > 1 << 32
    grid = 2
    emu.launch(prog, KERNEL, grid=(grid, 1, 1), block=(256, 1, 1),
               args=ORDER(**args_of(dict(c, group_offs=offs), a, b, out, 1, m, nn, kk, 1, grid)))
    if layout != "TN":
        out = out.read(s0 * n * 2, lens[0] * n * 2).view(torch.bfloat16).view(lens[0], n)
    metrics.assert_bitwise_equal(out, reference_out(layout, c, torch.bfloat16), f"{layout} beyond 4 GB")


# ---- race mode catches a missing wait in the contraction loop ----
def _k_loop(asm):
    """Line range of the innermost loop holding the MFMAs (the contraction loop)."""
    lines = asm.splitlines()
    k_loops = [r for r in asm_facts.loops(asm, KERNEL) if any("v_mfma" in lines[i] for i in r)]
    return min(k_loops, key=len)


@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_dropped_k_loop_vmcnt_wait_raises(layout):
    """Deleting any one s_waitcnt vmcnt of the contraction loop (the waits for the prefetched
    tiles before they are staged into LDS) makes race mode raise; the shipped code runs clean
    (every other test)."""
    from mxgemm.emu import Emulator, RaceError
    variant = small(layout, "e4m3", "bf16")
    asm = build.artifact(KERNEL, variant).asm
    lines = asm.splitlines()
    waits = [i for i in _k_loop(asm) if lines[i].strip().startswith("s_waitcnt") and "vmcnt" in lines[i]]
    assert waits
    c = make_case(layout, "e4m3", [130] if layout == "TN" else [64], 64, 256, seed=2)
    (m, n, k), out_shape = ((64, 256, 130), (1, 64, 256)) if layout == "TN" else ((64, 64, 256), (64, 64))
    for i in waits:
        mutated = lines[:i] + ["\t; deleted: " + lines[i].strip()] + lines[i + 1:]
        emu = Emulator(arch="gfx950", race_check=True)
        out = torch.zeros(out_shape, dtype=torch.bfloat16)
        with pytest.raises(RaceError):
            emu.launch(emu.load("\n".join(mutated)), KERNEL, grid=(1, 1, 1), block=(256, 1, 1),
                       args=ORDER(**args_of(c, c["a"], c["b"], out, 1, m, n, k, 1, 1)))


# B (NT/NN) and the output (TN) beyond 4 GB: the tensors are too large to compute whole, so one
# workgroup window runs the last tile, whose operand or output bytes start past 2^32; only the
# bytes that tile reads are written into the sparse buffers (the rest read as zeros).
WIN = 64  # the 64 x 64 tile


# NN's row stride is N bytes and a tile's offsets span 128 of them (< 2^31), so N < 2^24 there.
@pytest.mark.parametrize("layout,n,k", [("NT", 1 << 25, 128), ("NN", 1 << 22, 1024)])
def test_b_beyond_4gb_window(layout, n, k):
    """G = 2, group 0 empty, N * K = 2^32: group 1's weights start at 4 GB; the last tile (rows
    64..69, columns N-64..N; for NT its output too) lies past 4 GB."""
    from mxgemm.emu import Emulator
    lens = [0, 70]
    c = make_case(layout, "e4m3", lens, WIN, k, seed=13)   # b holds only the tile's 64 columns
    emu = Emulator(arch="gfx950", race_check=True)
    b = emu.sparse_buffer(2 * n * k)
    j0 = n - WIN
    if layout == "NT":   # b[1, j0 + j, :] for the tile's columns
        b.write((n + j0) * k, c["b"][1].view(torch.uint8).contiguous().view(-1))
    else:                # b[1, kk, j0 .. j0 + 63] for every contraction row
        for kk in range(k):
            b.write((k + kk) * n + j0, c["b"][1, kk].view(torch.uint8).contiguous())
    out = emu.sparse_buffer(70 * n * 2)
    m_tiles, n_tiles = 2, n // WIN
    grid = m_tiles * n_tiles
    emu.launch(emu.load(build.artifact(KERNEL, small(layout, "e4m3", "bf16")).asm), KERNEL, grid=(grid, 1, 1),
               block=(256, 1, 1), workgroups=[(grid - 1, 0, 0)],
               args=ORDER(**args_of(c, c["a"], b, out, 2, 70, n, k, 1, grid)))
    got = torch.stack([out.read((r * n + j0) * 2, WIN * 2).view(torch.bfloat16) for r in range(64, 70)])
    metrics.assert_bitwise_equal(got, reference_out(layout, c, torch.bfloat16)[64:70], f"{layout} B beyond 4 GB")


def test_wgrad_out_beyond_4gb_window():
    """TN with out [2, 2^16, 2^16] bf16 (16 GB): the last tile of group 1 starts past 2^33 bytes."""
    from mxgemm.emu import Emulator
    lens, m = [3, 5], 1 << 16
    c = make_case("TN", "e4m3", lens, m, m, seed=17)    # a [8, m], b [8, m]
    emu = Emulator(arch="gfx950", race_check=True)
    out = emu.sparse_buffer(2 * m * m * 2)
    tiles = m // WIN
    grid = 2 * tiles * tiles
    emu.launch(emu.load(build.artifact(KERNEL, small("TN", "e4m3", "bf16")).asm), KERNEL, grid=(grid, 1, 1),
               block=(256, 1, 1), workgroups=[(grid - 1, 0, 0)],   # tile grid - 1: group 1, last (m, n) tile
               args=ORDER(**args_of(c, c["a"], c["b"], out, 2, m, m, 8, 1, grid)))
    i0 = m - WIN
    got = torch.stack([out.read(((m + i0 + r) * m + i0) * 2, WIN * 2).view(torch.bfloat16) for r in range(WIN)])
    tile = dict(c, a=c["a"][:, i0:].contiguous(), b=c["b"][:, i0:].contiguous())
    metrics.assert_bitwise_equal(got, reference_out("TN", tile, torch.bfloat16)[1], "TN out beyond 4 GB")

