"""mx_gemm (FlyDSL family mx_gemm): MXFP8 / MXFP6 / MXFP4 / A8W4 GEMM on the gfx950 emulator.

Contract: bitwise. Every registered gfx950 variant runs through the public op on the emulator in
race mode and must equal mxgemm.reference.mx_gemm_ref(chunk=128, splits=...) bit for bit: the
scaled 16x16x128 MFMA sums its 128-wide K step exactly and rounds once to fp32 (the emulator's
MFMA model), the kernel adds the steps into an fp32 accumulator from +0 in K order, and the
reference models exactly that (its 128-K chunks are summed exactly, as rationals where float64
would round). A kernel that rounded per 32-block, added steps in another order, converted bf16
by truncation or mixed up a scale block would differ in the last bits of many elements, which
a bitwise comparison catches. Split-K: two fp32 partials commute, so SPLITS=2 is bitwise in any
workgroup order; more splits are bitwise for the emulator's linear order (partials added in
split order, as the reference adds them).

Shapes are kept small (one or two workgroups, two or three K steps) so the whole file stays a
few tens of CPU seconds; they cover M, N, K at and off tile multiples and empty K splits.
"""
import re

import pytest
import torch

import mxgemm
from mxgemm import asm_facts, build, formats, guards, launcher, quant, reference, registry
from mxgemm.launcher import emulator_settings
from mxgemm.ops import dense_mx

KERNEL = registry.get("mx_gemm")
OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}
CODE = {"e4m3": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}   # cbsz / blgp, docs/gfx950_isa.md §1.2
SENTINEL = -3.0


