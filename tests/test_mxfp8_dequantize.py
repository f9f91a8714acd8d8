"""mxgemm.mxfp8_dequantize: the sample op, HIP and FlyDSL kernels executed on the gfx950
emulator, bit-exact against an independent ml_dtypes decode; guards reject bad input."""
import ml_dtypes
import numpy as np
import pytest
import torch

import mxgemm
from mxgemm.guards import GuardError

SCALES = (0, 1, 100, 126, 127, 128, 200, 254, 255)


def reference(x: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """e4m3 value x 2^(s-127), exact in float64, then one RNE rounding to float32."""
    s = np.repeat(scale.numpy().astype(np.int64), 32, axis=1)
    v = x.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.exp2(s - 127.0)
    with np.errstate(over="ignore"):  # e.g. 448 * 2^127 overflows to inf, as the kernel does
        v = v.astype(np.float32)
    v[s == 255] = np.nan
    return v


def assert_same_bits(got: torch.Tensor, ref: np.ndarray):
    got = got.numpy()
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("language", ["hip", "flydsl"])
def test_every_code_under_edge_scales_is_bit_exact(language):
    K = 256  # each row holds all 256 codes; one row per edge scale
    x = (torch.arange(len(SCALES) * K) % 256).to(torch.uint8).reshape(-1, K)
    scale = torch.tensor(SCALES, dtype=torch.uint8)[:, None].repeat(1, K // 32)
    out = mxgemm.mxfp8_dequantize(x.view(torch.float8_e4m3fn), scale, language=language)
    assert_same_bits(out, reference(x, scale))


@pytest.mark.parametrize("language", ["hip", "flydsl"])
def test_random_rows_with_partial_last_workgroup(language):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (3, 96), dtype=torch.uint8, generator=g)  # 72 quads: 1 partial WG
    scale = torch.randint(0, 256, (3, 3), dtype=torch.uint8, generator=g)
    out = torch.full((3, 96), 7.0)
    mxgemm.mxfp8_dequantize(x, scale.view(torch.float8_e8m0fnu), out=out, language=language)
    assert_same_bits(out, reference(x, scale))


def _guard(match, *args, **kw):
    out = kw.get("out")
    before = out.clone() if out is not None else None
    with pytest.raises(GuardError, match=match):
        mxgemm.mxfp8_dequantize(*args, **kw)
    if out is not None:
        assert torch.equal(out, before)  # rejected before any launch: out untouched


x = torch.zeros(2, 64, dtype=torch.uint8)
s = torch.zeros(2, 2, dtype=torch.uint8)


def test_guards():
    o = torch.full((2, 64), 3.0)
    _guard(r"\[dtype\] x has dtype torch.float32", x.float(), s, out=o)
    _guard(r"\[dtype\] scale has dtype torch.int32", x, s.int(), out=o)
    _guard(r"\[K%32\] K = 48", torch.zeros(2, 48, dtype=torch.uint8), s, out=o)
    _guard(r"\[shape\] scale has shape \[2, 3\]", x, torch.zeros(2, 3, dtype=torch.uint8), out=o)
    _guard(r"\[shape\] out has shape", x, s, out=torch.zeros(2, 32))
    _guard(r"\[contiguity\] x must be contiguous", torch.zeros(64, 2, dtype=torch.uint8).t(), s, out=o)
    _guard(r"\[language\]", x, s, out=o, language="cuda")


def test_2gb_voffset_guard_without_allocating():
    big = torch.empty((2 ** 16, 2 ** 15), dtype=torch.uint8, device="meta")  # 2 GiB, no memory
    with pytest.raises(GuardError, match=r"\[2GB-voffset\] x spans 2147483648 bytes"):
        mxgemm.explain("mxfp8_dequantize", big, torch.empty((2 ** 16, 2 ** 10), dtype=torch.uint8, device="meta"))


def test_arch_guard_names_the_device():
    with pytest.raises(GuardError, match=r"\[arch\] .* on meta"):
        mxgemm.explain("mxfp8_dequantize", x.to("meta"), s.to("meta"))


def test_explain_names_kernel_and_geometry():
    plan = mxgemm.explain("mxfp8_dequantize", x, s, language="flydsl")
    assert plan.kernel == "mxfp8_dequant_flydsl" and plan.backend == "emu" and plan.grid == (1, 1, 1)
    assert "mxfp8_dequant_flydsl" in str(plan)
