"""Quantizers producing payload + scales in the layouts mxgemm kernels consume.

Layouts (row-major, K fastest):
  MX (1x32 K-blocks):  payload [M, K] float8_e4m3fn / float8_e5m2, or [M, K/2] uint8 packed
                       e2m1 (element 2i in the low nibble), or [M, K] uint8 fp6 codes;
                       scales [M, K/32] uint8 e8m0. Weights B [N, K] the same way.
  DeepGEMM FP8:        per-token 1x128 scales [M, ceil(K/128)] fp32, per-block 128x128
                       scales [ceil(N/128), ceil(K/128)] fp32 (powers of two with use_ue8m0).
  Tensorwise FP8:      one fp32 scale (0-dim tensor).
Dequantised value = decode(code) * scale.
Every helper refuses bad arguments (non-tensors, wrong dtypes or ranks, unknown formats or
modes, non-positive block sizes, scales not matching the payload) with mxgemm.guards.GuardError
(a ValueError) before computing anything.
"""
import numbers

import torch

from . import formats as F
from . import guards

MX_BLOCK = 32
# floor(log2(max)) of each element format: the exponent OCP MX aligns the block amax to
EMAX = {"e4m3": 8, "e5m2": 15, "e3m2": 4, "e2m3": 2, "e2m1": 2}
MX_MODES = ("floor", "rceil", "even")


