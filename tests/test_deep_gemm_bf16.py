"""DeepGEMM's M-grouped BF16 GEMMs (mxgemm.deep_gemm.m_grouped_bf16_gemm_nt_contiguous / _nn_contiguous
/ _nt_masked) on the blockscale_grouped_gemm kernel family's A_FMT=bf16 variants.

Spec: a and b bf16 without scales, fp32 accumulation, bf16 d written in place. Every row the
kernel writes is bit-identical to mxgemm.reference (each 32-K chunk's exact sum rounded once to
fp32, added in K order: one v_mfma_f32_16x16x32_bf16 each) and within DeepGEMM's own check
(calc_diff < 1e-5 against the float64 product). Padding rows: zeros with m_indices (== -1),
zeros (ensure_zero_padding=True) or untouched (False) in the psum layout; rows past masked_m
untouched. Rows the kernel must not read (padding of a) hold NaN. Every run goes through the
public functions on the emulator in race mode; the plan each call runs is checked to be the
variant the case names. Bad input raises GuardError naming the rule before any launch, d untouched.
"""
import collections
import re

import pytest
import torch

import mxgemm.deep_gemm as deep_gemm
from mxgemm import build, guards, reference, registry
from mxgemm.deep_gemm import utils
from mxgemm.ops.blockscale_grouped_gemm import deep_gemm_fp8_grouped_gemm

KERNEL = "blockscale_grouped_gemm"
SENTINEL = -7.0           # d is pre-filled with it: rows the kernel must not write keep it
BF16_VARIANTS = [v for v in registry.get(KERNEL).variants if v.get("A_FMT") == "bf16"]


def variant(tile, masked=0, psum=0):
    return dict(BM=tile, BN=tile, A_FMT="bf16", UE8M0=0, OUT="bf16", MASKED=masked, **({"PSUM": 1} if psum else {}))


def run(fn, v, *args, **kw):
    kw["config"] = f"BM={v['BM']},BN={v['BN']}"
    assert deep_gemm.explain(fn, *args, **kw).variant == v
    fn(*args, **kw)


def check(d, ref, written, product, pad):
    """Written rows bit-identical to the reference and calc_diff < 1e-5 (DeepGEMM's bound) of the
    float64 product; every other row holds ``pad`` bitwise."""
    assert torch.equal(d[written].view(torch.int16), ref[written].view(torch.int16)), \
        f"{int((d[written] != ref[written]).sum())} elements differ from the reference"
    assert torch.equal(d[~written].view(torch.int16), torch.full_like(d[~written], pad).view(torch.int16))
    assert float(utils.calc_diff(d[written], product[written])) < 1e-5


def m_indices_case(group_rows, n, k, seed, spread=0):
    """a [M, K] with each group padded to 128 rows (m_indices -1, a's padding rows NaN: never read),
    b [G, N, K]; spread > 0: values scaled by 2^U(-spread, spread) (wide-range sums, the
    reference's and emulator's exact-sum fallback)."""
    g = torch.Generator().manual_seed(seed)
    m_indices = torch.cat([torch.cat([torch.full((r,), gi), torch.full((-r % 128,), -1)])
                           for gi, r in enumerate(group_rows)]).int()

    def draw(*shape):
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        if spread:
            x = x * torch.exp2(torch.randint(-spread, spread + 1, shape, generator=g).double())
        return x.bfloat16()
    a, b = draw(len(m_indices), k), draw(len(group_rows), n, k)
    a[m_indices < 0] = float("nan")
    return a, b, m_indices


def product(a, b, owner):
    """float64 a[m] . b[owner[m]] (rows of no group: 0)."""
    return torch.einsum("mk,mnk->mn", a.double().nan_to_num(0), b.double()[owner.clamp(min=0).long()])


# (tile, group rows, N, K, spread): K = 208 and 432 end in a partial 64-element block; 128 x 128 once
CONTIGUOUS = [(32, [100, 0, 37, 128], 64, 208, 0), (32, [45], 32, 432, 0), (32, [60, 70], 64, 128, 40),
              (128, [100, 128], 128, 192, 0)]


@pytest.mark.parametrize("tile,group_rows,n,k,spread", CONTIGUOUS,
                         ids=[f"{t}-G{len(g)}-N{n}-K{k}-spread{s}" for t, g, n, k, s in CONTIGUOUS])
