"""mxgemm.deep_gemm's DeepGEMM 2.6 helpers: casts, scale layouts, alignment and runtime settings
(host-side; the GEMMs themselves are tested with their kernels)."""
import pytest
import torch

import mxgemm.deep_gemm as deep_gemm
from mxgemm.deep_gemm import utils
from mxgemm.guards import GuardError

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_nearest_tie_down(y: torch.Tensor) -> torch.Tensor:
    """Oracle: the e2m1 code of the magnitude nearest |y| (ties and overflow: the smaller)."""
    dist = (y.abs()[..., None] - E2M1).abs()
    mag = dist.argmin(dim=-1)            # first minimum = the smaller magnitude
    return (mag | ((y < 0) & (mag != 0)).long() << 3).to(torch.uint8)


def exponent_bytes(sf: torch.Tensor) -> torch.Tensor:
    """Oracle: the e8m0 code of a power of two, from frexp (2^e = 0.5 * 2^(e+1))."""
    _, e = torch.frexp(sf)
    return (e - 1 + 127).to(torch.uint8)


def test_per_token_cast_to_fp4_codes_scales_and_packing():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 96, generator=g) * 3
    x[2, :32] = 0
    packed, sf = utils.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    assert packed.dtype == torch.int8 and packed.shape == (6, 48) and sf.shape == (6, 3)
    amax = x.view(6, 3, 32).abs().amax(dim=2).clamp(min=1e-4)
    assert torch.equal(sf, 2.0 ** torch.ceil(torch.log2(amax / 6)))
    y = x.view(6, 3, 32) / sf[:, :, None]
    codes = e2m1_nearest_tie_down(y).view(6, 96)
    b = packed.view(torch.uint8)
    assert torch.equal(b & 0xF, codes[:, 0::2]) and torch.equal(b >> 4, codes[:, 1::2])
    back = utils.cast_back_from_fp4(packed, sf, gran_k=32)
    assert float((back - x).abs().max()) <= float(sf.max()) * 1.0 + 1e-6   # half of the widest e2m1 step (2)


def test_fp4_tie_goes_to_the_smaller_magnitude():
    x = torch.tensor([[0.25, 0.75, 2.5, 5.0, -1.25, 6.0] + [0.0] * 26])
    x[0, -1] = 6.0                      # amax 6: scale 1
    packed, sf = utils.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    assert sf.item() == 1.0
    codes = torch.stack([packed.view(torch.uint8) & 0xF, packed.view(torch.uint8) >> 4], -1).flatten()
    assert codes[:6].tolist() == [0, 1, 4, 6, 8 | 2, 7]


def test_packed_ue8m0_scales_and_fp4_transpose():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 200, generator=g)
    q, packed = utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    _, sf = utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    assert packed.dtype == torch.int32 and packed.shape == (4, 2)       # 7 blocks, padded to 8 with 1.0
    assert torch.equal(utils.unpack_ue8m0_from_int(packed)[:, :7], sf)
    assert torch.equal(utils.unpack_ue8m0_from_int(packed)[:, 7], torch.ones(4))
    fp4, _ = utils.per_token_cast_to_fp4(torch.randn(8, 64, generator=g), use_ue8m0=True, gran_k=32)
    t = utils.transpose_packed_fp4(fp4).view(torch.uint8)
    codes = torch.stack([fp4.view(torch.uint8) & 0xF, fp4.view(torch.uint8) >> 4], -1).flatten(-2)
    assert t.shape == (64, 4)
    assert torch.equal(torch.stack([t & 0xF, t >> 4], -1).flatten(-2), codes.t())


def test_per_channel_cast_is_per_column_blocks():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(256, 5, generator=g)
    q, sf = utils.per_channel_cast_to_fp8(x, use_ue8m0=False)
    assert sf.shape == (2, 5)
    assert torch.allclose(sf, x.view(2, 128, 5).abs().amax(dim=1) / 448)
    assert float((q.float().view(2, 128, 5) * sf[:, None] - x.view(2, 128, 5)).abs().max()) <= float(sf.max()) * 16
    with pytest.raises(ValueError, match="gran_k"):
        utils.per_channel_cast_to_fp8(torch.randn(100, 5), use_ue8m0=False)


def test_calc_diff_and_count_bytes():
    assert utils.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert float(utils.calc_diff(torch.ones(3), -torch.ones(3))) == 2.0
    assert utils.count_bytes(torch.zeros(4), (torch.zeros(2, dtype=torch.int8), None)) == 18


@pytest.mark.parametrize("groups", [1, 3])
def test_mn_major_tma_aligned_tensor_strides(groups):
    sf = torch.randn(groups, 37, 5).squeeze(0)
    t = deep_gemm.get_mn_major_tma_aligned_tensor(sf)
    assert torch.equal(t, sf) and t.stride()[-2:] == (1, 40)
    if groups > 1:
        assert t.stride(0) == 40 * 5
    assert deep_gemm.get_tma_aligned_size(37, 4) == 40 and deep_gemm.get_tma_aligned_size(37, 1) == 48


