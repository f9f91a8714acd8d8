"""formats.py spec: every code and every rounding agrees bit-for-bit with ml_dtypes."""
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mxgemm import formats as F
from mxgemm.metrics import assert_bitwise_equal

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn,
      "e2m1": ml_dtypes.float4_e2m1fn}
NBITS = {"e4m3": 8, "e5m2": 8, "e3m2": 6, "e2m3": 6, "e2m1": 4}
F32 = np.float32


def ml_decode(codes: np.ndarray, dt) -> torch.Tensor:
    return torch.from_numpy(codes.astype(np.uint8).view(dt).astype(F32))


def ml_encode(x: torch.Tensor, dt) -> torch.Tensor:
    return torch.from_numpy(x.numpy().astype(dt).view(np.uint8).copy())


def all_codes(fmt):
    return np.arange(1 << NBITS[fmt], dtype=np.uint8)


def edge_inputs(fmt) -> torch.Tensor:
    """Representable values, exact ties between neighbours and their f32 neighbours,
    the overflow boundary, subnormals, +-0, +-inf, NaN, f32 subnormals."""
    v = np.unique(np.abs(ml_decode(all_codes(fmt), ML[fmt]).numpy()))
    v = v[np.isfinite(v)]
    vmax = v.max()
    mids = (v[:-1].astype(np.float64) + v[1:]) / 2
    ulp_top = v[-1] - v[-2]
    pts = np.concatenate([v, mids, [vmax + ulp_top / 2, vmax + ulp_top, 2 * vmax, 1e30, 3e38],
                          [1e-45, 1e-40, 1e-38, 2.0**-126]]).astype(F32)
    pts = np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(0))])
    pts = np.concatenate([pts, -pts, [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]]).astype(F32)
    return torch.from_numpy(pts)


def random_inputs(n=200_000, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())


@pytest.mark.parametrize("fmt", list(ML))
def test_decode_every_code(fmt):
    codes = all_codes(fmt)
    assert_bitwise_equal(F.decode(torch.from_numpy(codes), fmt), ml_decode(codes, ML[fmt]), fmt)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_matches_torch_fp8_dtypes(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    want = F.to_torch_fp8(codes, fmt).float()
    # torch carries the fp8 NaN payload into f32; only NaN-ness and sign are specified
    want = torch.where(torch.isnan(want), torch.copysign(torch.tensor(float("nan")), want), want)
    assert_bitwise_equal(F.decode(codes, fmt), want, fmt)


@pytest.mark.parametrize("fmt", list(ML))
def test_encode_decode_roundtrip_every_code(fmt):
    codes = torch.from_numpy(all_codes(fmt))
    vals = F.decode(codes, fmt)
    keep = ~torch.isnan(vals)
    assert_bitwise_equal(F.encode(vals[keep], fmt, saturate=False), codes[keep], fmt)


@pytest.mark.parametrize("fmt", list(ML))
@pytest.mark.parametrize("inputs", ["edge", "random"])
def test_encode_non_saturating_matches_ml_dtypes(fmt, inputs):
    x = edge_inputs(fmt) if inputs == "edge" else random_inputs()
    want = ml_encode(x, ML[fmt])
    if NBITS[fmt] < 8:
        # fp6/fp4 have no NaN; ml_dtypes returns a zero with an arbitrary sign, we return +0.
        want = torch.where(torch.isnan(x), 0, want).to(torch.uint8)
    assert_bitwise_equal(F.encode(x, fmt, saturate=False), want, fmt)


@pytest.mark.parametrize("fmt", list(ML))
def test_encode_saturating_is_clamp_then_round(fmt):
    x = torch.cat([edge_inputs(fmt), random_inputs(50_000, seed=1)])
    vmax = float(ml_dtypes.finfo(ML[fmt]).max)
    clamped = torch.where(torch.isnan(x), x, x.clamp(-vmax, vmax))
    want = ml_encode(clamped, ML[fmt])
    if NBITS[fmt] < 8:
        want = torch.where(torch.isnan(x), 0, want).to(torch.uint8)
    assert_bitwise_equal(F.encode(x, fmt, saturate=True), want, fmt)


def test_e4m3_named_edges():
    x = torch.tensor([448.0, 464.0, 464.0001, 480.0, float("inf"), -float("inf"), float("nan"), -0.0, 2.0**-9, 2.0**-10])
    assert F.encode(x, "e4m3").tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x80, 0x01, 0x00]
    assert F.encode(x, "e4m3", saturate=False).tolist()[:6] == [0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0xFF]
    assert F.encode(torch.tensor([1e6, -float("inf")]), "e5m2", saturate=False).tolist() == [0x7C, 0xFC]