def test_contiguous_m_indices_matches_reference(tile, group_rows, n, k, spread):
    a, b, m_indices = m_indices_case(group_rows, n, k, seed=k + tile, spread=spread)
    d = torch.full((len(m_indices), n), SENTINEL, dtype=torch.bfloat16)
    run(deep_gemm.m_grouped_bf16_gemm_nt_contiguous, variant(tile), a, b, d, m_indices, ensure_zero_padding=False)
    ref = reference.m_grouped_bf16_gemm_nt_contiguous_ref(a, b, m_indices)
    # m_indices padding rows are zeros whatever ensure_zero_padding says (as the FP8 functions)
    check(d, ref, m_indices >= 0, product(a, b, m_indices), 0.0)


PSUM = [(32, True), (32, False), (128, True)]


@pytest.mark.parametrize("tile,zero_padding", PSUM, ids=[f"{t}-zero{int(z)}" for t, z in PSUM])
def test_contiguous_psum_matches_reference(tile, zero_padding):
    """Groups of 50, 0, 37 and 128 rows ending at 50, 128, 165, 384 (an empty group, unaligned ends,
    gaps of padding-only 32-row tiles), a tail of 128 padding rows; K = 352. Gap rows of a: NaN."""
    n, k, m = 2 * tile if tile == 32 else tile, 352, 512
    g = torch.Generator().manual_seed(tile + zero_padding)
    ends, owner, start = [], torch.full((m,), -1), 0
    for gi, r in enumerate([50, 0, 37, 128]):
        owner[start:start + r] = gi
        ends.append(start + r)
        start = deep_gemm.align(start + r, 128)
    ends = torch.tensor(ends, dtype=torch.int32)
    a, b = torch.randn(m, k, generator=g).bfloat16(), torch.randn(4, n, k, generator=g).bfloat16()
    a[owner < 0] = float("nan")
    d = torch.full((m, n), SENTINEL, dtype=torch.bfloat16)
    run(deep_gemm.m_grouped_bf16_gemm_nt_contiguous, variant(tile, psum=1), a, b, d, ends, use_psum_layout=True,
        ensure_zero_padding=zero_padding, expected_m_for_psum_layout=64)
    ref = reference.m_grouped_bf16_gemm_nt_contiguous_ref(a, b, ends, psum=True)
    check(d, ref, owner >= 0, product(a, b, owner), 0.0 if zero_padding else SENTINEL)


@pytest.mark.parametrize("tile", [32, 128])
def test_masked_matches_reference(tile):
    """masked_m 40, 0, 23 of M_max 40 (full, empty and partial tiles); rows past masked_m untouched.
    Through the legacy alias bf16_m_grouped_gemm_nt_masked (the same function)."""
    assert deep_gemm.bf16_m_grouped_gemm_nt_masked is deep_gemm.m_grouped_bf16_gemm_nt_masked
    G, m_max, n, k = 3, 40, 2 * tile if tile == 32 else tile, 256
    g = torch.Generator().manual_seed(tile)
    a, b = torch.randn(G, m_max, k, generator=g).bfloat16(), torch.randn(G, n, k, generator=g).bfloat16()
    masked_m = torch.tensor([40, 0, 23], dtype=torch.int32)
    written = torch.arange(m_max)[None, :] < masked_m[:, None]
    a[~written] = float("nan")
    d = torch.full((G, m_max, n), SENTINEL, dtype=torch.bfloat16)
    run(deep_gemm.bf16_m_grouped_gemm_nt_masked, variant(tile, masked=1), a, b, d, masked_m, 32)
    ref = reference.m_grouped_bf16_gemm_nt_masked_ref(a, b, masked_m)
    check(d, ref, written, torch.einsum("gmk,gnk->gmn", a.double().nan_to_num(0), b.double()), SENTINEL)


