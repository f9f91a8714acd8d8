"""DeepGEMM's layout helpers (``deep_gemm.utils.layout``, 2.6) with their AMD meaning.

Scale layouts: mxgemm's kernels read scales in place through strides, row-major or DeepGEMM's
MN-major "TMA-aligned" layout (MN unit-stride, each K column padded to 16 bytes: 4 fp32 or
int32 elements). No TMA exists on AMD; the 16-byte padding is kept so DeepGEMM's tensors and
strides are reproduced exactly. UE8M0 scales may come packed four to an int32 along K (byte i of
word j = K block 4j + i), as DeepGEMM's SM100 kernels take them.

Contiguous-layout alignment: every group of an M-grouped (or K-grouped) contiguous input starts
at a multiple of the alignment. 128 (``get_theoretical_mk_alignment_for_contiguous_layout``) is
what every kernel here serves: each row tile (at most 128 rows) and each 128-K scale block then
belongs to one group.
"""
from __future__ import annotations

import torch

from .. import guards

TILE_ALIGNMENT = 128                # the largest row tile (and the 128-K scale block)
_state = {"mk_alignment": TILE_ALIGNMENT}


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def get_mk_alignment_for_contiguous_layout() -> int:
    """Rows (M-grouped) or K (K-grouped) each group of a contiguous input is padded to."""
    return _state["mk_alignment"]


def set_mk_alignment_for_contiguous_layout(new_value: int) -> None:
    """Set the contiguous-layout alignment: a positive multiple of 32, DeepGEMM's rule. The
    layout helpers follow any such value; a GEMM whose kernel needs more (its row tile or
    128-K scale block) refuses a layout that does not meet it, naming its own rule."""
    if isinstance(new_value, bool) or not isinstance(new_value, int) or new_value <= 0 or new_value % 32:
        guards.fail("alignment", f"set_mk_alignment_for_contiguous_layout({new_value!r}): the alignment must be a "
                                 "positive multiple of 32")
    _state["mk_alignment"] = new_value


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """The alignment the kernels need whatever the group sizes (``expected_m`` is a hint)."""
    return TILE_ALIGNMENT


