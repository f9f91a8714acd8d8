"""DeepGEMM-compatible FP8 block-scale grouped GEMMs (kernel family deep_gemm_fp8) and the
mxgemm.deep_gemm helpers.

Spec: inputs are built the way DeepGEMM's own tests build them (per-token cast of A, per-block
cast of B, fp32 product of the dequantised inputs as the loose check, calc_diff < 1e-3), and
every row the kernel writes is bit-identical to mxgemm.reference (the kernel promotes each
128-K block exactly as the reference models it, for fp32 and e8m0 scales alike). Rows of no
group (m_indices == -1) and rows past masked_m stay untouched. Kernels run on the emulator in
race mode through the launcher (artefact + grid/block/args).
"""
import re

import pytest
import torch

from mxgemm import build, formats, launcher, reference, registry
from mxgemm import deep_gemm
from mxgemm.deep_gemm import utils

KERNEL = "deep_gemm_fp8"
SENTINEL = -7.0           # d is pre-filled with it: rows the kernel must not write keep it


# ---- helpers ----
def test_alignment_and_integer_helpers():
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 128
    assert deep_gemm.get_m_alignment_for_contiguous_layout() == 128
    assert [deep_gemm.ceil_div(x, 128) for x in (0, 1, 128, 129)] == [0, 1, 1, 2]
    assert [deep_gemm.align(x, 128) for x in (0, 1, 128, 129)] == [0, 128, 128, 256]


def test_ceil_to_ue8m0_is_smallest_power_of_two_at_or_above():
    x = torch.tensor([1.0, 0.75, 3.0, 2.0 ** -20 * 1.5, -5.0])
    assert utils.ceil_to_ue8m0(x).tolist() == [1.0, 1.0, 4.0, 2.0 ** -19, 8.0]


