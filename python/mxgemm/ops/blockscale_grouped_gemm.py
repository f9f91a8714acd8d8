"""deep_gemm_fp8_grouped_gemm: DeepGEMM's FP8 and FP8 x FP4 block-scale grouped GEMMs (NT), and its
unscaled BF16 grouped GEMMs, contiguous (m_indices or psum), and masked, on the blockscale_grouped_gemm FlyDSL
kernel family.
``mxgemm.deep_gemm`` exposes it under DeepGEMM's names and argument order. Tile choice
(``mxgemm.explain`` prints it): the caller's config, else the tuned CSV row (``python -m mxgemm
tune blockscale``) of the same variant family, G, N and K at the nearest tuned M >= the call's
(masked: rows of a group's buffer; contiguous: rows of a), else ``choose_tile``'s rule."""
from __future__ import annotations

import functools

import torch

from .. import guards, registry, tuned
from ._op import E8M0, NUM_CUS, Choice, ConfigGrammar, Plan, empty_plan, kernel_plan, op

_KERNEL = registry.get("blockscale_grouped_gemm")
BLOCK = 128                        # scale block (1x128 activations, 128x128 weights)
FP4_BLOCK = 32                     # scale block along K of FP4 weights (recipe_b (1, 32))
M_ALIGN = 128                      # row alignment of each group in the contiguous layouts (kernel's M_ALIGN)
MAX_WORKGROUPS = 2 ** 21           # the kernel's tile order divides in float, exact below this
FP4 = (torch.int8, torch.uint8)    # b as e2m1 packed two per byte, even K in the low nibble
# UE8M0 scales: one byte per scale, or DeepGEMM's SM100 packing of four to an int32 (byte i of
# word j = K block 4j + i, little-endian; sfb then holds one scale per row of b)
PACKED = torch.int32
_E8M0 = (*E8M0, PACKED)


SMALL_TILE = (32, 32)              # for N % 64 != 0 only (and the emulator tests)


CONFIG = ConfigGrammar("deep_gemm_fp8_grouped_gemm", {"BM": int, "BN": int}, required=True)
ARCH, = _KERNEL.archs            # the one arch the tuned table is for
CONFIG_CSV = tuned.table_path("blockscale_grouped_gemm", ARCH)
CSV_FIELDS = ("family", "G", "M", "N", "K", "BM", "BN", "us", "source", "runner_up", "runner_up_us", "peer_us")


def parse_config(config) -> tuple | None:
    """A forced tile, "BM=128,BN=64" or {"BM": 128, "BN": 64} -> (BM, BN); "" / None -> None."""
    cfg = CONFIG.parse(config)
    return None if cfg is None else (cfg["BM"], cfg["BN"])


