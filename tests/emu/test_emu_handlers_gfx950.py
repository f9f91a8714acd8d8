"""gfx950 handlers added for coverage: the 32-element FP6 / BF6 conversions, v_cvt_f32_bf16,
v_prng_b32. Expected values come from mxgemm.formats' FP6 codecs and packing (independent of
the emulator) and from the ISA's formulas written out here."""
import numpy as np
import pytest
import torch
from asm_wave import run

from mxgemm import formats

FMT = {"fp6": "e2m3", "bf6": "e3m2"}
N = 64
SCALES = np.array([127, 120, 130, 100, 150, 127, 126, 128] * 8, np.uint32)   # one e8m0 exponent per lane


def scale_bits():
    """fp32 scale operands: exponent field E, and junk in sign / mantissa that must be ignored."""
    return (SCALES << 23) | np.uint32(0x80000000) * (np.arange(N) % 2).astype(np.uint32) | np.uint32(0x1234)


def packed_codes(fmt, seed):
    codes = torch.from_numpy(np.random.default_rng(seed).integers(0, 64, (N, 32)).astype(np.uint8))
    words = formats.pack_fp6(codes).numpy().view(np.uint32)          # [N, 6]
    return codes, words


def f32_bits(x):
    return torch.as_tensor(x, dtype=torch.float32).numpy().view(np.uint32)


@pytest.mark.parametrize("dst", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("src", ["fp6", "bf6"])
def test_pk32_up_matches_formats_decode(src, dst):
    codes, words = packed_codes(src, 1 if src == "fp6" else 2)
    nd = 32 if dst == "f32" else 16
    ins = {3 + k: words[:, k] for k in range(6)}
    ins[9] = scale_bits()
    out = run("gfx950", f"v_cvt_scalef32_pk32_{dst}_{src} v[10:{9 + nd}], v[3:8], v9", ins, list(range(10, 10 + nd)))
    got = np.stack([out[10 + k] for k in range(nd)], 1)
    vals = formats.decode(codes, FMT[src]).double() * torch.from_numpy(np.ldexp(1.0, SCALES.astype(int) - 127))[:, None]
    if dst == "f32":
        ref = f32_bits(vals)
    else:
        h = (formats.bf16_bits(vals.float()).numpy().astype(np.uint32) if dst == "bf16"
             else vals.half().numpy().view(np.uint16).astype(np.uint32))   # f16 may round: one RNE from the exact value
        ref = h[:, 0::2] | (h[:, 1::2] << 16)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("src", ["f16", "bf16"])
@pytest.mark.parametrize("dst", ["fp6", "bf6"])
def test_pk32_down_matches_formats_encode_and_pack(dst, src):
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(0, 6, (N, 32)) * np.ldexp(1.0, SCALES.astype(int) - 127)[:, None])
    x[0, :4] = torch.tensor([1e4, -1e4, 0.0, -0.0])      # saturation and signed zero (lane 0: scale 1)
    half = x.to(torch.bfloat16 if src == "bf16" else torch.float16)
    bits = half.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    words = bits[:, 0::2] | (bits[:, 1::2] << 16)
    ins = {10 + k: words[:, k] for k in range(16)}
    ins[8] = scale_bits()
    out = run("gfx950", f"v_cvt_scalef32_pk32_{dst}_{src} v[30:35], v[10:25], v8", ins, list(range(30, 36)))
    got = np.stack([out[30 + k] for k in range(6)], 1)
    scaled = half.double() / torch.from_numpy(np.ldexp(1.0, SCALES.astype(int) - 127))[:, None]
    ref = formats.pack_fp6(formats.encode(scaled.float(), FMT[dst])).numpy().view(np.uint32)
    np.testing.assert_array_equal(got, ref)


def test_cvt_f32_bf16_is_the_top_half():
    b = np.array([0x3F80, 0xBF80, 0x7F80, 0xFFC1, 0x0001, 0x8000, 0x4049, 0x0000] * 8, np.uint32)
    out = run("gfx950", "v_cvt_f32_bf16 v5, v3", {3: b | 0xABCD0000}, [5])   # the high half is ignored
    np.testing.assert_array_equal(out[5], b << 16)


def prng(x):
    return ((x << 1) & 0xFFFFFFFF) ^ (197 if x >> 31 else 0)


@pytest.mark.parametrize("arch", ["gfx950", "gfx1250"])
def test_prng_is_the_isa_lfsr_step(arch):
    n = 64 if arch == "gfx950" else 32
    seeds = [0, 1, 0x80000000, 0xFFFFFFFF, 0xDEADBEEF] + list(np.random.default_rng(4).integers(0, 2**32, n - 5))
    out = run(arch, "v_prng_b32 v5, v3\n  v_prng_b32 v6, v5", {3: np.array(seeds, np.uint64)}, [5, 6])
    # by hand: 0 stays 0; 1 -> 2; bit 31 set -> 0 ^ 0xC5; all ones -> 0xFFFFFFFE ^ 0xC5
    assert int(out[5][1]) == 2 and int(out[5][2]) == 0xC5 and int(out[5][3]) == 0xFFFFFF3B and int(out[5][0]) == 0
    np.testing.assert_array_equal(out[5], [prng(int(s)) for s in seeds])
    np.testing.assert_array_equal(out[6], [prng(prng(int(s))) for s in seeds])