def assert_e4m3_rounding(deq, x, scale):
    """One RNE rounding to e4m3 (3 mantissa bits; subnormal step 2^-9) in units of scale."""
    assert bool(((deq - x).abs() <= torch.maximum(x.abs() * 2 ** -4, scale * 2 ** -10)).all())


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_cast_to_fp8(use_ue8m0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=g) * torch.tensor([1.0, 100.0]).repeat_interleave(128)
    x[3, :128] = 0  # all-zero block: amax floor 1e-4
    q, sf = utils.per_token_cast_to_fp8(x, use_ue8m0)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and sf.shape == (5, 2)
    for m in range(5):
        for kb in range(2):
            blk = x[m, 128 * kb:128 * (kb + 1)]
            s = max(float(blk.abs().max()), 1e-4) / 448
            if use_ue8m0:
                s = 2.0 ** torch.tensor(s).log2().ceil().item()
            assert sf[m, kb].item() == pytest.approx(s, rel=1e-6)
            # the block's largest element maps to <= 448, and to 448 exactly without ue8m0
            top = float(q[m, 128 * kb:128 * (kb + 1)].float().abs().max())
            assert top <= 448 and (use_ue8m0 or m == 3 or top == 448)
    deq = q.float().view(5, 2, 128) * sf[:, :, None]
    assert_e4m3_rounding(deq.view(5, 256), x, sf.repeat_interleave(128, 1))


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_cast_to_fp8(use_ue8m0):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 300, generator=g)  # edge blocks padded
    q, sf = utils.per_block_cast_to_fp8(x, use_ue8m0)
    assert q.shape == x.shape and sf.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            blk = x[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
            s = float(blk.abs().max()) / 448
            if use_ue8m0:
                s = 2.0 ** torch.tensor(s).log2().ceil().item()
            assert sf[i, j].item() == pytest.approx(s, rel=1e-6)
    sf_full = sf.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    assert_e4m3_rounding(q.float() * sf_full, x, sf_full)


def test_calc_diff():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert utils.calc_diff(x, x).item() == 0.0
    y = torch.tensor([1.0, 2.0, 4.0])
    assert utils.calc_diff(x, y).item() == pytest.approx(1 - 2 * 17 / (14 + 21), abs=1e-15)
    assert utils.calc_diff(x, -x).item() == 2.0


# ---- kernel on the emulator ----
def e8m0_codes(sf: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales -> uint8 e8m0 codes (exact)."""
    codes = formats.encode_e8m0(sf)
    assert torch.equal(formats.decode_e8m0(codes), sf)
    return codes


def quantize(x, w, ue8m0):
    """DeepGEMM's test inputs: per-token A [.., K], per-block B [G, N, K]."""
    a, sfa = utils.per_token_cast_to_fp8(x.view(-1, x.shape[-1]), ue8m0)
    bs = [utils.per_block_cast_to_fp8(wg, ue8m0) for wg in w]
    b, sfb = torch.stack([q for q, _ in bs]), torch.stack([s for _, s in bs])
    if ue8m0:
        sfa, sfb = e8m0_codes(sfa), e8m0_codes(sfb)
    return a.view(*x.shape), sfa.view(*x.shape[:-1], -1), b, sfb


def mn_major(sf: torch.Tensor) -> torch.Tensor:
    """The same scales in DeepGEMM's MN-major layout: [.., M, K/128] with M the unit-stride dim,
    M padded to 4 elements (16 bytes) as DeepGEMM's TMA-aligned tensors are."""
    m, kb = sf.shape[-2:]
    storage = torch.zeros(*sf.shape[:-2], kb, deep_gemm.align(m, 4), dtype=sf.dtype)
    storage[..., :m] = sf.transpose(-1, -2)
    return storage[..., :m].transpose(-1, -2)


def run_kernel(variant, a, sfa, b, sfb, d, layout, rows, m_max, m_tiles):
    """One launch with the registry's argument order and grid, on the emulator in race mode."""
    kernel = registry.get(KERNEL)
    G, N, K = b.shape
    sg, sm, sk = sfa.stride() if sfa.dim() == 3 else (0, *sfa.stride())
    values = dict(a=a.view(torch.uint8), sfa=sfa, b=b.view(torch.uint8), sfb=sfb, out=d, layout=layout,
                  rows=rows, N=N, K=K, m_max=m_max, groups=G, sfa_sg=sg, sfa_sm=sm, sfa_sk=sk)
    with launcher.emulator_settings(race_check=True):
        launcher.launch(build.artifact(KERNEL, variant), kernel.launch_grid(variant, N=N, m_tiles=m_tiles),
                        (kernel.threads, 1, 1), [values[n] for n in kernel.args], "emu", writes=(d,))


def contiguous_case(group_rows, n, k, seed):
    """x [M, K] with each group's rows padded to the M alignment (padding rows -1)."""
    g = torch.Generator().manual_seed(seed)
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    m_indices = torch.cat([torch.cat([torch.full((r,), gi, dtype=torch.int32),
                                      torch.full((deep_gemm.align(r, align) - r,), -1, dtype=torch.int32)])
                           for gi, r in enumerate(group_rows)])
    x = torch.randn(len(m_indices), k, generator=g)
    w = torch.randn(len(group_rows), n, k, generator=g)
    return x, w, m_indices


SMALL = registry.variant_grid(BM=(32,), BN=(32,), UE8M0=(0, 1), OUT=("bf16", "f16"))
OUT_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}


def _check(d, ref, written, fp32_product, name):
    """Written rows: bit-identical to the reference and within DeepGEMM's calc_diff < 1e-3 of
    the fp32 product; every other row still holds the sentinel."""
    assert torch.equal(d[written].view(torch.int16), ref[written].view(torch.int16)), \
        f"{name}: {int((d[written] != ref[written]).sum())} elements differ from the reference"
    assert bool((d[~written] == SENTINEL).all()), f"{name}: rows outside the groups were written"
    diff = utils.calc_diff(d[written], fp32_product[written]).item()
    assert diff < 1e-3, f"{name}: calc_diff {diff}"


# (variant, group row counts, N): every small variant on 4 groups with an empty one and
# unaligned sizes; 1 and 8 groups on one variant; the production 128 x 128 tile once.
# (variant, group row counts, N, activation-scale layout): every small variant on 4 groups with an
# empty one and unaligned sizes; 1 and 8 groups and MN-major scales on some; the 128 x 128 tile once.
CONTIGUOUS = [(v, [100, 0, 37, 128], 64, "row") for v in SMALL] + [
    (SMALL[0], [45], 32, "mn"), (SMALL[3], [3, 0, 17, 1, 0, 30, 9, 2], 32, "mn"),
    (dict(BM=128, BN=128, UE8M0=0, OUT="bf16"), [100, 128], 128, "row")]


@pytest.mark.parametrize("variant,group_rows,n,sfa_layout", CONTIGUOUS,
                         ids=[f"{registry.variant_id(v)}-G{len(g)}-{s}" for v, g, _, s in CONTIGUOUS])
def test_contiguous_matches_reference(variant, group_rows, n, sfa_layout):
    ue8m0, out = variant["UE8M0"], OUT_DTYPE[variant["OUT"]]
    x, w, m_indices = contiguous_case(group_rows, n=n, k=256, seed=len(group_rows) + ue8m0)
    a, sfa, b, sfb = quantize(x, w, ue8m0)
    sfa = mn_major(sfa) if sfa_layout == "mn" else sfa
    d = torch.full((len(m_indices), n), SENTINEL, dtype=out)
    # every BM-row tile: only the tiles holding rows of a group run (the others exit at once)
    run_kernel({**variant, "MASKED": 0}, a, sfa, b, sfb, d, m_indices, len(m_indices), 0,
               len(m_indices) // variant["BM"])
    ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, m_indices, out)
    fp32_product = torch.einsum("mk,mnk->mn", x, w[m_indices.clamp(min=0).long()])
    _check(d, ref, m_indices >= 0, fp32_product, f"contiguous {variant}")


MASKED = [(v, "row") for v in SMALL] + [(SMALL[1], "mn")]


@pytest.mark.parametrize("variant,sfa_layout", MASKED, ids=[f"{registry.variant_id(v)}-{s}" for v, s in MASKED])
def test_masked_matches_reference(variant, sfa_layout):
    ue8m0, out = variant["UE8M0"], OUT_DTYPE[variant["OUT"]]
    G, m_max, n, k = 4, 46, 64, 256
    g = torch.Generator().manual_seed(2 + ue8m0)
    x, w = torch.randn(G, m_max, k, generator=g), torch.randn(G, n, k, generator=g)
    masked_m = torch.tensor([46, 0, 17, 33], dtype=torch.int32)  # full, empty, partial tiles
    a, sfa, b, sfb = quantize(x, w, ue8m0)
    sfa = mn_major(sfa) if sfa_layout == "mn" else sfa
    d = torch.full((G, m_max, n), SENTINEL, dtype=out)
    run_kernel({**variant, "MASKED": 1}, a, sfa, b, sfb, d, masked_m, G * m_max, m_max, G * 2)
    ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, masked_m, out)
    written = torch.arange(m_max)[None, :] < masked_m[:, None]
    _check(d, ref, written, torch.einsum("gmk,gnk->gmn", x, w), f"masked {variant}")