def test_accumulation_is_32k_chunks_in_k_order():
    """Chunk sums 2^24, 0, 3, -2^24 (K = 128: two K blocks of two 32-K MFMAs): added in K order into
    fp32, 2^24 + 3 rounds to 2^24 + 4 (ties to even) and the result is 4; the exact sum is 3, and
    any other chunk order (e.g. a block's second MFMA first: 0 + 3) gives 3."""
    a, b = torch.zeros(1, 32, 128, dtype=torch.bfloat16), torch.zeros(1, 32, 128, dtype=torch.bfloat16)
    a[0, :, 0], b[0, :, 0] = 2.0 ** 12, 2.0 ** 12          # chunk 0
    a[0, :, 64], b[0, :, 64] = 3.0, 1.0                    # chunk 2
    a[0, :, 96], b[0, :, 96] = -2.0 ** 12, 2.0 ** 12       # chunk 3
    masked_m = torch.tensor([32], dtype=torch.int32)
    d = torch.full((1, 32, 32), SENTINEL, dtype=torch.bfloat16)
    run(deep_gemm.m_grouped_bf16_gemm_nt_masked, variant(32, masked=1), a, b, d, masked_m, 32)
    assert torch.einsum("gmk,gnk->gmn", a.double(), b.double()).eq(3.0).all()
    assert torch.equal(reference.m_grouped_bf16_gemm_nt_masked_ref(a, b, masked_m), torch.full_like(d, 4.0))
    assert torch.equal(d, torch.full_like(d, 4.0))


@pytest.mark.parametrize("use_psum_layout", [False, True])
def test_nn_and_mn_major_b_are_copied_k_major(use_psum_layout):
    """m_grouped_bf16_gemm_nn_contiguous with b [G, K, N], and the NT function with the same weights
    MN-major (b.mT): both bit-identical to the NT result on K-major b."""
    a, b, m_indices = m_indices_case([70, 20], 64, 160, seed=3)
    layout = torch.tensor([70, 148], dtype=torch.int32) if use_psum_layout else m_indices
    if use_psum_layout:   # rows 0..69 group 0, 128..147 group 1
        a = a.nan_to_num(0)
    kw = dict(use_psum_layout=use_psum_layout, config="BM=32,BN=32")
    want = torch.full((256, 64), SENTINEL, dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, want, layout, **kw)
    b_kn = b.transpose(1, 2).contiguous()                       # [G, K, N]
    d = torch.full_like(want, SENTINEL)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(a, b_kn, d, layout, **kw)
    assert torch.equal(d.view(torch.int16), want.view(torch.int16))
    d = torch.full_like(want, SENTINEL)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b_kn.mT, d, layout, **kw)
    assert torch.equal(d.view(torch.int16), want.view(torch.int16))
    ref = reference.m_grouped_bf16_gemm_nt_contiguous_ref(a, b, layout, psum=use_psum_layout)
    owner = torch.tensor([0] * 70 + [-1] * 58 + [1] * 20 + [-1] * 108)
    assert torch.equal(want[owner >= 0].view(torch.int16), ref[owner >= 0].view(torch.int16))


# ---- guards: GuardError naming the rule, before any launch, d untouched ----
def _valid(masked=False, n=64, k=128):
    g = torch.Generator().manual_seed(5)
    rows = (2, 40) if masked else (256,)
    return dict(a=torch.randn(*rows, k, generator=g).bfloat16(), b=torch.randn(2, n, k, generator=g).bfloat16(),
                d=torch.full((*rows, n), SENTINEL, dtype=torch.bfloat16),
                layout=torch.tensor([40, 3], dtype=torch.int32) if masked else
                torch.arange(2, dtype=torch.int32).repeat_interleave(128))


def _call(t, masked, **kw):
    if masked:
        deep_gemm.m_grouped_bf16_gemm_nt_masked(t["a"], t["b"], t["d"], t["layout"], kw.pop("expected_m", 16), **kw)
    else:
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(t["a"], t["b"], t["d"], t["layout"], **kw)