def choose_tile(N: int, m_tiles, tiles, config="") -> tuple:
    """(BM, BN, why): the caller's config, else the deterministic default over the registered
    tiles (``tiles``, for this call's layout, scales and output) with N % BN == 0: the 32 x 32
    tile only when no larger one divides N; else, of the tiles whose grid has at least NUM_CUS
    workgroups, the one computing the fewest rows past the row tiles' live rows (masked buffers
    of 64 rows: 64-row tiles), then one whose grid gives some CU a second workgroup (the K loop of
    one then runs while the other's waits on its loads), then the largest; else (a grid too small
    for the GPU) the tile with the most workgroups. ``m_tiles(BM)``: row tiles of the call."""
    fits = [t for t in tiles if N % t[1] == 0]
    forced = parse_config(config)
    if forced is not None:
        if forced not in fits:
            guards.fail("config", f"tile {forced[0]}x{forced[1]} is not a registered tile dividing N = {N} for "
                                  f"this layout, scale and output type; registered: {sorted(set(tiles))}")
        return (*forced, "config given by the caller")
    big = sorted((t for t in fits if t != SMALL_TILE), key=lambda t: -t[0] * t[1])
    if not big:
        return (*SMALL_TILE, f"no larger registered tile divides N = {N}")
    grid = {t: m_tiles(t[0]) * (N // t[1]) for t in big}
    full = sorted((t for t in big if grid[t] >= NUM_CUS), key=lambda t: (m_tiles(t[0]) * t[0], grid[t] == NUM_CUS))
    if full:
        return (*full[0], f"largest tile of the fewest rows whose grid ({grid[full[0]]} workgroups) fills "
                          f"{NUM_CUS} CUs")
    best = max(big, key=lambda t: (grid[t], t[0] * t[1]))
    return (*best, f"no tile's grid fills {NUM_CUS} CUs: the most workgroups ({grid[best]})")


def family_tiles(family: dict) -> list:
    """The registered tiles of a variant family (every key but BM and BN)."""
    return [(v["BM"], v["BN"]) for v in _KERNEL.variants
            if {k: x for k, x in v.items() if k not in ("BM", "BN")} == family]


def family_text(family: dict) -> str:
    """A variant family as the tuned table's key column, e.g. "MASKED=1,OUT=bf16,UE8M0=0"."""
    return ",".join(f"{k}={v}" for k, v in sorted(family.items()))


def candidates(N: int, family: dict) -> list:
    """The tiles a tuner times: the family's registered tiles dividing N, the 32 x 32 one only
    where no larger one does (as choose_tile)."""
    fits = sorted({t for t in family_tiles(family) if N % t[1] == 0})
    return [t for t in fits if t != SMALL_TILE] or fits


@functools.lru_cache(maxsize=1)
def tuned_table() -> dict:
    """CSV rows keyed (family, G, N, K) -> list of (M, tile, source) by M. Read once."""
    return tuned.by_size(CONFIG_CSV, lambda r: (r["family"], *(int(r[c]) for c in "GNK")), "M",
                         lambda r: (int(r["BM"]), int(r["BN"])))


def tuned_tile(family: dict, G: int, M: int, N: int, K: int):
    """(BM, BN, why) of the CSV row at the nearest tuned M >= M with the same key, if its tile is
    still a candidate; else None."""
    row = tuned.at_or_above(tuned_table().get((family_text(family), G, N, K), ()), M)
    if row is None or row[1] not in candidates(N, family):
        return None
    return (*row[1], f"tuned CSV row M={row[0]} (source={row[2]})")


def row_tiles(masked: bool, G: int, M: int):
    """bm -> the grid's row tiles (masked: G buffers of M rows each; contiguous: M rows)."""
    return (lambda bm: G * -(-M // bm)) if masked else (lambda bm: -(-M // bm))


def choose_variant(G: int, M: int, N: int, K: int, m_tiles, family: dict, config="", sfa_kmajor=False) -> Choice:
    """The Choice of the family's registered variants: the caller's config, else the tuned row,
    else the tile of choose_tile (M: the tuned table's, module docstring); sfa_kmajor: that tile's
    SFA_KMAJOR form (row-major fp32 activation scales, loaded a window of K blocks at a time)."""
    tiles = family_tiles(family)
    if not tiles:
        guards.fail("variant", f"no registered variant for {family}: the FP4 and psum forms have bf16 out only")
    picked = tuned_tile(family, G, M, N, K) if parse_config(config) is None else None
    bm, bn, why = picked or choose_tile(N, m_tiles, tiles, config)
    return Choice(_KERNEL.name, registry.find_variant(_KERNEL, BM=bm, BN=bn, **family,
                                                      **({"SFA_KMAJOR": 1} if sfa_kmajor else {})), why)


def scale_strides(sf: torch.Tensor, name: str) -> tuple:
    """Byte strides (group, row, 4 K blocks, K block within 4) of scales [G?, rows, columns]:
    row-major (contiguous) or DeepGEMM's MN-major TMA-aligned layout (rows unit-stride, each
    column padded to 4 elements). Any other layout is refused."""
    m, cols = sf.shape[-2:]
    if sf.is_contiguous():
        st = sf.stride()
    else:
        col = -(-m // 4) * 4
        want = ((cols * col,) if sf.dim() == 3 else ()) + (1, col)
        if sf.stride() != want:
            guards.fail("layout", f"{name} has strides {sf.stride()} for shape {list(sf.shape)}; expected "
                                  f"row-major (contiguous) or MN-major with strides {want}")
        st = want
    sg, sm, sk = (st if sf.dim() == 3 else (0, *st))
    e = sf.element_size()
    return (sg * e, sm * e, sk * e, 1) if sf.dtype == PACKED else (sg * e, sm * e, 4 * sk * e, sk * e)


def _check_scales(x, G, N, K, rows_shape, fp4) -> tuple:
    """The scales' checks -> (UE8M0, sfa byte strides, sfb byte strides, sfb per row of b)."""
    ue8m0 = x.sfa.dtype in _E8M0
    if fp4 and not ue8m0:
        guards.fail("dtype", f"sfa has dtype {x.sfa.dtype}; FP4 b runs on the scaled MFMA's hardware scales: "
                             f"expected {' or '.join(map(str, _E8M0))} (UE8M0 codes)")
    guards.check_dtype(x.sfa, "sfa", (torch.float32, *_E8M0))
    guards.check_dtype(x.sfb, "sfb", _E8M0 if ue8m0 else torch.float32)
    k_blocks, packed_cols = -(-K // BLOCK), -(-K // (4 * BLOCK))
    guards.check_shape(x.sfa, "sfa", (*rows_shape, packed_cols if x.sfa.dtype == PACKED else k_blocks))
    sfb_packed = x.sfb.dtype == PACKED  # one scale per row of b, as DeepGEMM's packed recipe (1, 1, 128)
    if fp4:  # one scale per row of b and 32-K block, bytes or packed four to an int32
        guards.check_shape(x.sfb, "sfb", (G, N, -(-K // (4 * FP4_BLOCK)) if sfb_packed else K // FP4_BLOCK))
    else:
        guards.check_shape(x.sfb, "sfb", (G, N, packed_cols) if sfb_packed else (G, -(-N // BLOCK), k_blocks))
    for n, t in (("sfa", x.sfa), ("sfb", x.sfb)):
        guards.check_voffset(t, n)
    return ue8m0, scale_strides(x.sfa, "sfa"), scale_strides(x.sfb, "sfb"), sfb_packed or fp4


def _plan(x) -> Plan:
    a, b, out, masked, psum = x.a, x.b, x.out, bool(x.masked), bool(x.psum)
    guards.check_dtype(b, "b", (torch.float8_e4m3fn, *FP4, torch.bfloat16))
    bf16, fp4 = b.dtype == torch.bfloat16, b.dtype in FP4
    guards.check_dtype(a, "a", torch.bfloat16 if bf16 else torch.float8_e4m3fn)
    for n, sf in (("sfa", x.sfa), ("sfb", x.sfb)):
        if bf16 and sf is not None:
            guards.fail("scales", f"{n} is a {sf.dtype} tensor of shape {list(sf.shape)}; bf16 a and b take no "
                                  "scales: pass None")
        if not bf16 and sf is None:
            guards.fail("scales", f"{n} is None; {a.dtype} a takes block scales sfa and sfb")
    guards.check_dtype(out, "d", torch.bfloat16 if bf16 else (torch.bfloat16, torch.float16))
    name = "masked_m" if masked else "grouped_layout" if psum else "m_indices"
    guards.check_dtype(x.layout, name, torch.int32)
    for n, t in (("a", a), ("b", b), ("d", out), (name, x.layout)):
        guards.check_contiguous(t, n)
    device = guards.check_same_device(a=a, sfa=x.sfa, b=b, sfb=x.sfb, d=out, **{name: x.layout})
    if masked and (psum or x.zero_padding):
        guards.fail("layout", "psum and zero_padding are options of the contiguous layout, not of the masked one")

    if b.dim() != 3:
        guards.fail("shape", f"b must be [G, N, K{'/2' if fp4 else ''}]{' (FP4 packed two per byte)' if fp4 else ''}; "
                             f"got shape {list(b.shape)}")
    G, N, K = b.shape
    if fp4:
        K *= 2
        if a.shape[-1] != K:
            guards.fail("shape", f"b has shape {list(b.shape)} and a has K = {a.shape[-1]}: FP4 b must be "
                                 f"[G, N, K/2] = [G, N, {a.shape[-1] // 2}] (two e2m1 codes per byte)")
        guards.check_multiple(K, "K", FP4_BLOCK, f"K%{FP4_BLOCK}")
    guards.check_multiple(K, "K", _KERNEL.k_align, f"K%{_KERNEL.k_align}")
    guards.check_multiple(N, "N", _KERNEL.n_align, f"N%{_KERNEL.n_align}")
    lead = (G, None) if masked else (None,)
    guards.check_shape(a, "a", (*lead, K))
    rows_shape = a.shape[:-1]
    guards.check_shape(out, "d", (*rows_shape, N))
    ue8m0, sfa_st, sfb_st, sfb_per_row = (0, (0,) * 4, (0,) * 4, False) if bf16 else \
        _check_scales(x, G, N, K, rows_shape, fp4)
    if masked:
        m_max = a.shape[1]
        guards.check_shape(x.layout, "masked_m", (G,))
    elif psum:
        m_max = 0
        guards.check_shape(x.layout, "grouped_layout", (G,))
    else:
        m_max = 0
        guards.check_shape(x.layout, "m_indices", (a.shape[0],))
        guards.check_multiple(a.shape[0], "M (rows of a)", M_ALIGN, f"M%{M_ALIGN}")
    rows = a.shape[0] * (a.shape[1] if masked else 1)
    for n, t in (("a", a), ("d", out), ("b[group]", b[0] if G else b)):
        guards.check_voffset(t, n)

    if rows == 0 or N == 0 or G == 0:
        return empty_plan("deep_gemm_fp8_grouped_gemm", "empty problem: nothing to launch")
    family = dict(MASKED=int(masked), UE8M0=int(ue8m0), OUT="bf16" if out.dtype == torch.bfloat16 else "f16",
                  **({"PSUM": 1} if psum else {}), **({"B_FMT": "e2m1"} if fp4 else {}),
                  **({"A_FMT": "bf16"} if bf16 else {}))
    m_tiles = row_tiles(masked, G, m_max if masked else rows)
    # row-major fp32 sfa (K blocks adjacent): the kernel loads a window of them per row at once
    sfa_kmajor = not ue8m0 and not bf16 and sfa_st[2:] == (16, 4)
    choice = choose_variant(G, m_max if masked else rows, N, K, m_tiles, family, x.config, sfa_kmajor)
    variant, why = choice.variant, choice.why
    bm, bn = variant["BM"], variant["BN"]
    workgroups = m_tiles(bm) * (N // bn)
    if workgroups >= MAX_WORKGROUPS:
        guards.fail("workgroups", f"{m_tiles(bm)} row tiles x {N // bn} column tiles of {bm}x{bn} make "
                                  f"{workgroups} workgroups; the kernel takes fewer than "
                                  f"{MAX_WORKGROUPS} (2^21): split the call (fewer groups or columns of b)")
    scales = ("no scales, bf16 MFMAs" if bf16 else
              f"e8m0 scales{' (packed)' if PACKED in (x.sfa.dtype, x.sfb.dtype) else ''} on the scaled MFMA"
              if ue8m0 else f"fp32 scales ({'row' if sfa_kmajor else 'MN'}-major sfa), exact per-128-K promotion")
    layout = "masked layout" if masked else f"contiguous ({'psum' if psum else 'm_indices'}) layout, padding " \
        f"rows {'zeroed' if x.zero_padding else 'untouched'}"
    operands = "bf16" if bf16 else "e4m3 x e2m1" if fp4 else "e4m3"
    return kernel_plan("deep_gemm_fp8_grouped_gemm", _KERNEL.name, variant, device,
                       f"{layout}, {operands}, {scales}, {bm}x{bn} tile ({why})",
                       N=N, K=K, m_tiles=m_tiles(bm), rows=rows, m_max=m_max, groups=G,
                       zero_pad=int(bool(x.zero_padding)),
                       **dict(zip(("sfa_sg", "sfa_sm", "sfa_sk4", "sfa_sk1"), sfa_st)),
                       **dict(zip(("sfb_sg", "sfb_sn", "sfb_sk4", "sfb_sk1"), sfb_st)),
                       sfb_shift=0 if sfb_per_row else 7)


def _check_layout(x, plan) -> None:
    """Group ids, ends and row counts the kernel relies on (reads the tensor: a sync on a GPU)."""
    G, lay = x.b.shape[0], x.layout
    if x.masked:
        m_max = x.a.shape[1]
        bad = ((lay < 0) | (lay > m_max)).nonzero()
        if bad.numel():
            i = int(bad[0])
            guards.fail("masked_m", f"masked_m[{i}] = {int(lay[i])} is outside 0..{m_max} (M_max of a)")
        return
    if x.psum:  # group g: rows align(end[g-1], M_ALIGN) .. end[g]
        M = x.a.shape[0]
        ends = lay.long()
        starts = torch.cat([ends.new_zeros(1), (ends[:-1] + M_ALIGN - 1) // M_ALIGN * M_ALIGN])
        bad = ((ends < starts) | (ends > M)).nonzero()
        if bad.numel():
            g = int(bad[0])
            guards.fail("grouped_layout", f"grouped_layout[{g}] = {int(ends[g])}: with use_psum_layout each entry is "
                                          f"its group's end row, at least the group's start {int(starts[g])} (the "
                                          f"previous end aligned to {M_ALIGN}) and at most M = {M}")
        return
    bad = ((lay < -1) | (lay >= G)).nonzero()
    if bad.numel():
        i = int(bad[0])
        guards.fail("m_indices", f"m_indices[{i}] = {int(lay[i])}: a group of b (0..{G - 1}) or -1 (padding)")
    blocks = lay.view(-1, M_ALIGN)
    first = blocks[:, :1]
    padded = (blocks < 0).cummax(dim=1).values      # at or after a block's first padding row
    mixed = ((blocks != first) & (blocks >= 0)) | (padded & (blocks >= 0))
    bad = mixed.any(dim=1).nonzero()
    if bad.numel():
        r = int(bad[0]) * M_ALIGN
        guards.fail("group-alignment", f"rows {r}..{r + M_ALIGN - 1} of m_indices hold "
                                       f"{sorted(set(blocks[int(bad[0])].tolist()))}: each {M_ALIGN}-row block "
                                       "must start with its group's rows, then only -1 padding "
                                       "(pad every group to get_mk_alignment_for_contiguous_layout())")


@op(plan=_plan, check_data=_check_layout, convert={"config": CONFIG.text})
def deep_gemm_fp8_grouped_gemm(a: torch.Tensor, sfa: torch.Tensor | None, b: torch.Tensor, sfb: torch.Tensor | None,
                               layout: torch.Tensor, out: torch.Tensor, *, masked: bool = False, psum: bool = False,
                               zero_padding: bool = False, config: str = "", validate: bool = True) -> torch.Tensor:
    """Grouped FP8 (or FP8 x FP4) GEMM, NT, with DeepGEMM's block scales, written into ``out``
    (DeepGEMM's d):
        out[m, n] = sum over K blocks kb of sfa[m, kb] * sfb[g, n, kb] * (a[m, kb] . b[g, n, kb])
    with g the group of row m (sfb[g, n, kb]: the scale of n's 128-row block, or of row n).
    BF16 (DeepGEMM's m_grouped_bf16_gemm_*): a and b bf16 with the shapes below, sfa = sfb = None,
    out bf16: out[m, n] = sum_k a[m, k] b[g, n, k] in fp32, each 32-K chunk's exact sum rounded once
    then added (one bf16 MFMA each, in K order), K % 16 == 0.

    Contiguous (masked=False): a [M, K] e4m3, out [M, N], and either
      psum=False: layout = m_indices int32 [M] (group of each row, -1 for padding; each 128-row
        block holds one group's rows then only padding; M % 128 == 0), or
      psum=True: layout = grouped_layout int32 [G], DeepGEMM's psum layout: group g is rows
        align(layout[g-1], 128) .. layout[g] (from 0 for g = 0); each end at least its group's
        start and at most M; G <= 64. Rows between a group's end and the next start, and past the last
        group's aligned end, are padding.
      zero_padding=True: padding rows of out are written as zeros (DeepGEMM 2.6's
        ensure_zero_padding); False leaves them untouched.
    Masked (masked=True): a [G, M_max, K], layout = masked_m int32 [G] (valid rows per group,
    0..M_max), out [G, M_max, N]; rows >= masked_m[g] are not written.
    b [G, N, K] e4m3, or FP4: int8 / uint8 [G, N, K/2], e2m1 two per byte (even K in the low
    nibble, DeepGEMM's per_token_cast_to_fp4 packing), K % 32 == 0.
    Scales, all row-major or MN-major (TMA-aligned: rows unit-stride, columns padded to 4
    elements), K/128 rounded up:
      fp32 (e4m3 b only): sfa [.., M, K/128], sfb [G, ceil(N/128), K/128]; each 128-K block's
        fp32 partial sum promoted exactly: acc += p * (sfa * sfb).
      UE8M0 (hardware scales of the scaled MFMA), bytes (uint8 / float8_e8m0fnu) with the fp32
        shapes, or DeepGEMM's packing of four to an int32 along K (byte i of word j = K block
        4j + i): sfa [.., M, ceil(K/512)], sfb [G, N, ceil(K/512)] (one scale per row of b).
      FP4 b (UE8M0 only): sfa as above (1 x 128), sfb one scale per row of b and 32-K block:
        bytes [G, N, K/32] or packed [G, N, ceil(K/128)]. Each 128-K block is one scaled MFMA
        (exact sum of its scaled products, one fp32 rounding, then the add into acc).
    out bf16 or f16 (RNE; the psum and FP4 forms bf16 only).
    validate: check m_indices / grouped_layout / masked_m before the launch (a sync on a GPU);
    False skips it.
    config: the tile "BM=..,BN=.." (registered: 128x128; 128x64 and 64x128 for bf16 out; 32x32); default: see
    choose_tile. N % 32 == 0 (N % BN); fewer than 2^21 tiles in all.
    K % 16 == 0: a K step is one 128-K scale block; a partial last block (K % 128 != 0, scales
    still ceil(K/128) per row) loads its 16-byte chunks past K as zeros, so the kernel needs K in
    whole chunks. DeepGEMM's M-grouped API likewise sizes scales with ceil(K/128) and does not
    assert K % 128 (its TMA loads zero-fill); its K-grouped GEMMs and its casts
    (per_token_cast_to_fp8) require K % 128.
    """
