"""Bit-exact encode/decode of the low-precision formats mxgemm kernels consume.

Codes are carried as uint8 tensors (one code per byte, sign in the top bit of
the format's width); values as float32. Every rounding is round-to-nearest-even
(RNE) except e8m0, which has no mantissa: there a tie rounds up (as ml_dtypes).

  format  bits  bias  max      specials
  e4m3    8     7     448      0x7F/0xFF NaN, no inf           (OCP float8_e4m3fn)
  e5m2    8     15    57344    0x7C inf, 0x7D-0x7F NaN          (IEEE-like)
  e3m2    6     3     28       none                            (OCP fp6)
  e2m3    6     1     7.5      none                            (OCP fp6)
  e2m1    4     1     6        none                            (OCP fp4)
  e8m0    8     127   2^127    0xFF NaN, 0x00 = 2^-127, unsigned, no zero
"""
import math

import torch

# name: (exponent bits, mantissa bits, bias)
SPECS = {
    "e4m3": (4, 3, 7),
    "e5m2": (5, 2, 15),
    "e3m2": (3, 2, 3),
    "e2m3": (2, 3, 1),
    "e2m1": (2, 1, 1),
}
FP8_E4M3_MAX, FP8_E5M2_MAX, FP4_E2M1_MAX = 448.0, 57344.0, 6.0
E8M0_BIAS, E8M0_NAN = 127, 0xFF
TORCH_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _value(fmt: str, code: int) -> float:
    """Exact value of one code, straight from the format definition."""
    ebits, mbits, bias = SPECS[fmt]
    sign = -1.0 if code >> (ebits + mbits) else 1.0
    exp, man = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    if (fmt == "e4m3" and exp == 15 and man == 7) or (fmt == "e5m2" and exp == 31 and man):
        return math.copysign(float("nan"), sign)  # keep the sign bit, as conversions do
    if fmt == "e5m2" and exp == 31:
        return sign * float("inf")
    if exp == 0:  # subnormal
        return sign * man * 2.0 ** (1 - bias - mbits)
    return sign * (1 + man / 2**mbits) * 2.0 ** (exp - bias)


_TABLES = {f: torch.tensor([_value(f, c) for c in range(1 << (1 + e + m))], dtype=torch.float32)
           for f, (e, m, _) in SPECS.items()}


def max_value(fmt: str) -> float:
    t = _TABLES[fmt]
    return float(t[torch.isfinite(t)].max())


def as_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 view of a code tensor (accepts uint8/int8 and torch float8 dtypes)."""
    return x if x.dtype == torch.uint8 else x.view(torch.uint8)


def decode(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """codes (uint8, or a torch fp8 dtype) -> float32 values, same shape."""
    if fmt == "e8m0":
        return decode_e8m0(codes)
    return _TABLES[fmt][as_codes(codes).long()]


def encode(x: torch.Tensor, fmt: str, saturate: bool = True) -> torch.Tensor:
    """float -> uint8 codes with RNE.

    saturate=True: finite overflow and +-inf clamp to +-max (NaN stays NaN where
    the format has one). saturate=False: overflow gives NaN for e4m3 and +-inf for
    e5m2 (ml_dtypes' behaviour). fp6/fp4 have no inf/NaN and always saturate; a
    NaN input has no code there and maps to +0.
    """
    ebits, mbits, bias = SPECS[fmt]
    x = x.float()
    bits = x.view(torch.int32)
    sign = ((bits >> 31) & 1).to(torch.int32) << (ebits + mbits)
    a = x.abs()
    emin = 1 - bias
    # floor(log2 |x|) from the f32 exponent field (f32 subnormals are far below every grid here)
    e = ((a.view(torch.int32) >> 23) - 127).clamp(min=emin, max=127)
    quantum = ((e - mbits + 127) << 23).view(torch.float32)  # 2^(e - mbits), the target's ulp
    r = torch.round(a / quantum) * quantum  # torch.round is half-to-even; both ops exact
    vmax = max_value(fmt)
    over = r > vmax  # includes inf; NaN compares False
    rb = r.view(torch.int32)
    normal = ((((rb >> 23) - 127 + bias) << mbits) | ((rb >> (23 - mbits)) & ((1 << mbits) - 1)))
    sub = (r * 2.0 ** (mbits - emin)).to(torch.int32)  # exact: r is a multiple of the subnormal ulp
    code = torch.where(r >= 2.0**emin, normal, sub)
    vmax_code = int((_TABLES[fmt] == vmax).nonzero()[0])
    nan = torch.isnan(x)
    if saturate or fmt not in ("e4m3", "e5m2"):
        code = torch.where(over, vmax_code, code)
    else:
        code = torch.where(over, 0x7F if fmt == "e4m3" else 0x7C, code)
    if fmt == "e4m3":
        code = torch.where(nan, 0x7F, code)
    elif fmt == "e5m2":
        code = torch.where(nan, 0x7E, code)
    else:
        code, sign = torch.where(nan, 0, code), torch.where(nan, 0, sign)
    return (code | sign).to(torch.uint8)


def to_torch_fp8(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """Reinterpret uint8 codes as torch.float8_e4m3fn / float8_e5m2 (no conversion)."""
    return codes.view(TORCH_DTYPES[fmt])


# ---- e8m0 (MX block scales) ----
def decode_e8m0(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 -> float32 2^(code-127); 0x00 -> 2^-127 (f32 subnormal), 0xFF -> NaN."""
    c = as_codes(codes).to(torch.int32)
    v = torch.where(c == 0, 0x00400000, c << 23).view(torch.float32)
    return torch.where(c == E8M0_NAN, float("nan"), v)


def encode_e8m0(x: torch.Tensor) -> torch.Tensor:
    """float -> nearest power of two as e8m0 (ties up; clamps below at 2^-127).

    Zero, negatives, inf, NaN and values rounding past 2^127 give 0xFF (NaN).
    Quantizers pick scale exponents with floor/ceil rules instead (see quant.py).
    """
    m, e = torch.frexp(x.double())  # x = m * 2^e, m in [0.5, 1): exact in float64
    k = e - 1 + (m >= 0.75).to(e.dtype)  # |x| in [2^(e-1), 2^e); half-way point is 0.75 * 2^e
    code = (k + E8M0_BIAS).clamp(min=0)
    bad = ~(x > 0) | torch.isinf(x) | (code > 254)
    return torch.where(bad, E8M0_NAN, code).to(torch.uint8)


# ---- fp4 packing: two e2m1 codes per byte, element 2i in the low nibble ----
def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (0..15) -> [..., K/2] uint8."""
    c = as_codes(codes)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] uint8 -> [..., K] uint8 codes."""
    p = as_codes(packed)
    return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2)