def operand(rows, k, fmt, g, lo=117, hi=137):
    """Random finite codes (fp8: N(0,1) x 2^[-4, 4] rounded to the format; fp4 / fp6: every code,
    packed) and e8m0 scales in [lo, hi)."""
    if fmt in formats.PACKED:
        x = formats.PACKED[fmt][2](torch.randint(0, 1 << BITS[fmt], (rows, k), generator=g, dtype=torch.uint8))
    else:
        v = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-4, 5, (rows, k), generator=g).float())
        x = formats.to_torch_fp8(formats.encode(v, fmt), fmt)
    return x, torch.randint(lo, hi, (rows, k // 32), generator=g, dtype=torch.uint8)


def run(v, M, N, K, seed=0, splits=1, out=None):
    """SCALE_SHUFFLED variants get quant.shuffle_scales of the same scales, padding 0xff (NaN):
    a kernel reading a padding byte into a stored element would show it."""
    g = torch.Generator().manual_seed(seed)
    a, sa = operand(M, K, v["A_FMT"], g)
    b, sb = operand(N, K, v["B_FMT"], g)
    kw = dict(a_format=v["A_FMT"], b_format=v["B_FMT"], out_dtype=OUT[v["OUT"]],
              config={"BM": v["BM"], "BN": v["BN"], "SPLITS": splits})
    xa, xb = sa, sb
    if v.get("SCALE_SHUFFLED"):
        xa, xb = (nan_padded_shuffle(x) for x in (sa, sb))
        kw["shuffled_scales"] = True
    assert mxgemm.explain("mx_gemm", a, xa, b, xb, **kw).variant == v
    got = mxgemm.mx_gemm(a, xa, b, xb, out=out, **kw)
    ref = reference.mx_gemm_ref(a, sa, b, sb, v["A_FMT"], v["B_FMT"], OUT[v["OUT"]], chunk=reference.MX_MMA_K,
                                splits=splits)
    return got, ref


def nan_padded_shuffle(s):
    """quant.shuffle_scales(s) with its padding (rows to 32, columns to 8) set to 0xff."""
    marked = quant.shuffle_scales(torch.ones_like(s)).bool()
    return quant.shuffle_scales(s).masked_fill(~marked, 0xFF)


def vid(v):
    return registry.variant_id(v)


# ---- every variant vs the reference ----
@pytest.mark.parametrize("fmts", [("e2m3", "e3m2"), ("e3m2", "e4m3")])
def test_fp6_tails_multi_tile(fmts):
    """FP6 rows (96 bytes per K step, fragments straddling 16-byte chunks): 2 x 2 tiles with a row
    tail, 3 K steps (odd: the unrolled loop's remainder). First in the file: the mutation harness
    (pytest -x) reaches an FP6 variant before rebuilding every other one."""
    v = dict(A_FMT=fmts[0], B_FMT=fmts[1], BM=64, BN=64, OUT="bf16", SPLITK=0, NUM_BUFFERS=2)
    got, ref = run(v, 67, 96, 384, seed=9)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("v", KERNEL.variants, ids=vid)
def test_variant_bitwise(v):
    # a partial row tile and a partial column tile; 2 K steps (both LDS stages), 3 steps in 2
    # uneven K splits, or with two steps per stage 5 (both stages, then a half-full one, whose
    # second step would read past a's last row)
    M, N = v["BM"] - 5, max(32, v["BN"] - 32)
    splits = 2 if v["SPLITK"] else 1
    steps = 5 if v.get("STAGE_STEPS", 1) == 2 else 2 + v["SPLITK"]
    got, ref = run(v, M, N, 128 * steps, seed=1, splits=splits)
    assert got.dtype == OUT[v["OUT"]] and got.shape == (M, N)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


MXFP8 = dict(A_FMT="e4m3", B_FMT="e4m3", NUM_BUFFERS=2, SPLITK=0)


@pytest.mark.parametrize("M,N,K", [(1, 32, 128), (64, 64, 384), (65, 96, 128), (130, 160, 256)])
def test_shapes_at_and_off_tile_multiples(M, N, K):
    """64 x 64 tiles: one row, exact tiles, a one-row tail, several tiles in both directions."""
    got, ref = run({**MXFP8, "BM": 64, "BN": 64, "OUT": "bf16"}, M, N, K, seed=2)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("fmts", [("e2m1", "e2m1"), ("e4m3", "e2m1")], ids=["mxfp4", "a8w4"])
def test_fp4_tails_multi_tile(fmts):
    v = dict(A_FMT=fmts[0], B_FMT=fmts[1], BM=64, BN=64, OUT="f32", SPLITK=0, NUM_BUFFERS=2)
    got, ref = run(v, 67, 96, 384, seed=3)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("bm,K", [(128, 128), (128, 256), (128, 768), (256, 128), (256, 512), (256, 768),
                                  (256, 1536), (256, 2816), (256, 3200)])
def test_fp4_two_step_stages(bm, K):
    """MXFP4 128 x 128 and 256 x 128 stage two K steps. 128 x 128 (two stages, one scale window,
    a loop iteration): one half-full stage only, one full stage, three (one iteration and one
    more). 256 x 128 (three buffers, eight waves, a scale window of two ring turns: six stages an
    iteration): a half stage only, two stages, three (no iteration), six (one), eleven (one, then
    five from the last window), thirteen (two, then a half stage). Two row tiles, the second of 2
    rows, whose scale windows reach past the scale tensor's end."""
    v = next(v for v in KERNEL.variants_for("gfx950") if v.get("STAGE_STEPS") == 2 and v["BM"] == bm)
    got, ref = run(v, bm + 2, 96, K, seed=4)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("K", [256, 896, 1536, 1920, 3456])
@pytest.mark.parametrize("fmts", [("e4m3", "e4m3"), ("e4m3", "e2m1")], ids=["mxfp8", "a8w4"])
def test_one_step_stages_at_256(fmts, K):
    """MXFP8 and A8W4 256 x 128 keep two stages in flight (three buffers, eight waves, a scale
    window of four ring turns: twelve stages a loop iteration): two stages, seven (no iteration),
    twelve (one), fifteen (one, then three from the last window), twenty-seven (two, then three).
    Two row tiles, the second of 2 rows."""
    v = next(v for v in KERNEL.variants_for("gfx950") if (v["A_FMT"], v["B_FMT"]) == fmts and v["BM"] == 256)
    assert (v["NUM_BUFFERS"], v["WINDOW_TURNS"]) == (3, 4)
    got, ref = run(v, 258, 96, K, seed=12)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("bm", [128, 256])
def test_nan_scale_stays_in_its_row(bm):
    """A NaN scale (0xff) in the first K block of A row 1 and of B row 1, 5 K steps: rows and
    columns 1 are NaN, nothing else. The half-full last stage's second step lies past row 0's
    scale bytes, where row 1's begin; a kernel that took them as row 0's scales (times zero
    operands, still NaN) would poison row and column 0."""
    v = next(v for v in KERNEL.variants_for("gfx950") if v.get("STAGE_STEPS") == 2 and v["BM"] == bm)
    g = torch.Generator().manual_seed(11)
    a, sa = operand(bm + 2, 640, "e2m1", g)
    b, sb = operand(96, 640, "e2m1", g)
    sa[1, 0] = sb[1, 0] = 0xFF
    got = mxgemm.mx_gemm(a, sa, b, sb, a_format="e2m1", b_format="e2m1", config={"BM": bm, "BN": v["BN"]})
    ref = reference.mx_gemm_ref(a, sa, b, sb, "e2m1", "e2m1", torch.bfloat16, chunk=reference.MX_MMA_K)
    nan = torch.zeros_like(ref, dtype=torch.bool)
    nan[1, :] = nan[:, 1] = True
    assert torch.equal(ref.isnan(), nan) and torch.equal(got.isnan(), nan)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


def shuffled_variant(fmts, bm):
    return next(v for v in KERNEL.variants_for("gfx950")
                if (v["A_FMT"], v["B_FMT"]) == fmts and v["BM"] == bm and v.get("SCALE_SHUFFLED"))


@pytest.mark.parametrize("fmts,K", [(("e4m3", "e4m3"), 1920), (("e4m3", "e4m3"), 3456), (("e2m1", "e2m1"), 2816),
                                    (("e2m1", "e2m1"), 3200), (("e4m3", "e2m1"), 1664)])
def test_shuffled_scales_over_windows(fmts, K):
    """Shuffled scales at 256 x 128 (windows of 12 K steps, six 256-byte chunks): MXFP8 15 steps
    (a window, then 3), 27 (two, then 3); MXFP4 11 stages (one, then 5), 12 and a half (two, then a
    half stage, whose second step's bytes are the NaN padding); A8W4 13 steps, K % 256 = 128 (padded
    columns). Two row tiles, the second of 2 rows."""
    got, ref = run(shuffled_variant(fmts, 256), 258, 96, K, seed=13)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("bm", [128, 256])
def test_shuffled_nan_scale_stays_in_its_row(bm):
    """A NaN scale in A rows 1 and 17 and B rows 1 and 17 (the two 16-row tiles of a shuffled
    dword: op_sel bit 0), K blocks 0 and 5 (K steps 0 and 1: op_sel bit 1): exactly those rows and
    columns are NaN."""
    g = torch.Generator().manual_seed(14)
    a, sa = operand(bm + 2, 640, "e2m1", g)
    b, sb = operand(96, 640, "e2m1", g)
    sa[1, 0] = sb[1, 0] = sa[17, 5] = sb[17, 5] = 0xFF
    got = mxgemm.mx_gemm(a, nan_padded_shuffle(sa), b, nan_padded_shuffle(sb), a_format="e2m1", b_format="e2m1",
                         config={"BM": bm, "BN": 128}, shuffled_scales=True)
    ref = reference.mx_gemm_ref(a, sa, b, sb, "e2m1", "e2m1", torch.bfloat16, chunk=reference.MX_MMA_K)
    nan = torch.zeros_like(ref, dtype=torch.bool)
    nan[[1, 17], :] = nan[:, [1, 17]] = True
    assert torch.equal(ref.isnan(), nan) and torch.equal(got.isnan(), nan)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("splits,K", [(3, 640), (4, 384)], ids=["uneven", "empty-split"])
def test_split_k_in_split_order(splits, K):
    """640 = 5 steps in splits of 2, 2, 1; 384 = 3 steps over 4 splits (the last has none)."""
    v = dict(A_FMT="e4m3", B_FMT="e2m1", BM=64, BN=64, OUT="f32", SPLITK=1, NUM_BUFFERS=2)
    got, ref = run(v, 40, 64, K, seed=4, splits=splits)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_two_splits_commute_in_any_workgroup_order():
    v = dict(A_FMT="e5m2", B_FMT="e5m2", BM=64, BN=64, OUT="f32", SPLITK=1, NUM_BUFFERS=2)
    with emulator_settings(wg_order="shuffled", seed=3):
        got, ref = run(v, 64, 64, 768, seed=5, splits=2)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_split_k_zeroes_a_given_out():
    v = dict(A_FMT="e4m3", B_FMT="e4m3", BM=64, BN=64, OUT="f32", SPLITK=1, NUM_BUFFERS=2)
    out = torch.full((32, 32), SENTINEL)
    got, ref = run(v, 32, 32, 256, seed=6, splits=2, out=out)
    assert got is out
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_e8m0_dtypes_and_fp4_dtype_accepted():
    g = torch.Generator().manual_seed(7)
    a, sa = operand(16, 256, "e4m3", g)
    b, sb = operand(32, 256, "e2m1", g)
    got = mxgemm.mx_gemm(a, sa.view(torch.float8_e8m0fnu), b.view(torch.float4_e2m1fn_x2),
                         sb.view(torch.float8_e8m0fnu), b_format="e2m1")
    torch.testing.assert_close(got, reference.mx_gemm_ref(a, sa, b, sb, "e4m3", "e2m1", chunk=128),
                               rtol=0, atol=0)


def test_heuristic_tiles_and_split():
    def pick(*a):
        return dense_mx.heuristic_config("gfx950", *a)
    assert pick("e4m3", "e4m3", "bf16", 8192, 8192, 8192).variant["BM"] == 256   # 32 x 64 tiles >= 256 CUs
    assert pick("e4m3", "e4m3", "bf16", 2048, 2048, 4096).variant["BM"] == 128
    split = pick("e4m3", "e2m1", "f32", 64, 256, 4096)
    assert split.variant["SPLITK"] == 1 and split.options == {"splits": 2}
    assert pick("e4m3", "e2m1", "bf16", 64, 256, 4096).options == {"splits": 1}   # split-K only into f32
    shuffled = dense_mx.heuristic_config("gfx950", "e2m1", "e2m1", "bf16", 8192, 8192, 8192, shuffled=1).variant
    assert shuffled["SCALE_SHUFFLED"] == 1 and shuffled["BM"] == 256
    small = dense_mx.heuristic_config("gfx950", "e4m3", "e4m3", "bf16", 64, 256, 4096, shuffled=1)
    assert small.variant["SCALE_SHUFFLED"] == 1 and small.options == {"splits": 1}


# ---- guards: GuardError before any launch, out untouched ----
def _call(**over):
    g = torch.Generator().manual_seed(8)
    a, sa = operand(8, 256, "e4m3", g)
    b, sb = operand(64, 256, "e4m3", g)
    args = dict(a=a, a_scale=sa, b=b, b_scale=sb, out=torch.full((8, 64), SENTINEL, dtype=torch.bfloat16))
    args.update(over)
    return args


@pytest.mark.parametrize("over,rule", [
    (dict(a_format="e3m3"), "format"),
    (dict(b_format="fp6"), "format"),
    (dict(a_format="e3m2"), "dtype"),                # an fp8 tensor is not an FP6 payload
    (dict(a_format="e2m3", a=torch.zeros(8, 190, dtype=torch.uint8)), "fp6-bytes"),
    (dict(a_format="e2m3", a=torch.zeros(8, 120, dtype=torch.uint8), a_scale=torch.zeros(8, 5, dtype=torch.uint8),
          b=torch.zeros(64, 160, dtype=torch.uint8), b_scale=torch.zeros(64, 5, dtype=torch.uint8)), "K%128"),
    (dict(b_format="e3m2", b=torch.zeros(64, 255, dtype=torch.uint8)), "shape"),   # K 340, a's 256
    (dict(b_format="e3m2", b=torch.zeros(64, 192, dtype=torch.uint8), config={"BM": 128, "BN": 128}), "config"),
    (dict(a=torch.zeros(8, 256, dtype=torch.float8_e5m2)), "dtype"),
    (dict(a_scale=torch.zeros(8, 8, dtype=torch.int32)), "dtype"),
    (dict(a=torch.zeros(8, 160, dtype=torch.uint8), a_scale=torch.zeros(8, 5, dtype=torch.uint8)), "K%128"),
    (dict(b=torch.zeros(64, 128, dtype=torch.uint8)), "shape"),
    (dict(b_scale=torch.zeros(64, 4, dtype=torch.uint8)), "shape"),
    (dict(b=torch.zeros(48, 256, dtype=torch.uint8), b_scale=torch.zeros(48, 8, dtype=torch.uint8)), "N%32"),
    (dict(out=torch.full((8, 64), SENTINEL, dtype=torch.float32)), "dtype"),
    (dict(out=torch.full((64, 8), SENTINEL, dtype=torch.bfloat16).t()), "contiguity"),
    (dict(out_dtype=torch.int32), "dtype"),
    (dict(config={"BM": 32}), "config"),
    (dict(config={"SPLITS": 2}), "config"),          # split-K needs f32 out
    (dict(config={"SPLITS": 99}), "config"),
    (dict(shuffled_scales=True, a_scale=torch.zeros(8, 8, dtype=torch.uint8)), "shuffled-scales"),   # 8 rows
    (dict(shuffled_scales=True, a_scale=torch.zeros(32, 4, dtype=torch.uint8)), "shape"),   # 8 columns for K 256
    (dict(shuffled_scales=True, a_scale=torch.zeros(32, 8, dtype=torch.uint8), b_scale=torch.zeros(32, 8, dtype=torch.uint8)),
     "shuffled-scales"),                                                # 32 rows for b's 64
    (dict(shuffled_scales=True, a=torch.zeros(8, 256, dtype=torch.float8_e5m2), a_format="e5m2",
          b=torch.zeros(64, 256, dtype=torch.float8_e5m2), b_format="e5m2"), "shuffled-scales"),   # no such variant
    (dict(shuffled_scales=True, out_dtype=torch.float32, out=torch.full((8, 64), SENTINEL)), "shuffled-scales"),
    (dict(shuffled_scales=True, out_dtype=torch.float32, out=torch.full((8, 64), SENTINEL), config={"SPLITS": 2}),
     "shuffled-scales"),
])
def test_guard(over, rule):
    if over.get("shuffled_scales") and "a_scale" not in over:       # scales shuffled as the op expects
        g = torch.Generator().manual_seed(8)
        over = dict(a_scale=torch.randint(117, 137, (32, 8), generator=g, dtype=torch.uint8),
                    b_scale=torch.randint(117, 137, (64, 8), generator=g, dtype=torch.uint8), **over)
    args = _call(**over)
    out = args["out"]
    before = out.clone()
    kw = {k: args.pop(k) for k in list(args) if k not in ("a", "a_scale", "b", "b_scale")}
    with pytest.raises(guards.GuardError) as e:
        mxgemm.mx_gemm(args["a"], args["a_scale"], args["b"], args["b_scale"], **kw)
    assert e.value.rule == rule, e.value
    assert torch.equal(out, before)


def test_guard_arch_non_gfx950_device():
    dev = "meta"   # a device that is neither a gfx950 GPU nor the emulator's CPU
    args = [t.to(dev) for t in (_call()[n] for n in ("a", "a_scale", "b", "b_scale"))]
    with pytest.raises(guards.GuardError, match=r"\[arch\].*meta"):
        mxgemm.mx_gemm(*args)


def test_guard_fp6_has_no_gfx1250_variant(monkeypatch):
    monkeypatch.setattr(launcher, "EMU_ARCH", "gfx1250")     # MXGEMM_EMU_ARCH=gfx1250, read at import
    g = torch.Generator().manual_seed(10)
    a, sa = operand(16, 256, "e2m3", g)
    b, sb = operand(32, 256, "e4m3", g)
    with pytest.raises(guards.GuardError, match=r"\[arch\].*gfx1250.*e2m3 x e4m3"):
        mxgemm.explain("mx_gemm", a, sa, b, sb, a_format="e2m3")


def test_guard_tile_voffset():
    # a 64-row tile of a K = 2^25 operand spans 2^31 bytes: the kernel's 32-bit tile offsets overflow
    K = 2 ** 25
    a = torch.empty(1, K, dtype=torch.float8_e4m3fn)
    b = torch.empty(32, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(guards.GuardError, match=r"\[2GB-voffset\]"):
        mxgemm.explain("mx_gemm", a, torch.empty(1, K // 32, dtype=torch.uint8), b,
                       torch.empty(32, K // 32, dtype=torch.uint8))


# ---- ISA ----
def scale_byte(mfma, src):
    """The scale byte {op_sel_hi, op_sel} an MFMA line takes for src 0 (B) or 1 (A)."""
    bits = [re.search(rf"{f}:\[(\d),(\d)", mfma) for f in ("op_sel_hi", "op_sel")]
    return sum(2 ** (1 - i) * int(m.group(1 + src)) for i, m in enumerate(bits) if m)


@pytest.mark.parametrize("v", KERNEL.variants, ids=vid)
def test_isa(v):
    art = build.artifact("mx_gemm", v)
    info, threads = art.isa(), KERNEL.threads_for("gfx950", v)
    print(f"\nmx_gemm [{vid(v)}]: {info.summary(threads)}")
    assert info.spills == 0 and info.scratch_bytes == 0
    per_stage = v.get("STAGE_STEPS", 1)           # K steps of 128 per LDS stage
    a_tile, b_tile = (rows * 128 * per_stage * BITS[v[f]] // 8 for rows, f in ((v["BM"], "A_FMT"), (v["BN"], "B_FMT")))
    assert info.lds_bytes == v["NUM_BUFFERS"] * (a_tile + b_tile) <= 160 * 1024
    assert info.occupancy(threads) >= 1
    lines = asm_facts.hot_loop(art.asm, art.symbol)    # FP6's partial DMA branches: the widest back-edge
    loop = " ".join(lines)
    # per K step: one MFMA per 16 x 16 tile of the wave (WAVES / 2 x 2 waves) and one ds_bpermute
    # (its scale dword) per tile row of A and B; per loop iteration, a scale window of 2 (two
    # buffers) or 3 (three) stages a ring turn, one load per tile row of the window's dwords over 4 lane
    # groups; per stage one 16-byte buffer -> LDS DMA per 16 bytes a thread (a last partial one,
    # FP6: 6 KiB tiles)
    mi, nj = v["BM"] // (threads // 128) // 16, v["BN"] // 32      # the wave's tile rows of A and B
    mfmas = [ln for ln in lines if ln.startswith("v_mfma_scale_f32_16x16x128_f8f6f4")]
    steps = len(mfmas) // (mi * nj)
    assert steps >= 1 and len(mfmas) == steps * mi * nj and steps % per_stage == 0
    assert loop.count("offen lds") == steps // per_stage * (-(-a_tile // (16 * threads)) - (-b_tile // (16 * threads)))
    tile_rows, span = mi + nj, v["NUM_BUFFERS"] * v.get("WINDOW_TURNS", 1)
    assert "buffer_load_ubyte" not in loop
    if v.get("SCALE_SHUFFLED"):
        # shuffled scales: a dword per pair of tile rows and 2 K steps, its byte picked by the MFMA's
        # op_sel (all four of A's and of B's), no lane exchange; the lighter loop LLVM may unroll
        # by whole windows
        assert steps % (span * per_stage) == 0
        window = [ln for ln in lines if ln.startswith("buffer_load_dword ") and " lds" not in ln]
        assert len(window) == tile_rows // 2 * steps // 2 and "ds_bpermute" not in loop
        assert {scale_byte(ln, 0) for ln in mfmas} == {scale_byte(ln, 1) for ln in mfmas} == {0, 1, 2, 3}
    else:
        assert steps == span * per_stage
        n = -(-span * per_stage // 4)
        window = [ln for ln in lines if ln.startswith("buffer_load_dword" + (f"x{n} " if n > 1 else " "))
                  and " lds" not in ln]
        assert len(window) == tile_rows
        assert loop.count("ds_bpermute_b32") == steps * tile_rows
    assert ("buffer_atomic_add_f32" in art.asm) == bool(v["SPLITK"])
    # src0 = B rows, src1 = A rows: cbsz is B's format code, blgp A's (0 is not printed); an
    # operand of b-bit elements spans 32 b / 32 VGPRs (FP6: 6)
    regs = {CODE[v["B_FMT"]]: BITS[v["B_FMT"]], CODE[v["A_FMT"]]: BITS[v["A_FMT"]]}
    for ln in mfmas:
        ops = ln.split()
        codes = dict(re.findall(r"(cbsz|blgp):(\d)", ln))
        assert (int(codes.get("cbsz", 0)), int(codes.get("blgp", 0))) == (CODE[v["B_FMT"]], CODE[v["A_FMT"]]), ln
        for src, code in ((ops[2], CODE[v["B_FMT"]]), (ops[3], CODE[v["A_FMT"]])):
            lo, hi = map(int, re.match(r"[va]\[(\d+):(\d+)\]", src).groups())   # VGPRs or AGPRs
            assert hi - lo + 1 == regs[code], ln