GUARDS = [  # (name, masked, edit of the valid inputs, call keywords, rule, message fragment)
    ("K%16", 0, lambda t: _valid(k=136), {}, "K%16", "K = 136 must be a multiple of 16"),
    ("N%32", 0, lambda t: _valid(n=48), {}, "N%32", "N = 48 must be a multiple of 32"),
    ("b-fp8", 0, lambda t: {**t, "b": t["b"].to(torch.float8_e4m3fn)}, {}, "dtype",
     "a has dtype torch.bfloat16; expected torch.float8_e4m3fn"),
    ("a-f16", 0, lambda t: {**t, "a": t["a"].half()}, {}, "dtype", "a has dtype torch.float16; expected torch.bfloat16"),
    ("d-f16", 1, lambda t: {**t, "d": t["d"].half()}, {}, "dtype", "d has dtype torch.float16; expected torch.bfloat16"),
    ("a-pair", 0, lambda t: {**t, "a": (t["a"], torch.ones(256, 1))}, {}, "type", "a must be a bf16 torch.Tensor"),
    ("m_indices-group", 0, lambda t: {**t, "layout": torch.where(t["layout"] == 1, 2, t["layout"]).int()}, {},
     "m_indices", "m_indices[128] = 2"),
    ("masked_m-value", 1, lambda t: {**t, "layout": torch.tensor([41, 0], dtype=torch.int32)}, {}, "masked_m",
     "masked_m[0] = 41 is outside 0..40"),
    ("expected_m", 1, lambda t: t, {"expected_m": -1}, "expected_m", "expected_m must be a non-negative int"),
    ("expected_m_for_psum", 0, lambda t: t, {"expected_m_for_psum_layout": 64}, "expected_m_for_psum_layout",
     "a hint of the psum layout only"),
    ("b-contiguity", 0, lambda t: {**t, "b": torch.nn.functional.pad(t["b"], (0, 16))[..., :128]}, {}, "contiguity",
     "b must be contiguous"),
]


@pytest.mark.parametrize("name,masked,edit,kw,rule,text", GUARDS, ids=[g[0] for g in GUARDS])
def test_guard_raises_before_launch_and_leaves_d_untouched(name, masked, edit, kw, rule, text):
    t = edit(_valid(bool(masked)))
    d_before = t["d"].clone()
    with pytest.raises(guards.GuardError, match=re.escape(f"[{rule}]")) as e:
        _call(t, bool(masked), **kw)
    assert text in str(e.value), str(e.value)
    assert torch.equal(t["d"], d_before)


def test_op_scales_guard():
    """The op: bf16 operands take no scales, e4m3 ones need both."""
    t = _valid()
    with pytest.raises(guards.GuardError, match=r"\[scales\] sfa is a torch.float32 tensor of shape \[256, 1\]"):
        deep_gemm_fp8_grouped_gemm(t["a"], torch.ones(256, 1), t["b"], None, t["layout"], t["d"])
    with pytest.raises(guards.GuardError, match=r"\[scales\] sfb is None; torch.float8_e4m3fn a takes block scales"):
        deep_gemm_fp8_grouped_gemm(t["a"].to(torch.float8_e4m3fn), torch.ones(256, 1),
                                   t["b"].to(torch.float8_e4m3fn), None, t["layout"], t["d"])
    assert torch.equal(t["d"], torch.full_like(t["d"], SENTINEL))


# ---- code objects ----
@pytest.mark.parametrize("v", BF16_VARIANTS, ids=registry.variant_id)
def test_code_object_two_bf16_mfmas_per_k_block_no_scales_spill_free(v):
    art = build.artifact(KERNEL, v)
    info = art.isa()
    print(f"\n{KERNEL} [{registry.variant_id(v)}]: {info.summary(256)}")
    assert info.spills == 0 and info.scratch_bytes == 0
    assert info.lds_bytes == 2 * v["BM"] * 128 and info.occupancy(256) >= 3
    tiles = (v["BM"] // 32) * (v["BN"] // 32)     # 16x16 MFMA tiles per wave
    mfma = info.count("v_mfma_f32_16x16x32_bf16")
    assert mfma >= 2 * tiles and mfma % (2 * tiles) == 0 and info.count("v_mfma_scale_f32_16x16x128_f8f6f4") == 0
    # vector loads: A (DMA) and B in 16-byte chunks, and the layout's int32s (m_indices: global loads; psum:
    # one buffer load of the group ends; masked_m: a scalar load); no scale loads
    loads = collections.Counter(re.findall(r"^\s+((?:buffer|global)_load\w*)", art.asm, re.M))
    layout_loads = {"buffer_load_dword": 1} if v.get("PSUM") else {} if v["MASKED"] else \
        {"global_load_dword": loads["global_load_dword"]}
    assert {m: c for m, c in loads.items() if m != "buffer_load_dwordx4"} == layout_loads