# ---- fp6 packing: a little-endian bit string, code i in bits [6i, 6i + 6) (four codes in three
# bytes), the order the scaled MFMA reads a lane's registers in (docs/gfx950_isa.md §1.3) ----
def pack_fp6(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (0..63), K % 4 == 0 -> [..., 3K/4] uint8."""
    c = as_codes(codes).to(torch.int32).view(*codes.shape[:-1], -1, 4)
    word = c[..., 0] | c[..., 1] << 6 | c[..., 2] << 12 | c[..., 3] << 18
    return torch.stack([word & 0xFF, word >> 8 & 0xFF, word >> 16], dim=-1).flatten(-2).to(torch.uint8)


def unpack_fp6(packed: torch.Tensor) -> torch.Tensor:
    """[..., 3K/4] uint8 -> [..., K] uint8 codes."""
    b = as_codes(packed).to(torch.int32).view(*packed.shape[:-1], -1, 3)
    word = b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16
    return torch.stack([word >> s & 0x3F for s in (0, 6, 12, 18)], dim=-1).flatten(-2).to(torch.uint8)


# Sub-byte formats: (codes per packing unit, bytes per unit, pack, unpack).
PACKED = {"e2m1": (2, 1, pack_fp4, unpack_fp4), "e2m3": (4, 3, pack_fp6, unpack_fp6),
          "e3m2": (4, 3, pack_fp6, unpack_fp6)}


def element_count(nbytes: int, fmt: str) -> int:
    """Codes held by nbytes of a payload of fmt (packed for the sub-byte formats)."""
    unit, size = PACKED[fmt][:2] if fmt in PACKED else (1, 1)
    return nbytes // size * unit


# ---- bf16 RNE (the kernels' output rounding) ----
def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 bit patterns (int32 in [0, 65535]) with RNE; NaN kept quiet."""
    b = x.float().view(torch.int32).long() & 0xFFFFFFFF
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return torch.where(torch.isnan(x), (b >> 16) | 0x40, r).to(torch.int32)


def bf16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (any int dtype, low 16 bits used) -> torch.bfloat16."""
    b = bits.to(torch.int32) & 0xFFFF
    return (b - ((b >> 15) << 16)).to(torch.int16).view(torch.bfloat16)


def bf16_rne(x: torch.Tensor) -> torch.Tensor:
    """float32 -> torch.bfloat16, rounding to nearest even."""
    return bf16_from_bits(bf16_bits(x))