get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def psum_group_starts(ends, alignment: int) -> list:
    """First rows (or K) of a psum layout's groups: 0, then each previous group's end aligned up."""
    return [0] + [align(int(e), alignment) for e in ends[:-1]]


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """x elements of element_size bytes rounded up to a whole number of 16-byte units."""
    if element_size not in (1, 2, 4, 8):
        guards.fail("element_size", f"element_size = {element_size!r}: 1, 2, 4 or 8 bytes")
    return align(x, 16 // element_size)


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """The same scales [G?, MN, C] in the MN-major layout: MN unit-stride, each column padded to
    16 bytes (``get_tma_aligned_size``), groups one after another."""
    if sf.dim() not in (2, 3):
        guards.fail("shape", f"sf must be [MN, K blocks] or [G, MN, K blocks]; got shape {list(sf.shape)}")
    mn, c = sf.shape[-2:]
    storage = sf.new_zeros(*sf.shape[:-2], c, get_tma_aligned_size(mn, sf.element_size()))
    storage[..., :mn] = sf.transpose(-1, -2)
    return storage[..., :mn].transpose(-1, -2)


def _check_ue8m0_values(sf: torch.Tensor, name: str = "sf") -> None:
    guards.check_dtype(sf, name, torch.float32)
    bits = sf.view(torch.int32)
    if bool(((bits < 0) | (bits & 0x7FFFFF != 0)).any()):
        guards.fail("ue8m0", f"{name} holds values that are not non-negative powers of two (UE8M0 keeps only "
                             "the exponent); cast with use_ue8m0=True")


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """fp32 powers of two [..., 4n] -> their exponent bytes packed four to an int32 [..., n]."""
    if x.shape[-1] % 4:
        guards.fail("shape", f"pack_ue8m0_to_int: the last dimension ({x.shape[-1]}) must be a multiple of 4")
    _check_ue8m0_values(x, "x")
    return (x.contiguous().view(torch.int32) >> 23).to(torch.uint8).view(torch.int32)


def ue8m0_codes(sf: torch.Tensor) -> torch.Tensor:
    """fp32 UE8M0 scales -> e8m0 bytes: the fp32 exponent field, DeepGEMM's UE8M0 cast (exact for
    the powers of two its casts make)."""
    return ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def unpack_ue8m0_from_int(packed_sf: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_ue8m0_to_int: int32 [..., n] -> fp32 powers of two [..., 4n]."""
    return (packed_sf.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)


def _psum_gap_rows(psum_layout: torch.Tensor, rows: int) -> torch.Tensor:
    """Rows of a psum-layout input that belong to no group (between a group's end and the next
    group's aligned start, and after the last group)."""
    ends = psum_layout.to(torch.int64).cpu()
    starts = torch.tensor(psum_group_starts(ends.tolist(), get_mk_alignment_for_contiguous_layout()))
    idx = torch.arange(rows)
    inside = ((idx[:, None] >= starts[None]) & (idx[:, None] < ends[None])).any(dim=1)
    return ~inside


def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor, psum_layout: torch.Tensor | None = None
                                                 ) -> torch.Tensor:
    """fp32 UE8M0 scales [G?, MN, K blocks] -> exponent bytes (the fp32 exponent field, as
    DeepGEMM takes it: exact for powers of two) packed four to an int32 along K
    (missing blocks 0), MN-major TMA-aligned: int32 [G?, MN, ceil(K blocks / 4)]. With
    ``psum_layout`` (int32 [G] group ends of a psum-layout input) the rows between groups get 0."""
    if sf.dim() not in (2, 3):
        guards.fail("shape", f"sf must be [MN, K blocks] or [G, MN, K blocks]; got shape {list(sf.shape)}")
    guards.check_dtype(sf, "sf", torch.float32)
    codes = ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    if psum_layout is not None:
        codes[..., _psum_gap_rows(psum_layout, sf.shape[-2]).to(codes.device), :] = 0
    codes = torch.nn.functional.pad(codes, (0, -codes.shape[-1] % 4))
    return get_mn_major_tma_aligned_tensor(codes.contiguous().view(torch.int32))


def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor, grouped_layout: torch.Tensor, ks_cpu,
                                                          gran_k: int, k_alignment: int,
                                                          use_psum_layout: bool = False) -> torch.Tensor:
    """K-grouped per-channel fp32 UE8M0 scales [sum over groups of ceil(k_g / gran_k), MN] (each
    group's blocks one after another) -> int32 [sum over groups of ceil(k_g / (4 gran_k)), MN]:
    each group's blocks packed four to a word on their own (a group never shares a word).
    Without the psum layout ks_cpu (a list) gives the groups' K. With it, the groups' K come from
    grouped_layout (int32 [G] group ends; group g starts at the end of g - 1 aligned up to
    k_alignment) and ks_cpu, when given, are upper bounds sizing the result (rows past the
    packed groups are 0)."""
    if sf.dim() != 2:
        guards.fail("shape", f"sf must be [K blocks, MN]; got shape {list(sf.shape)}")
    if gran_k not in (32, 128) or k_alignment <= 0 or k_alignment % 32:
        guards.fail("recipe", f"gran_k = {gran_k} (32 or 128), k_alignment = {k_alignment} (a multiple of 32)")
    words = lambda ks: sum(ceil_div(k, 4 * gran_k) for k in ks)   # noqa: E731
    if use_psum_layout:
        ends = grouped_layout.cpu().tolist()
        ks = [e - s for s, e in zip(psum_group_starts(ends, k_alignment), ends)]
        rows = max(words(ks), words(ks_cpu)) if ks_cpu else words(ks)
    elif not ks_cpu:
        guards.fail("ks_cpu", "ks_cpu (the groups' K) is required without the psum layout")
    else:
        ks, rows = list(ks_cpu), words(ks_cpu)
    blocks = [ceil_div(k, gran_k) for k in ks]
    if sum(blocks) > sf.shape[0]:
        guards.fail("shape", f"sf has {sf.shape[0]} K-block rows; the groups' K {ks} need {sum(blocks)}")
    out = sf.new_zeros(rows, sf.shape[1], dtype=torch.int32)
    packed = [get_mn_major_tma_aligned_packed_ue8m0_tensor(s.t()).t() for s in sf[:sum(blocks)].split(blocks) if len(s)]
    if packed:
        done = torch.cat(packed)
        out[:len(done)] = done
    return out


def transform_sf_into_required_layout(sf: torch.Tensor, mn: int, k: int, recipe, num_groups: int | None = None,
                                      is_sfa: bool | None = None, disable_ue8m0_cast: bool = False,
                                      psum_layout: torch.Tensor | None = None) -> torch.Tensor:
    """Scales in the layout mxgemm's kernels read. ``recipe``: (gran_m, gran_n, gran_k) with
    ``is_sfa`` choosing gran_m or gran_n, or (gran_mn, gran_k). fp32 (1, 128) scales become
    MN-major TMA-aligned fp32 (exact software promotion, as DeepGEMM's SM90 kernels);
    fp32 (128, 128) scales are checked and returned; fp32 scales with gran_k 32 (FP4 operands,
    which only the scaled MFMA's hardware scales serve) are packed to UE8M0 int32 (broadcast to
    one per row first); packed int32 (1, 32 | 128) scales are checked and returned."""
    recipe = tuple(recipe)
    if len(recipe) == 3:
        if is_sfa is None:
            guards.fail("recipe", f"recipe {recipe} has three entries: is_sfa must say whether sf is sfa or sfb")
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    elif len(recipe) == 2:
        gran_mn, gran_k = recipe
    else:
        guards.fail("recipe", f"recipe {recipe}: (gran_m, gran_n, gran_k) or (gran_mn, gran_k)")
    packed = sf.dtype == torch.int32
    guards.check_dtype(sf, "sf", (torch.float32, torch.int32))
    lead = () if num_groups is None else (num_groups,)
    cols = ceil_div(k, gran_k * (4 if packed else 1))
    guards.check_shape(sf, "sf", (*lead, ceil_div(mn, gran_mn), cols))
    if not packed and gran_k == 128 and gran_mn == 1:
        return get_mn_major_tma_aligned_tensor(sf)
    if not packed and gran_k == 128 and gran_mn == 128:
        return sf
    if not packed and gran_k == 32:
        if disable_ue8m0_cast:
            guards.fail("recipe", f"gran_k 32 scales are hardware (UE8M0) scales: disable_ue8m0_cast=True cannot "
                                  f"keep them fp32 (recipe {recipe})")
        rows = sf if gran_mn == 1 else sf.repeat_interleave(gran_mn, dim=-2)[..., :mn, :]
        return get_mn_major_tma_aligned_packed_ue8m0_tensor(rows, psum_layout)
    if packed and gran_mn == 1 and gran_k in (32, 128):
        return sf
    guards.fail("recipe", f"no scale layout for dtype {sf.dtype} with recipe {recipe} "
                          f"(gran_mn {gran_mn}, gran_k {gran_k})")