# ---- e8m0 ----
def test_e8m0_decode_every_code():
    codes = np.arange(256, dtype=np.uint8)
    got = F.decode_e8m0(torch.from_numpy(codes))
    assert_bitwise_equal(got, ml_decode(codes, ml_dtypes.float8_e8m0fnu), "e8m0")
    assert got[0].item() == 2.0**-127 and got[127].item() == 1.0 and math.isnan(got[255].item())


def test_e8m0_encode_matches_ml_dtypes_on_normal_f32():
    g = torch.Generator().manual_seed(2)
    p = torch.exp2(torch.arange(-126, 128).float())
    x = torch.cat([
        random_inputs().abs(), p, p * 1.5, p * 0.75, torch.nextafter(p * 1.5, torch.tensor(0.0)),
        torch.rand(10_000, generator=g) * 3e38,
        torch.tensor([0.0, -0.0, -1.0, -1e-30, float("inf"), float("nan"), 3.4e38, 2.0**127 * 1.5]),
    ])
    x = x[(x == 0) | (x.abs() >= 2.0**-126) | torch.isnan(x)]  # f32 subnormals: next test
    assert_bitwise_equal(F.encode_e8m0(x), ml_encode(x, ml_dtypes.float8_e8m0fnu), "e8m0")


def test_e8m0_encode_f32_subnormals_nearest():
    # ml_dtypes rounds every f32 subnormal above 2^-127 up to 2^-126 (it reads the raw
    # bits as if normal); we keep nearest-power-of-two, checked here against exact math.
    x = torch.tensor([2.0**-127, 2.0**-127 * 1.4, 2.0**-127 * 1.5, 2.0**-128, 2.0**-149, 2.0**-126 * 0.9])
    want = [0x00 if v < 1.5 * 2.0**-127 else 0x01 for v in x.tolist()]
    assert F.encode_e8m0(x).tolist() == want


# ---- fp4 packing ----
def test_fp4_pack_low_nibble_first():
    codes = torch.tensor([[0x1, 0xA, 0xF, 0x0, 0x7, 0x8]], dtype=torch.uint8)
    packed = F.pack_fp4(codes)
    assert packed.tolist() == [[0xA1, 0x0F, 0x87]]
    assert_bitwise_equal(F.unpack_fp4(packed), codes, "unpack")


def test_fp6_pack_is_a_little_endian_bit_string():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 64, (3, 40), generator=g, dtype=torch.uint8)
    packed = F.pack_fp6(codes)
    assert packed.shape == (3, 30)
    bits = np.unpackbits(packed.numpy(), axis=1, bitorder="little").reshape(3, 40, 6)
    assert (bits @ (1 << np.arange(6)) == codes.numpy()).all()       # code i = bits [6i, 6i + 6)
    assert_bitwise_equal(F.unpack_fp6(packed), codes, "fp6 roundtrip")
    assert F.pack_fp6(torch.tensor([[0x3F, 0, 0, 0x3F]], dtype=torch.uint8)).tolist() == [[0x3F, 0x00, 0xFC]]


def test_fp4_pack_roundtrip_all_pairs():
    a = torch.arange(16, dtype=torch.uint8)
    codes = torch.stack(torch.meshgrid(a, a, indexing="ij"), -1).reshape(-1)  # every (lo, hi) pair
    packed = F.pack_fp4(codes)
    assert sorted(packed.tolist()) == list(range(256))
    assert_bitwise_equal(F.unpack_fp4(packed), codes, "fp4 roundtrip")


# ---- bf16 ----
def bf16_edge_inputs():
    g = torch.Generator().manual_seed(3)
    b = torch.randint(0, 1 << 16, (1 << 16,), generator=g).to(torch.int32) << 16
    ties = b | 0x8000                     # exactly half-way between two bf16 values
    near = torch.cat([ties - 1, ties + 1, b | 0x7FFF, b | 1])
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.4e38, 1e-45, -1e-40])
    return torch.cat([torch.cat([b, ties, near]).view(torch.float32), specials, random_inputs(50_000)])


def test_bf16_rne_matches_ml_dtypes_and_torch():
    x = bf16_edge_inputs()
    got = F.bf16_rne(x)
    with np.errstate(invalid="ignore"):  # NaN inputs
        ml_bits = x.numpy().astype(ml_dtypes.bfloat16)
    ml = torch.from_numpy(ml_bits.view(np.int16).copy()).view(torch.bfloat16)
    fin = ~torch.isnan(x)  # NaN payloads are not specified: check NaN-ness separately
    assert_bitwise_equal(got[fin], ml[fin], "bf16 vs ml_dtypes")
    assert_bitwise_equal(got[fin], x[fin].to(torch.bfloat16), "bf16 vs torch")
    assert torch.isnan(got[~fin]).all()
    assert_bitwise_equal(F.bf16_bits(x[fin]), got[fin].view(torch.int16).int() & 0xFFFF, "bits")