def test_packed_ue8m0_tensor_layout_and_psum_gaps():
    g = torch.Generator().manual_seed(3)
    sf = 2.0 ** torch.randint(-10, 10, (300, 6), generator=g).float()
    p = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert p.dtype == torch.int32 and p.shape == (300, 2) and p.stride() == (1, 300)
    codes = p.contiguous().view(torch.uint8).view(300, 8)
    assert torch.equal(codes[:, :6], exponent_bytes(sf)) and not codes[:, 6:].any()
    psum = torch.tensor([100, 200], dtype=torch.int32)      # groups [0, 100) and [128, 200)
    q = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum)
    gap = torch.zeros(300, dtype=torch.bool)
    gap[100:128] = gap[200:] = True
    assert not q[gap].any() and torch.equal(q[~gap], p[~gap])


def test_k_grouped_packer_packs_each_group_alone():
    g = torch.Generator().manual_seed(4)
    ks = [256, 640, 0, 128]
    blocks = [k // 128 for k in ks]
    sf = 2.0 ** torch.randint(-5, 5, (sum(blocks), 9), generator=g).float()
    p = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, torch.tensor(ks, dtype=torch.int32),
                                                                         ks, 128, 128)
    assert p.shape == (1 + 2 + 0 + 1, 9)
    words = p.contiguous().view(torch.uint8).view(4, 9, 4)   # [word row, mn, byte]
    expect = [exponent_bytes(sf[0:2]).t(), exponent_bytes(sf[2:7]).t(), exponent_bytes(sf[7:8]).t()]
    assert torch.equal(words[0, :, :2], expect[0]) and not words[0, :, 2:].any()
    assert torch.equal(words[1], expect[1][:, :4])
    assert torch.equal(words[2, :, :1], expect[1][:, 4:]) and not words[2, :, 1:].any()
    assert torch.equal(words[3, :, :1], expect[2]) and not words[3, :, 1:].any()
    psum = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        sf, torch.tensor([256, 896, 896, 1024], dtype=torch.int32), None, 128, 128, use_psum_layout=True)
    assert torch.equal(psum, p)
    upper = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(     # ks_cpu: upper bounds
        sf, torch.tensor([256, 896, 896, 1024], dtype=torch.int32), [640, 640, 0, 640], 128, 128, use_psum_layout=True)
    assert upper.shape == (6, 9) and torch.equal(upper[:4], p) and not upper[4:].any()


def test_transform_sf_into_required_layout():
    sfa = torch.rand(70, 3) + 0.5
    t = deep_gemm.transform_sf_into_required_layout(sfa, 70, 300, (1, 128, 128), is_sfa=True)
    assert torch.equal(t, sfa) and t.stride() == (1, 72)
    sfb = torch.rand(1, 3) + 0.5
    assert deep_gemm.transform_sf_into_required_layout(sfb, 70, 300, (1, 128, 128), is_sfa=False) is sfb
    fp4_sf = 2.0 ** torch.randint(-4, 4, (70, 10)).float()
    packed = deep_gemm.transform_sf_into_required_layout(fp4_sf, 70, 320, (1, 32))
    assert packed.dtype == torch.int32 and packed.shape == (70, 3)
    assert torch.equal(packed, deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(fp4_sf))
    with pytest.raises(GuardError, match=r"\[shape\]"):
        deep_gemm.transform_sf_into_required_layout(sfa, 70, 600, (1, 128, 128), is_sfa=True)
    with pytest.raises(GuardError, match="is_sfa"):
        deep_gemm.transform_sf_into_required_layout(sfa, 70, 300, (1, 128, 128))
    with pytest.raises(GuardError, match="disable_ue8m0_cast"):
        deep_gemm.transform_sf_into_required_layout(fp4_sf, 70, 320, (1, 32), disable_ue8m0_cast=True)


def test_contiguous_alignment_settings():
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(expected_m=16) == 128
    try:
        deep_gemm.set_mk_alignment_for_contiguous_layout(256)
        assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 256
        assert deep_gemm.get_m_alignment_for_contiguous_layout() == 256
        deep_gemm.set_mk_alignment_for_contiguous_layout(32)
        assert deep_gemm.get_k_alignment_for_contiguous_layout() == 32
        for bad in (48, 0, 130, True, 128.0):
            with pytest.raises(GuardError, match=r"\[alignment\].*multiple of 32"):
                deep_gemm.set_mk_alignment_for_contiguous_layout(bad)
        assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 32
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(128)


def test_runtime_settings():
    assert deep_gemm.get_num_sms() == 256
    try:
        deep_gemm.set_num_sms(200)
        assert deep_gemm.get_num_sms() == 200
        for bad in (0, 257, True, 2.0):
            with pytest.raises(GuardError, match=r"\[num_sms\]"):
                deep_gemm.set_num_sms(bad)
    finally:
        deep_gemm.set_num_sms(256)
    deep_gemm.set_tc_util(90)
    deep_gemm.set_pdl(True)
    assert deep_gemm.get_tc_util() == 90 and deep_gemm.get_pdl() is True
    deep_gemm.set_tc_util(100)
    deep_gemm.set_pdl(False)
