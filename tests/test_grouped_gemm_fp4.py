"""train_grouped_gemm's MXFP4 variants (FMT = FMT_B = e2m1, GRAN mx) through grouped_gemm_fp4_kernel
(NT: forward / dgrad) and grouped_gemm_fp4_variable_k (NTK: the K-contiguous wgrad) on the emulator.

Spec: the reference (mxgemm.reference.grouped_gemm_fp4_ref / _variable_k_ref) equals an
independent numpy model written from the OCP MX spec (e2m1 codes: sign, 2-bit exponent bias 1,
1-bit mantissa, element 2i in the low nibble; e8m0: 2^(e - 127)) and the scaled MFMA's numerics
as docs/gfx950_isa.md §1.5 has them (each 128-wide chunk's scaled products summed exactly,
rounded once to fp32, chunks added in order from +0, then RNE to bf16 / fp16). Every e2m1
variant is bit-identical to the reference in race mode with shuffled workgroup order: uneven
groups with an empty one, row counts and N (M, N for NTK) off the tile, a contraction of 2-3
steps with a partial last one, a padded tail (NT: zero rows; NTK: never read) whose scale bytes
are 0xFF (NaN if read), accumulation into an out holding values. One negative test per guard of
the two ops. Code objects: no spills, the contraction loop's scaled MFMAs with both format codes
e2m1 (cbsz:4 blgp:4), two per 16 x 16 tile and step.
"""
import numpy as np
import pytest
import torch

import mxgemm
from mxgemm import asm_facts, build, guards, launcher, metrics, reference, registry
from mxgemm.quant import quantize_mx

KERNEL = "train_grouped_gemm"
FP4_VARIANTS = [v for v in registry.get(KERNEL).variants if v["FMT"] == "e2m1"]
OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
NAN_SCALE = 0xFF   # e8m0 NaN: a tail scale the kernel must never apply


def offsets(lens):
    return torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int64)


def fp4(g, *shape):
    """(payload uint8 [..., K/2], e8m0 [..., K/32]) of Gaussians times 2^u (u in [-3, 3] per row)."""
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-3, 4, (*shape[:-1], 1), generator=g).float())
    return quantize_mx(x, "e2m1")


# ---- the reference against an independent model ----
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])   # magnitudes of codes 0..7 (OCP MX spec, §5.3.3)


def numpy_fp4_gemm(a, sa, b, sb, out):
    """a [M, K/2], b [N, K/2] packed e2m1 with e8m0 sa, sb per 32 -> fp32 [M, N] per the model above."""
    def values(p, s):
        p = p.numpy().astype(np.int64)
        codes = np.stack([p & 0xF, p >> 4], -1).reshape(p.shape[0], 2 * p.shape[1])   # element 2i: low nibble
        v = np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]
        return v * np.exp2(np.repeat(s.numpy().astype(np.float64) - 127, 32, 1).reshape(v.shape))
    xa, xb = values(a, sa), values(b, sb)
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for k in range(0, xa.shape[1], 128):   # exact in float64 here: the scales stay within 2^±10
        acc = acc + (xa[:, k:k + 128] @ xb[:, k:k + 128].T).astype(np.float32)
    bits = torch.from_numpy(acc).view(torch.int32)
    if out == "bf16":   # RNE to the upper 16 bits
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).view(torch.float32).bfloat16()
    return torch.from_numpy(acc).half()