# ---- code objects ----
def loop_bodies(asm: str) -> list[str]:
    """Instructions of every loop: from a label to a later conditional branch back to it."""
    lines = [l.strip() for l in asm.splitlines()]
    labels = {l[:-1]: i for i, l in enumerate(lines) if re.fullmatch(r"\.LBB\d+_\d+:", l)}
    body = []
    for i, l in enumerate(lines):
        m = re.match(r"s_cbranch_\w+\s+(\.LBB\d+_\d+)", l)
        if m and labels.get(m.group(1), i) < i:
            body += lines[labels[m.group(1)]:i]
    return body


@pytest.mark.parametrize("variant", registry.get(KERNEL).variants, ids=registry.variant_id)
def test_code_object_spill_free_with_mfma_and_promotion_in_the_loop(variant):
    art = build.artifact(KERNEL, variant)
    info = art.isa()
    print(f"\n{KERNEL} [{registry.variant_id(variant)}]: {info.summary(256)}")
    assert info.spills == 0 and info.scratch_bytes == 0
    assert info.lds_bytes == 2 * variant["BM"] * 128          # two A buffers of BM x 128 bytes
    assert info.occupancy(256) >= 2
    tiles = (variant["BM"] // 32) * (variant["BN"] // 32)     # 16x16 MFMA tiles per wave
    rows_per_pass = 256 // (variant["BN"] // 8)               # CShuffle: one 16-byte row chunk per thread
    assert info.count("buffer_store_dwordx4") == -(-variant["BM"] // rows_per_pass)
    assert info.count("buffer_store_dwordx2") == 0 and info.count("ds_write_b64") == tiles
    loop = " ".join(loop_bodies(art.asm))
    mfma = loop.count("v_mfma_scale_f32_16x16x128_f8f6f4")
    assert mfma >= tiles and mfma % tiles == 0               # one MFMA per tile per K block (unrolled)
    if not variant["UE8M0"]:  # software promotion: p * (sfa*sfb) added to the accumulator in fp32
        assert loop.count("v_pk_mul_f32") * 2 + loop.count("v_mul_f32") >= 4 * mfma
        assert "v_fma_f32" not in loop and "v_pk_fma_f32" not in loop  # two roundings, never fused