def _check_tensor(x, name: str, floating: bool = False) -> None:
    if not isinstance(x, torch.Tensor):
        guards.fail("type", f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if floating and not x.is_floating_point():
        guards.fail("dtype", f"{name} has dtype {x.dtype}; expected a floating dtype")


def _check_block(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        guards.fail("block", f"{name} = {value!r} must be a positive int (elements per scale block)")


def _check_fmt(fmt, allowed) -> None:
    """``allowed``: a formats table (F.SPECS, F.TORCH_DTYPES) whose keys are the valid names."""
    if not isinstance(fmt, str) or fmt not in allowed:
        guards.fail("format", f"fmt = {fmt!r}: expected one of {', '.join(allowed)}")


def _check_mode(mode) -> None:
    if not isinstance(mode, str) or mode not in MX_MODES:
        guards.fail("mode", f"mode = {mode!r}: expected one of {', '.join(MX_MODES)}")


def _check_payload(payload, fmt) -> None:
    """MX payload: codes as uint8 (packed for e2m1, e3m2, e2m3) or the format's torch fp8 dtype, >= 1-D.
    A payload of another dtype would be reinterpreted byte by byte, silently."""
    _check_fmt(fmt, F.SPECS)
    _check_tensor(payload, "payload")
    guards.check_dtype(payload, "payload", (torch.uint8, F.TORCH_DTYPES[fmt]) if fmt in F.TORCH_DTYPES
                       else torch.uint8)
    if payload.dim() == 0:
        guards.fail("shape", "payload must have at least 1 dimension; got a 0-d tensor")


def _floor_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact floor(log2 x) for finite x > 0 (f32 subnormals included), int64."""
    m, e = torch.frexp(x.double())
    return e.long() - 1


def mx_scale_e8m0(amax: torch.Tensor, fmt: str, mode: str = "floor") -> torch.Tensor:
    """Block amax (fp32) -> e8m0 scale code, as torchao's to_mx computes it.

    floor (OCP MX v1.0): 2^(floor(log2 amax) - emax); the largest elements may saturate.
    even:  amax first rounded (half-up) to the element's mantissa width, then floor.
    rceil: 2^ceil(log2(amax / max)) with amax / max rounded to fp32 first; never saturates.
    amax == 0 gives code 0 (2^-127), NaN gives 0xFF; exponents clamp to [-127, 127].
    """
    _check_tensor(amax, "amax")
    _check_fmt(fmt, F.SPECS)
    _check_mode(mode)
    amax = amax.float()
    ebits, mbits, _ = F.SPECS[fmt]
    if mode == "rceil":
        d = amax / F.max_value(fmt)
        exp = _floor_log2(d) + (torch.frexp(d.double())[0] != 0.5).long()  # ceil; exact
        exp = torch.where(torch.isinf(d), 127, exp)
    else:
        if mode == "even":  # add half an element-ulp to the f32 mantissa, truncate to the exponent
            b = amax.view(torch.int32) + (1 << (22 - mbits))
            amax = torch.where(torch.isnan(amax), amax, (b & 0x7F800000).view(torch.float32))
        exp = torch.where(torch.isinf(amax), 128, _floor_log2(amax)) - EMAX[fmt]
    # amax == 0, or (rceil) an amax / max that underflows fp32: the smallest scale
    exp = torch.where((amax == 0) | (d == 0) if mode == "rceil" else amax == 0, -127, exp)
    code = exp.clamp(-127, 127) + F.E8M0_BIAS
    return torch.where(torch.isnan(amax), F.E8M0_NAN, code).to(torch.uint8)


def quantize_mx(x: torch.Tensor, fmt: str = "e4m3", mode: str = "floor", block: int = MX_BLOCK):
    """x [..., K] (fp32/bf16) -> (payload, scales [..., K/block] uint8 e8m0).

    Elements are divided by their block's scale exactly (powers of two) and encoded
    with RNE, saturating. payload: fp8 torch dtype for e4m3/e5m2, packed uint8
    [..., K/2] for e2m1 (two codes a byte, even k in the low nibble) and [..., 3K/4] for
    e3m2/e2m3 (a little-endian 6-bit string, four codes in three bytes). K must be a multiple of
    ``block`` (and of 2 for e2m1, 4 for the fp6 formats).
    """
    _check_tensor(x, "x", floating=True)
    if x.dim() == 0:
        guards.fail("shape", "x must have at least 1 dimension; got a 0-d tensor")
    _check_fmt(fmt, F.SPECS)
    _check_mode(mode)
    _check_block(block, "block")
    K = x.shape[-1]
    guards.check_multiple(K, "K of x (its last dimension)", block, f"MX block: K % {block} == 0")
    if fmt in F.PACKED:
        unit = F.PACKED[fmt][0]
        guards.check_multiple(K, "K of x (its last dimension)", unit, f"{fmt} packing: K % {unit} == 0")
    xb = x.float().reshape(*x.shape[:-1], K // block, block)
    scale = mx_scale_e8m0(xb.abs().amax(-1), fmt, mode)
    codes = F.encode(xb / F.decode_e8m0(scale).unsqueeze(-1), fmt, saturate=True).reshape(x.shape)
    if fmt in F.TORCH_DTYPES:
        return F.to_torch_fp8(codes, fmt), scale
    return (F.PACKED[fmt][2](codes) if fmt in F.PACKED else codes), scale


def mx_values(payload: torch.Tensor, fmt: str) -> torch.Tensor:
    """Unscaled element values of an MX payload (fp4 / fp6 unpacked), fp32 [..., K]."""
    _check_payload(payload, fmt)
    if fmt in F.PACKED and payload.shape[-1] % F.PACKED[fmt][1]:
        guards.fail("shape", f"{fmt} payload: the last dimension ({payload.shape[-1]} bytes) must be a multiple of "
                             f"{F.PACKED[fmt][1]}")
    codes = F.PACKED[fmt][3](payload) if fmt in F.PACKED else F.as_codes(payload)
    return F.decode(codes, fmt)


def dequantize_mx(payload: torch.Tensor, scale: torch.Tensor, fmt: str = "e4m3",
                  block: int = MX_BLOCK) -> torch.Tensor:
    """(payload, e8m0 scales [..., K/block], uint8 codes or torch.float8_e8m0fnu) -> fp32 [..., K];
    exact (power-of-two scaling)."""
    _check_payload(payload, fmt)
    _check_tensor(scale, "scale")
    guards.check_dtype(scale, "scale", (torch.uint8, torch.float8_e8m0fnu))
    _check_block(block, "block")
    K = F.element_count(payload.shape[-1], fmt)
    guards.check_multiple(K, "K of payload (its last dimension, in elements)", block, f"MX block: K % {block} == 0")
    guards.check_shape(scale, "scale", (*payload.shape[:-1], K // block))
    v = mx_values(payload, fmt)
    return v * F.decode_e8m0(scale).repeat_interleave(block, dim=-1)


def shuffle_scales(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 scales [R, C] (row-major, one byte per 32-element K block) -> the pre-shuffled layout
    of mx_gemm(shuffled_scales=True), aiter's e8m0_shuffle and Triton's CDNA4 block-scaled tutorial:
    [R', C'], R and C padded with zeros to multiples of 32 and 8. Row r = 32 r0 + 16 r1 + r2 and
    column c = 8 c0 + 4 c1 + c2 go to byte (((4 c0 + c2) 16 + r2) 2 + c1) 2 + r1 of the 32 C'
    bytes of row group r0: an MMA lane (row r2, K block c2) finds its scales of rows r2, r2 + 16 and
    K steps 2 c0, 2 c0 + 1 in one dword. Runs once per weight; a quantizer can emit it directly."""
    _check_tensor(scale, "scale")
    guards.check_dtype(scale, "scale", (torch.uint8, torch.float8_e8m0fnu))
    guards.check_shape(scale, "scale", (None, None))
    R, C = -(-scale.shape[0] // 32) * 32, -(-scale.shape[1] // 8) * 8
    padded = torch.zeros(R, C, dtype=torch.uint8, device=scale.device)
    padded[:scale.shape[0], :scale.shape[1]] = scale.view(torch.uint8)
    out = padded.view(R // 32, 2, 16, C // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).reshape(R, C)
    return out.view(scale.dtype)


# ---- DeepGEMM-style FP8 (e4m3) with fp32 scales ----
FP8_AMAX_EPS = 1e-4  # DeepGEMM clamps amax so all-zero blocks get a finite scale


def ceil_to_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """Round positive fp32 scales up to a power of two (exponent clamped to [-126, 127])."""
    _check_tensor(sf, "sf", floating=True)
    b = sf.abs().float().view(torch.int32)
    exp = ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0).int()
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def _cast_blocks(x: torch.Tensor, bm: int, bk: int, use_ue8m0: bool, fmt: str = "e4m3"):
    """Shared body: x [..., M, K] -> (fp8 [..., M, K], sf [..., ceil(M/bm), ceil(K/bk)]) with zero
    padding, leading dims batched."""
    *lead, M, K = x.shape
    pm, pk = -M % bm, -K % bk
    xp = torch.nn.functional.pad(x.float(), (0, pk, 0, pm))
    xv = xp.view(*lead, (M + pm) // bm, bm, (K + pk) // bk, bk)
    sf = xv.abs().amax(dim=(-3, -1)).clamp(min=FP8_AMAX_EPS) / (F.FP8_E4M3_MAX if fmt == "e4m3" else F.FP8_E5M2_MAX)
    if use_ue8m0:
        sf = ceil_to_ue8m0(sf)
    y = xv * (1.0 / sf)[..., :, None, :, None]  # reciprocal then multiply, as DeepGEMM does
    codes = F.encode(y, fmt).view(*lead, M + pm, K + pk)[..., :M, :K].contiguous()
    return F.to_torch_fp8(codes, fmt), sf


def _check_matrix(x) -> None:
    _check_tensor(x, "x", floating=True)
    if x.dim() != 2:
        guards.fail("shape", f"x must be 2-D [rows, K]; got shape {list(x.shape)}")


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128):
    """x [M, K] -> (e4m3 [M, K], sf fp32 [M, ceil(K/gran_k)]): 1 x gran_k activation scales,
    sf = max(amax, 1e-4) / 448 (rounded up to a power of two with use_ue8m0)."""
    _check_matrix(x)
    _check_block(gran_k, "gran_k")
    return _cast_blocks(x, 1, gran_k, use_ue8m0)


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran: int = 128):
    """w [N, K] -> (e4m3 [N, K], sf fp32 [ceil(N/gran), ceil(K/gran)]): gran x gran weight scales."""
    _check_matrix(x)
    _check_block(gran, "gran")
    return _cast_blocks(x, gran, gran, use_ue8m0)


def tensorwise_cast_to_fp8(x: torch.Tensor, fmt: str = "e4m3"):
    """x (any shape) -> (fmt same shape, sf fp32 0-dim): one scale max(amax, 1e-4) / fmt max
    (448 e4m3, 57344 e5m2). An empty x has amax 0: the all-zero tensor's scale, 1e-4 / fmt max."""
    _check_tensor(x, "x", floating=True)
    _check_fmt(fmt, F.TORCH_DTYPES)
    flat = x.reshape(1, -1) if x.numel() else x.new_zeros(1, 1)  # a block of 0 elements has no scale
    q, sf = _cast_blocks(flat, 1, flat.shape[1], False, fmt)
    return q[:, :x.numel()].reshape(x.shape), sf.reshape(())


def rowwise_cast_to_fp8(x: torch.Tensor, fmt: str = "e4m3"):
    """x [..., K] -> (fmt [..., K], sf fp32 [...]): one scale per row along the last dimension,
    max(amax, 1e-4) / fmt max (Primus-Turbo's row-wise granularity; for column-wise scales pass
    x.mT and transpose back)."""
    _check_tensor(x, "x", floating=True)
    _check_fmt(fmt, F.TORCH_DTYPES)
    if x.dim() == 0:
        guards.fail("shape", "x must have at least 1 dimension; got a 0-d tensor")
    rows = x.reshape(-1, x.shape[-1]) if x.shape[-1] else x.new_zeros(x.shape[:-1].numel(), 1)
    q, sf = _cast_blocks(rows, 1, rows.shape[1], False, fmt)
    return q[:, :x.shape[-1]].reshape(x.shape), sf.reshape(x.shape[:-1])


def blockwise_cast_to_fp8(x: torch.Tensor, block: tuple = (1, 128), fmt: str = "e4m3"):
    """x [..., M, K] -> (fmt [..., M, K], sf fp32 [..., ceil(M/bm), ceil(K/bk)]): one scale per
    bm x bk block (1 x 128: activations, 128 x 128: weights), leading dims batched."""
    _check_tensor(x, "x", floating=True)
    _check_fmt(fmt, F.TORCH_DTYPES)
    if x.dim() < 2:
        guards.fail("shape", f"x must be [..., M, K]; got shape {list(x.shape)}")
    bm, bk = block
    _check_block(bm, "block")
    _check_block(bk, "block")
    return _cast_blocks(x, bm, bk, False, fmt)


def segments(x: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, block: int):
    """(xp [P, C], padded_offs int64 [G + 1]): row group g of x (rows starts[g] .. starts[g] +
    lens[g], groups in order, gaps between them allowed) copied to a segment starting at
    padded_offs[g], a multiple of ``block``, zero rows after each; P = R + G (block - 1) rounded
    up to block (an upper bound known without reading the groups: no device sync); rows outside
    every group are dropped."""
    _check_matrix(x)
    _check_block(block, "block")
    starts, lens = (v.to(device=x.device, dtype=torch.int64) for v in (starts, lens))
    padded = torch.cat([starts.new_zeros(1), ((lens + block - 1) // block * block).cumsum(0)])
    R, C = x.shape
    G = lens.shape[0]
    P = -(-(R + G * (block - 1)) // block) * block
    xp = x.new_zeros(P, C)
    if G:
        rows = torch.arange(R, device=x.device)
        g = (torch.searchsorted(starts, rows, right=True) - 1).clamp(min=0)
        inside = (rows >= starts[g]) & (rows < starts[g] + lens[g])
        xp[(rows - starts[g] + padded[g])[inside]] = x[inside]
    return xp, padded


def _segments(x: torch.Tensor, group_offs: torch.Tensor, block: int):
    """segments of contiguous groups: group g is rows group_offs[g] .. group_offs[g + 1]."""
    offs = group_offs.to(device=x.device, dtype=torch.int64)
    return segments(x, offs[:-1], offs[1:] - offs[:-1], block)


def segment_cast_to_fp8(x: torch.Tensor, group_offs: torch.Tensor, block: int = 128, fmt: str = "e4m3"):
    """Column-wise block scales over row groups: x [R, C] with groups of rows
    group_offs[g] .. group_offs[g + 1] -> (q [P, C], sf fp32 [P / block, C], padded_offs int64
    [G + 1]): each group's rows in a segment starting on a multiple of ``block`` (_segments), one
    scale per ``block`` rows of a segment and column. This is the operand layout of the variable-K
    GEMM with block scales (its groups start on multiples of 128)."""
    _check_fmt(fmt, F.TORCH_DTYPES)
    xp, padded = _segments(x, group_offs, block)
    q, sf = _cast_blocks(xp.t(), 1, block, False, fmt)
    return q.t().contiguous(), sf.t().contiguous(), padded


def segment_quantize_mx(x: torch.Tensor, group_offs: torch.Tensor, fmt: str = "e4m3"):
    """MX scales along the rows of each row group: x [R, C] -> (payload [P, C], e8m0 scales
    [C, P / 32], padded_offs int64 [G + 1]): the segments of _segments (32-row aligned), each
    column's 32-row blocks quantised as quantize_mx (floor). The operand layout of the variable-K
    GEMM with mx scales (its groups start on multiples of 32)."""
    _check_fmt(fmt, F.TORCH_DTYPES)
    xp, padded = _segments(x, group_offs, MX_BLOCK)
    q, sc = quantize_mx(xp.t(), fmt)
    return q.t().contiguous(), sc, padded


def dequantize_fp8_blocks(q: torch.Tensor, sf: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """e4m3 [M, K] (float8_e4m3fn or uint8 codes) with sf [ceil(M/bm), ceil(K/bk)] -> fp32 [M, K]
    (bm=1: per-token)."""
    _check_tensor(q, "q")
    guards.check_dtype(q, "q", (torch.float8_e4m3fn, torch.uint8))
    if q.dim() != 2:
        guards.fail("shape", f"q must be 2-D [M, K]; got shape {list(q.shape)}")
    _check_tensor(sf, "sf", floating=True)
    _check_block(bm, "bm")
    _check_block(bk, "bk")
    M, K = q.shape
    guards.check_shape(sf, "sf", (-(-M // bm), -(-K // bk)))
    s = sf.float().repeat_interleave(bm, 0)[:M].repeat_interleave(bk, 1)[:, :K]
    return F.decode(q, "e4m3") * s


# ---- Weight pre-shuffles ----
# Kernel-specific weight layouts (e.g. MFMA-tile-interleaved B for the MoE kernels) get one
# function each here: `shuffle_<kernel>(w, scales) -> (w_shuffled, scales_shuffled)` plus its
# inverse for tests, so reference ops keep consuming the plain row-major layouts above.


# ---- MXFP4 training operands (Primus-Turbo's grouped_gemm_fp4 recipe, docs/primus_turbo_fp4.md) ----
HADAMARD = 16   # the wgrad operands' Hadamard transform is over 16 consecutive contraction elements


def _h4(v0, v1, v2, v3):
    """One 4-point Hadamard butterfly (Sylvester order), the additions in Primus-Turbo's order."""
    a0, a1, a2, a3 = v0 + v1, v0 - v1, v2 + v3, v2 - v3
    return a0 + a2, a1 + a3, a0 - a2, a1 - a3


def hadamard16(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] (K % 16 == 0) -> fp32 [..., K]: every 16 consecutive elements times H16 / 4, H16
    the Sylvester-ordered Walsh-Hadamard matrix (symmetric; H16 / 4 is orthogonal and its own
    inverse), evaluated in fp32 as Primus-Turbo's MXFP4 quantiser does: a 4-point butterfly over
    each 4 consecutive elements, then one across the four groups of 4, then * 0.25. A fixed
    transform: no random signs (docs/primus_turbo_fp4.md)."""
    _check_tensor(x, "x", floating=True)
    if x.dim() == 0:
        guards.fail("shape", "x must have at least 1 dimension; got a 0-d tensor")
    guards.check_multiple(x.shape[-1], "K of x (its last dimension)", HADAMARD, f"Hadamard: K % {HADAMARD} == 0")
    v = x.float().reshape(*x.shape[:-1], -1, 4, 4)    # [..., chunk, group of 4, element in the group]
    v = torch.stack(_h4(*v.unbind(-1)), -1)
    v = torch.stack(_h4(*v.unbind(-2)), -2) * 0.25
    return v.reshape(x.shape)


def quantize_mx_2d(x: torch.Tensor, fmt: str = "e2m1", mode: str = "floor"):
    """x [..., R, C] (R, C multiples of 32) quantised in 32 x 32 tiles, one e8m0 scale per tile
    (Primus-Turbo's 2-D block recipe for weights), so the elements are the same read along either
    axis -> (payload along C [..., R, C'], scales [..., R, C/32], payload of x^T along R
    [..., C, R'], scales [..., C, R/32]); C', R' as quantize_mx packs fmt (e2m1: half)."""
    _check_tensor(x, "x", floating=True)
    if x.dim() < 2:
        guards.fail("shape", f"x must have at least 2 dimensions [..., R, C]; got shape {list(x.shape)}")
    _check_fmt(fmt, F.SPECS)
    _check_mode(mode)
    R, C = x.shape[-2:]
    guards.check_multiple(R, "R of x (dimension -2)", MX_BLOCK, f"MX 2-D block: R % {MX_BLOCK} == 0")
    guards.check_multiple(C, "C of x (its last dimension)", MX_BLOCK, f"MX 2-D block: C % {MX_BLOCK} == 0")
    xb = x.float().reshape(*x.shape[:-2], R // MX_BLOCK, MX_BLOCK, C // MX_BLOCK, MX_BLOCK)
    scale = mx_scale_e8m0(xb.abs().amax((-3, -1)), fmt, mode)                        # [..., R/32, C/32]
    codes = F.encode(xb / F.decode_e8m0(scale)[..., :, None, :, None], fmt, saturate=True).reshape(x.shape)

    def payload(c):
        if fmt in F.TORCH_DTYPES:
            return F.to_torch_fp8(c, fmt)
        return F.PACKED[fmt][2](c) if fmt in F.PACKED else c
    return (payload(codes), scale.repeat_interleave(MX_BLOCK, -2),
            payload(codes.mT.contiguous()), scale.mT.repeat_interleave(MX_BLOCK, -2))


def segment_quantize_fp4(x: torch.Tensor, group_offs: torch.Tensor, rht: bool = True, mode: str = "even"):
    """MXFP4 along the rows of each row group, stored contraction-contiguous: x [R, C] -> (payload
    uint8 [C, P/2], e8m0 scales [C, P/32], padded_offs int64 [G + 1]): the 32-row aligned
    zero-padded segments of _segments, transposed, each 16 rows of a segment first multiplied by
    H16 / 4 (rht, hadamard16; segments start on multiples of 32, so no chunk spans two groups),
    then quantize_mx(e2m1, mode) per 32 rows. The wgrad operand of grouped_gemm_fp4_variable_k
    (Primus-Turbo's column-wise quantiser pads to 256 rows; the values are the same)."""
    _check_mode(mode)
    xp, padded = _segments(x, group_offs, MX_BLOCK)
    xt = hadamard16(xp.t()) if rht else xp.t()
    q, sc = quantize_mx(xt, "e2m1", mode)
    return q, sc, padded