@pytest.mark.parametrize("out", ["bf16", "f16"])
def test_reference_is_the_mx_model(out):
    g = torch.Generator().manual_seed(1)
    lens = [40, 0, 24]
    a, sa = fp4(g, sum(lens), 320)
    b, sb = fp4(g, 3, 48, 320)
    got = reference.grouped_gemm_fp4_ref(a, sa, b, sb, offsets(lens), OUT[out])
    o = offsets(lens).tolist()
    for i in range(3):
        metrics.assert_bitwise_equal(got[o[i]:o[i + 1]], numpy_fp4_gemm(a[o[i]:o[i + 1]], sa[o[i]:o[i + 1]], b[i],
                                                                         sb[i], out), f"NT group {i}")
    lens = [64, 0, 288]
    a, sa = fp4(g, 32, sum(lens))
    b, sb = fp4(g, 16, sum(lens))
    got = reference.grouped_gemm_fp4_variable_k_ref(a, sa, b, sb, offsets(lens), OUT[out])
    o = offsets(lens).tolist()
    for i in range(3):
        ks, kx = slice(o[i] // 2, o[i + 1] // 2), slice(o[i] // 32, o[i + 1] // 32)
        metrics.assert_bitwise_equal(got[i], numpy_fp4_gemm(a[:, ks], sa[:, kx], b[:, ks], sb[:, kx], out),
                                     f"NTK group {i}")


# ---- every variant bit-exact on the emulator (race mode) ----
def nt_case(seed, bm, tail=5):
    """Groups bm + 3, 0, 2 rows and bm - 9 (partial row tiles), N = 48 + bm (off the tile), K = 576
    (2.25 steps of 256), a tail of `tail` rows whose scales are NaN bytes."""
    g = torch.Generator().manual_seed(seed)
    lens = [bm + 3, 0, 2, bm - 9]
    a, sa = fp4(g, sum(lens) + tail, 576)
    sa[sum(lens):] = NAN_SCALE
    b, sb = fp4(g, len(lens), 48 + bm, 576)
    return lens, a, sa, b, sb


def ntk_case(seed, accum, out):
    """Groups of 288, 0, 544 and 32 contraction elements (2, 0, 3 and 1 steps of 256) and a tail of
    64 with NaN scale bytes; M = 80, N = 48 (off the 64 tile); accum: out starts with values."""
    g = torch.Generator().manual_seed(seed)
    lens = [288, 0, 544, 32]
    k = sum(lens) + 64
    a, sa = fp4(g, 80, k)
    b, sb = fp4(g, 48, k)
    sa[:, sum(lens) // 32:] = NAN_SCALE
    sb[:, sum(lens) // 32:] = NAN_SCALE
    init = (torch.randn(len(lens), 80, 48, generator=g) * 4).to(OUT[out]) if accum else None
    return lens, a, sa, b, sb, init


@pytest.mark.parametrize("variant", FP4_VARIANTS, ids=registry.variant_id)
def test_variant_bit_exact(variant):
    out, bm, bn = variant["OUT"], variant["BM"], variant["BN"]
    with launcher.emulator_settings(race_check=True, wg_order="shuffled", seed=5):
        if variant["LAYOUT"] == "NT":
            lens, a, sa, b, sb = nt_case(2, bm)
            cfg = dict(BM=bm, BN=bn, GROUP_M=2, PERSISTENT=0)
            plan = mxgemm.explain("grouped_gemm_fp4_kernel", a, sa, b, sb, torch.tensor(lens), out_dtype=OUT[out],
                                  config=cfg)
            got = mxgemm.grouped_gemm_fp4_kernel(a, sa, b, sb, torch.tensor(lens), out_dtype=OUT[out], config=cfg)
            want = reference.grouped_gemm_fp4_ref(a, sa, b, sb, offsets(lens), OUT[out])
            assert not want[sum(lens):].any()   # the tail: zeros
        else:
            accum = variant.get("ACCUM", 0)
            lens, a, sa, b, sb, init = ntk_case(3, accum, out)
            kw = dict(out_dtype=OUT[out], out=init.clone(), accumulate=True) if accum else dict(out_dtype=OUT[out])
            plan = mxgemm.explain("grouped_gemm_fp4_variable_k", a, sa, b, sb, torch.tensor(lens), **kw)
            got = mxgemm.grouped_gemm_fp4_variable_k(a, sa, b, sb, torch.tensor(lens), **kw)
            want = reference.grouped_gemm_fp4_variable_k_ref(a, sa, b, sb, offsets(lens), OUT[out],
                                                             accumulate_into=init)
    assert plan.variant == variant
    assert want.abs().max() > 0 and not want.isnan().any()
    metrics.assert_bitwise_equal(got, want, f"{KERNEL} {registry.variant_id(variant)}")


def test_nt_persistent_grid_and_fp4_dtype():
    """A persistent grid of 3 workgroups looping over the tiles, operands as float4_e2m1fn_x2 and scales as
    float8_e8m0fnu: the same bits as one workgroup per tile on uint8."""
    lens, a, sa, b, sb = nt_case(4, 64, tail=0)
    cfg = dict(BM=64, BN=64, GROUP_M=1, PERSISTENT=0)
    with launcher.emulator_settings(race_check=True):
        got = mxgemm.grouped_gemm_fp4_kernel(a.view(torch.float4_e2m1fn_x2), sa.view(torch.float8_e8m0fnu),
                                             b.view(torch.float4_e2m1fn_x2), sb.view(torch.float8_e8m0fnu),
                                             torch.tensor(lens), num_cu=3, config=cfg)
    metrics.assert_bitwise_equal(got, reference.grouped_gemm_fp4_ref(a, sa, b, sb, offsets(lens)), "persistent")


# ---- guards ----
def _rows_args(**over):
    g = torch.Generator().manual_seed(0)
    a, sa = fp4(g, 40, 64)
    b, sb = fp4(g, 2, 32, 64)
    args = dict(a=a, a_scale=sa, b=b, b_scale=sb, group_lens=torch.tensor([24, 16]))
    args.update(over)
    return args


def _wgrad_args(**over):
    g = torch.Generator().manual_seed(0)
    a, sa = fp4(g, 32, 96)
    b, sb = fp4(g, 16, 96)
    args = dict(a=a, a_scale=sa, b=b, b_scale=sb, group_lens=torch.tensor([64, 32]))
    args.update(over)
    return args


_R, _W = _rows_args(), _wgrad_args()
GUARDS = [
    ("rows", dict(a=_R["a"].view(torch.float8_e4m3fn)), r"\[dtype\] a has dtype torch.float8_e4m3fn; expected torch.uint8 or torch.float4"),
    ("rows", dict(a_scale=_R["a_scale"].float(), b_scale=_R["b_scale"].float()), r"\[dtype\] a_scale has dtype torch.float32; expected torch.uint8"),
    ("rows", dict(b=_R["b"][:, :, :16].contiguous()), r"\[shape\] b has 16 bytes per row"),
    ("rows", dict(b=_R["b"][:1], b_scale=_R["b_scale"][:1]), r"\[shape\] b holds 1 groups"),
    ("rows", dict(a=_R["a"][:, :8].contiguous(), b=_R["b"][:, :, :8].contiguous()), r"\[K%32\] K = 16"),
    ("rows", dict(b=_R["b"][:, :24].contiguous(), b_scale=_R["b_scale"][:, :24]), r"\[N%16\] N = 24"),
    ("rows", dict(a_scale=_R["a_scale"][:, :1]), r"\[scale-shape\] a_scale \[40, 1\]"),
    ("rows", dict(out_dtype=torch.float32), r"\[dtype\] out_dtype is torch.float32"),
    ("rows", dict(out=torch.empty(40, 16, dtype=torch.bfloat16)), r"\[shape\] out"),
    ("rows", dict(num_cu=0), r"\[num_cu\] num_cu = 0"),
    ("rows", dict(group_lens=torch.tensor([24, 17])), r"\[group_lens\] group_lens sums to 41, more than a.shape"),
    ("rows", dict(group_offs=torch.tensor([0, 16, 40])), r"\[group_offs\] group_offs\[1\] = 16; expected 24"),
    ("wgrad", dict(accumulate=True), r"\[accumulate\] accumulate=True adds the product into out"),
    ("wgrad", dict(b=_W["b"][:, :32].contiguous()), r"\[shape\] b has 32 bytes per row"),
    ("wgrad", dict(a=_W["a"][:24].contiguous(), a_scale=_W["a_scale"][:24]), r"\[M%16\] M = 24"),
    ("wgrad", dict(b=_W["b"][:8].contiguous(), b_scale=_W["b_scale"][:8]), r"\[N%16\] N = 8"),
    ("wgrad", dict(a=_W["a"][:, :40].contiguous(), b=_W["b"][:, :40].contiguous(), a_scale=_W["a_scale"][:, :2],
                   b_scale=_W["b_scale"][:, :2], group_lens=torch.tensor([48, 32])), r"\[sum_k%32\] sum_k = 80"),
    ("wgrad", dict(group_lens=torch.tensor([48, 48])), r"\[group_offs\] group_offs\[1\] = 48, not a multiple of 32"),
    ("wgrad", dict(group_lens=torch.tensor([64, 64])), r"\[group_lens\] group_lens sums to 128, more than 2 \* a"),
    ("wgrad", dict(out_dtype=torch.float16, out=torch.empty(2, 32, 16, dtype=torch.bfloat16)),
     r"\[dtype\] out has dtype torch.bfloat16; expected torch.float16"),
]


@pytest.mark.parametrize("op, over, match", GUARDS, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(GUARDS)])
def test_guard(op, over, match):
    args = _rows_args(**over) if op == "rows" else _wgrad_args(**over)
    fn = mxgemm.grouped_gemm_fp4_kernel if op == "rows" else mxgemm.grouped_gemm_fp4_variable_k
    with pytest.raises(guards.GuardError, match=match):
        fn(**args)


# ---- code objects ----
@pytest.mark.parametrize("variant", FP4_VARIANTS, ids=registry.variant_id)
def test_code_object(variant):
    art = build.artifact(KERNEL, variant)
    info = art.isa()
    assert info.spills == 0 and info.scratch_bytes == 0 and info.occupancy(256) >= 1
    mfma = "v_mfma_scale_f32_16x16x128_f8f6f4"
    inner = min((body for body in asm_facts.loop_bodies(art.asm, KERNEL) if any(l.startswith(mfma) for l in body)),
                key=len)
    mfmas = [l for l in inner if l.startswith(mfma)]
    barriers = sum(l.startswith("s_barrier") for l in inner)
    assert barriers >= 1 and len(mfmas) == 2 * (variant["BM"] // 32) * (variant["BN"] // 32) * barriers
    assert all("cbsz:4" in l and "blgp:4" in l for l in mfmas)
