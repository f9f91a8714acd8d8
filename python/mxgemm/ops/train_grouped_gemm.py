"""FP8 grouped GEMM for MoE training: forward / dgrad (groups along the rows of a) and
variable-K wgrad (groups along the contraction), one FlyDSL kernel family
(flydsl_kernels/train_grouped_gemm.py; bit-exact model: mxgemm.reference.grouped_gemm_fp8_ref /
grouped_gemm_fp8_variable_k_ref), with fp32 scales of three granularities, told apart by the
scale tensors' shapes (``granularity=`` names one where shapes alone are ambiguous), or e8m0
(uint8 / float8_e8m0fnu) MX scales, told apart by their dtype:

  granularity  grouped_gemm_fp8_kernel (out [R, N], R = a's rows)   grouped_gemm_fp8_variable_k (out [G, M, N])
  tensor       a_scale, b_scale: one value each (shape [] or [1])  the same
  row          a_scale [R] (per out row), b_scale [G, N]            a_scale [M] or [G, M], b_scale [N] or [G, N]
  block        a_scale [R, ceil(K/128)],                             a_scale [ceil(sum_k/128), M],
               b_scale [G, ceil(N/128), ceil(K/128)] (128x128)       b_scale [ceil(sum_k/128), ceil(N/128)] (128x128)
               or [G, N, ceil(K/128)] (one per column)               or [ceil(sum_k/128), N] (one per column)
  mx           a_scale [R, K/32], b_scale [G, N, K/32] (e8m0;        a_scale [M, ceil(sum_k/32)], b_scale
               K % 32 == 0)                                          [N, ceil(sum_k/32)] (e8m0)

Scale tensors are read in place through their strides (any strides: row-major, or MN-major as
DeepGEMM's TMA-aligned scales [.., ceil(K/128)] with unit row stride and a padded column
stride); every element offset times 4 must stay below 2^31. Block scales are promoted per
128-wide contraction block (acc += fp32 block sum * fp32(sa * sb)); the variable-K wgrad then
needs every non-empty group to start on a multiple of 128 (DeepGEMM's K-grouped rule): its
block index is global, (group_offs[g] + c) / 128. Tensorwise and row scales multiply the fp32
accumulator once in the epilogue. MX scales (MXFP8, Primus-Turbo's MX_BLOCKWISE: per 32
contraction elements of each out row and column, the wgrad's along sum_k as Primus-Turbo's
column-quantised operands carry them) are applied by the scaled MFMA inside each 128-wide chunk's
exact sum; the wgrad's non-empty groups start on multiples of 32 (global block index).

BF16: grouped_gemm_bf16_kernel / grouped_gemm_bf16_variable_k are the same two ops with bf16 a
and b and no scales (the kernel's FMT=bf16 variants; model: mxgemm.reference.grouped_gemm_bf16_ref
/ grouped_gemm_bf16_variable_k_ref); they share this module's planners, guards and group checks.
They run fp16 a and b too (both one dtype; the FMT=f16 variants, v_mfma_f32_16x16x32_f16, 64 x 64:
NT, NN and TN in fp16, TN accumulating into fp32), out in the operands' dtype by default.

Config space (every config gives the same bits; they differ in speed only): the tile BM x BN (a
registered variant), GROUP_M (row tiles per band of the tile order sharing a B column tile) and
PERSISTENT (0: one workgroup per possible tile; p > 0: a persistent grid of p workgroups per CU,
each looping over tiles). A call's config (``mxgemm.explain`` prints it): the caller's
``config``, else the tuned table row of its problem (python/mxgemm/configs/, written by
op_tests/tune_grouped_gemm_fp8.py), else ``heuristic_config``. ``num_cu`` always caps the grid.
"""
from __future__ import annotations

import functools

import torch

from .. import formats, guards, quant, registry, tuned
from ._op import E8M0, NUM_CUS, Choice, ConfigGrammar, Plan, empty_plan, kernel_plan, op

_KERNEL = "train_grouped_gemm"
_FACTS = registry.get(_KERNEL)
_FMT = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_FP4 = (torch.uint8, torch.float4_e2m1fn_x2)   # packed e2m1: two elements per byte, element 2i in the low nibble
_HALF = {torch.bfloat16: "bf16", torch.float16: "f16"}   # the unscaled ops' operands (one dtype for a and b)
# variant FMT of an operand dtype (bf16 / fp16: the unscaled ops; uint8 / float4_e2m1fn_x2: the fp4 ops' packed e2m1)
_FORMATS = {**_FMT, **_HALF, **dict.fromkeys(_FP4, "e2m1")}
_OUT = {torch.bfloat16: "bf16", torch.float16: "f16"}
_OUT_WGRAD = {**_OUT, torch.float32: "f32"}   # fp32 out and accumulation (the wgrad; the rows' e4m3 variants)
GRANULARITIES = ("tensor", "row", "block", "mx")
MX_BLOCK = 32              # mx scales: one e8m0 byte per 32 contraction elements
SCALE_BLOCK = 128          # block scales: one per 128 contraction elements (and per 128 columns of b, or one)
_MAX_ROWS = 1 << 31       # row counts and group offsets are i32 inside the kernel
_VOFFSET_ROWS = 256       # a tile's 32-bit buffer offsets span up to max(BM, BN, 128) row strides
ARCH, = _FACTS.archs         # the one arch the tuned table is for
CONFIG_CSV = tuned.table_path(_KERNEL, ARCH)
KEY = ("layout", "G", "M", "N", "K")             # a tuned problem (see problem_key)
CONFIG = ("BM", "BN", "GROUP_M", "PERSISTENT")   # a config
# a tuner's row: the config and its time; simulated rows also carry the runner-up's and the peer's
CSV_FIELDS = (*KEY, *CONFIG, "us", "source", "runner_up", "runner_up_us", "peer_us")
GROUP_MS = (1, 2, 4, 8)
PERSISTENT = (0, 1, 2)
CONFIG_GRAMMAR = ConfigGrammar("grouped_gemm_fp8", dict.fromkeys(CONFIG, int), required=True)


def group_offsets(group_lens) -> torch.Tensor:
    """[0, cumsum(group_lens)] as int64, on group_lens' device."""
    if not isinstance(group_lens, torch.Tensor):
        guards.fail("type", f"group_lens must be a torch.Tensor (int64 [G]); got {type(group_lens).__name__}")
    lens = group_lens.reshape(-1).to(torch.int64)   # a malformed group_lens meets its guard in the planner
    return torch.cat([lens.new_zeros(1), lens.cumsum(0)])


def _scaled(x) -> bool:
    """An fp8 call (scales given) or a bf16 one (the bf16 ops have no scale parameters)."""
    return hasattr(x, "a_scale")


def _check_operands(x, names_2d, b_dim, outs=_OUT, fmt_dtypes=None):
    """Dtypes, ranks, contiguity and device of an fp8 call (fp8 a, b and fp32 scales), a bf16 /
    fp16 one (a and b of one dtype) or, fmt_dtypes given, one with a and b of those dtypes."""
    scaled = _scaled(x)
    fmt_dtypes = fmt_dtypes or (tuple(_FMT) if scaled else tuple(_HALF))
    guards.check_dtype(x.a, "a", fmt_dtypes)
    guards.check_dtype(x.b, "b", fmt_dtypes)
    if x.a.dtype in _HALF and x.a.dtype != x.b.dtype:
        guards.fail("dtype", f"a is {x.a.dtype} and b {x.b.dtype}: the unscaled ops take both operands in one dtype, "
                             f"{' or '.join(map(str, _HALF))}")
    for n in ("a_scale", "b_scale") if scaled else ():
        guards.check_dtype(getattr(x, n), n, (torch.float32, *E8M0))
    if scaled and (x.a_scale.dtype in E8M0) != (x.b_scale.dtype in E8M0):
        guards.fail("dtype", f"a_scale is {x.a_scale.dtype} and b_scale {x.b_scale.dtype}: both fp32 or both e8m0 "
                             f"(granularity mx)")
    guards.check_dtype(x.group_lens, "group_lens", torch.int64)
    guards.check_dtype(x.group_offs, "group_offs", torch.int64)
    if x.out_dtype not in outs:
        guards.fail("dtype", f"out_dtype is {x.out_dtype}; expected {' or '.join(map(str, outs))}")
    if x.a.dim() != 2:
        guards.fail("shape", f"a must be 2-D {names_2d}; got shape {list(x.a.shape)}")
    if x.b.dim() != b_dim:
        guards.fail("shape", f"b must be {b_dim}-D; got shape {list(x.b.shape)}")
    if x.group_lens.dim() != 1:
        guards.fail("shape", f"group_lens must be 1-D [G]; got shape {list(x.group_lens.shape)}")
    G = x.group_lens.shape[0]
    guards.check_shape(x.group_offs, "group_offs", (G + 1,))
    named = dict(a=x.a, a_scale=getattr(x, "a_scale", None), b=x.b, b_scale=getattr(x, "b_scale", None),
                 group_lens=x.group_lens, group_offs=x.group_offs, out=x.out)
    for n, t in named.items():
        if t is not None and n not in ("a_scale", "b_scale"):   # scales are read through their strides
            guards.check_contiguous(t, n)
    return G, guards.check_same_device(**named)


_STRIDES = ("sa_sg", "sa_si", "sa_sk", "sb_sg", "sb_sj", "sb_sk", "sb_shift")


def _scale_strides(x, forms: dict) -> tuple:
    """(granularity, the kernel's scale arguments) of a call. forms: granularity -> (the shapes
    a_scale may have, those b_scale may have, a function of the two tensors giving the kernel's
    byte strides). The granularity is the one whose shapes fit (or x.granularity, which must).
    A bf16 call: "none", null scale pointers and zero strides (the kernel reads no scale)."""
    if not _scaled(x):
        return "none", dict(a_scale=None, b_scale=None, **dict.fromkeys(_STRIDES, 0))
    granularity = getattr(x, "granularity", None)   # the fp4 ops have mx scales only
    if granularity is not None and granularity not in GRANULARITIES:
        guards.fail("granularity", f"granularity = {granularity!r}; expected None (from the scales' shapes) or one "
                                   f"of {', '.join(map(repr, GRANULARITIES))}")
    sa, sb = x.a_scale, x.b_scale
    mx = sa.dtype in E8M0       # e8m0 scales are mx scales, fp32 ones any other granularity
    if granularity and (granularity == "mx") != mx:
        guards.fail("dtype", f"granularity = {granularity!r} with a_scale {sa.dtype}: mx takes e8m0 scales "
                             f"({' or '.join(map(str, E8M0))}), the others fp32")
    forms = {g: f for g, f in forms.items() if (g == "mx") == mx}
    fit = lambda t, shapes: tuple(t.shape) in shapes  # noqa: E731
    fits = [g for g, (a_shapes, b_shapes, _) in forms.items() if fit(sa, a_shapes) and fit(sb, b_shapes)]
    want = [granularity] if granularity else list(forms)
    shapes = "; ".join(f"{g}: a_scale {' or '.join(map(str, map(list, f[0])))}, b_scale "
                       f"{' or '.join(map(str, map(list, f[1])))}" for g, f in forms.items() if g in want)
    chosen = [g for g in fits if g in want]
    if not chosen:
        guards.fail("scale-shape", f"a_scale {list(sa.shape)} and b_scale {list(sb.shape)} fit no "
                                   f"{granularity or 'scale'} granularity of this call; expected {shapes}")
    if len(chosen) > 1:
        guards.fail("granularity", f"a_scale {list(sa.shape)} and b_scale {list(sb.shape)} fit both "
                                   f"{' and '.join(chosen)} scales: pass granularity=")
    gran = chosen[0]
    for n, t in (("a_scale", sa), ("b_scale", sb)):
        last = t.element_size() * sum((d - 1) * st for d, st in zip(t.shape, t.stride()) if d)
        if t.numel() and last + t.element_size() > guards.VOFFSET_LIMIT:
            guards.fail("2GB-voffset", f"{n}'s last element lies {last} bytes from its first: the kernel's "
                                       f"scale offsets must stay below 2^31")
    return gran, dict(zip(_STRIDES, forms[gran][2](sa, sb)))


def _bytes(t, dim):
    return t.element_size() * t.stride(dim)


_TENSORWISE = (0,) * 7
_ONE = ((1,), ())


def _row_shift(sb, n):
    """sb_shift of block scales b_scale [.., n or ceil(n / 128), ..] (dim 1): one per column or per 128."""
    return 0 if sb.shape[1] == n else 7


def _rows_forms(R, G, N, K) -> dict:
    """Scale shapes and kernel strides of grouped_gemm_fp8_kernel (module docstring table)."""
    kb, nb, kx = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK), -(-K // MX_BLOCK)
    return {"tensor": (_ONE, _ONE, lambda sa, sb: _TENSORWISE),
            "row": (((R,),), ((G, N),), lambda sa, sb: (0, _bytes(sa, 0), 0, _bytes(sb, 0), _bytes(sb, 1), 0, 0)),
            "block": (((R, kb),), ((G, nb, kb), (G, N, kb)),
                      lambda sa, sb: (0, _bytes(sa, 0), _bytes(sa, 1), _bytes(sb, 0), _bytes(sb, 1), _bytes(sb, 2),
                                      _row_shift(sb, N))),
            "mx": (((R, kx),), ((G, N, kx),),
                   lambda sa, sb: (0, _bytes(sa, 0), _bytes(sa, 1), _bytes(sb, 0), _bytes(sb, 1), _bytes(sb, 2), 0))}


def _variable_k_forms(G, M, N, sum_k) -> dict:
    """Scale shapes and kernel strides of grouped_gemm_fp8_variable_k (module docstring table)."""
    kb, nb = -(-sum_k // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    per_group = lambda t: (_bytes(t, 0) if t.dim() == 2 else 0, _bytes(t, -1))  # noqa: E731   [G, X] or [X]
    return {"tensor": (_ONE, _ONE, lambda sa, sb: _TENSORWISE),
            "row": (((M,), (G, M)), ((N,), (G, N)),
                    lambda sa, sb: (*per_group(sa), 0, *per_group(sb), 0, 0)),
            "block": (((kb, M),), ((kb, nb), (kb, N)),
                      lambda sa, sb: (0, _bytes(sa, 1), _bytes(sa, 0), 0, _bytes(sb, 1), _bytes(sb, 0),
                                      _row_shift(sb, N))),
            "mx": (((M, -(-sum_k // MX_BLOCK)),), ((N, -(-sum_k // MX_BLOCK)),),
                   lambda sa, sb: (0, _bytes(sa, 0), _bytes(sa, 1), 0, _bytes(sb, 0), _bytes(sb, 1), 0))}


def _check_out(x, shape):
    if x.out is not None:
        guards.check_dtype(x.out, "out", x.out_dtype)
        guards.check_shape(x.out, "out", shape)


def _check_sizes(rows, rows_name, strides):
    """Row counts fit i32; every tile's buffer offsets (rows x row stride bytes) stay below 2^31."""
    if rows >= _MAX_ROWS:
        guards.fail("shape", f"{rows_name} = {rows} rows; the kernel counts rows in int32 (< 2^31)")
    for name, stride in strides.items():
        if _VOFFSET_ROWS * stride >= guards.VOFFSET_LIMIT:
            guards.fail("2GB-voffset", f"{name} rows are {stride} bytes: {_VOFFSET_ROWS} of them must span "
                                       f"< 2^31 bytes (one tile's buffer offsets)")


def _wide_columns(tiles) -> tuple:
    """The column widths of the 256-row tiles whose operands reach LDS by DMA (wider than 128)."""
    return tuple(sorted(bn for bm, bn in tiles if bm == 256 and bn > 128))


def _tensorwise_tiles(layout) -> list:
    """(BM, BN) of the layout's e4m3 -> bf16 tensorwise variants, smallest first."""
    return sorted({(v["BM"], v["BN"]) for v in _FACTS.variants if v["LAYOUT"] == layout and "GRAN" not in v
                   and (v["FMT"], v["FMT_B"], v["OUT"]) == ("e4m3", "e4m3", "bf16")}, key=lambda t: t[0] * t[1])


def heuristic_config(layout: str, G: int, M: int, N: int, out_dtype=torch.bfloat16, wide=None) -> dict:
    """The rule used without a tuned row (wide: the column widths of the call's 256-row DMA tiles;
    default: those of the layout's e4m3 -> bf16 variants; only e4m3 tensorwise / row-scaled to bf16
    have them: NT 192, 224 and 256, NN and TN 256): 64 x 64 tiles for fp16 output (its only
    registered tile) or when the output columns or the rows per group (M / G; the wgrad's M) are
    under 128. Otherwise, on the timing model (8 groups of 512 rows, XCD 0's share, whole contraction):
    - a 256-row DMA tile (one workgroup per CU) at 256 rows per group and 256 columns when 256 x 256
      tiles make at least 3/4 of a tile per CU (group sizes taken as balanced): half the L2 reads of
      128 x 128 per output. gpt-oss Down (N = K = 2880) forward 45.72 us at 256 x 256 against 55.52
      at 128 x 128 (192 tiles), dgrad 43.22 against 58.38, wgrad 71.71 against 96.96 at 256 x 128;
      DeepSeek-V3 Down (N 7168, K 2048) forward 58.64 against 65.97, wgrad 98.38 against 136.73 at
      256 x 128; its dgrad's 128 tiles took 79.77 against 60.45 at 128 x 128. Of the widths, the one
      whose rounds of tiles over the CUs cost least, a tile costing its width (the widest of equals):
      the gpt-oss forward 38.29 us at 256 x 192 (240 tiles, one round of width 192) against 41.77 at
      256 x 256, the DeepSeek-V3 forward 49.35 at 256 x 224 (512 tiles, two rounds) against 53.21 at
      256 x 256 (448 tiles, two rounds of 256); two DMA steps in flight in both.
      Persistent (``PERSISTENT=1``) for the rows layouts, whose grid of one workgroup per possible
      tile over-provisions a row tile per group (the host cannot size it without reading
      group_lens), and for the wgrad: its tiles in a row per CU took gpt-oss Down 65.50 us against
      71.71 one workgroup per tile, DeepSeek-V3 Down 96.62 against 98.38 (the tuner's runs, after
      which the rule was changed) and Qwen3-235B Down 110.12 against 118.88 (held out);
    - otherwise the rows layouts (NT, NN, TT): 128 x 128 on a persistent grid of the two workgroups a
      CU holds (``PERSISTENT=2``): gpt-oss Down forward 55.52 us, 256 x 128 (8 waves) 59.28;
    - otherwise the wgrad: 256 x 128 once the rows reach 256, else 128 x 128, one workgroup per tile
      (gpt-oss Down wgrad: 256 x 128 96.96 us, 128 x 128 99.53).
    GROUP_M = 2: a band of two row tiles re-reads each B column tile from L2."""
    variable_k = layout in ("TN", "NTK")
    rows = M if variable_k else M // max(G, 1)
    if out_dtype == torch.float16 or N < 128 or rows < 128:
        return dict(BM=64, BN=64, GROUP_M=2, PERSISTENT=0)
    if wide is None:
        wide = _wide_columns(_tensorwise_tiles(layout))
    tiles = lambda bn: G * -(-rows // 256) * -(-N // bn)   # noqa: E731
    fills = rows >= 256 and N >= 256 and 4 * tiles(256) >= 3 * NUM_CUS
    bn = min(wide, key=lambda bn: (-(-tiles(bn) // NUM_CUS) * bn, -bn)) if wide and fills else None
    if not variable_k:
        return dict(BM=256, BN=bn, GROUP_M=2, PERSISTENT=1) if bn else dict(BM=128, BN=128, GROUP_M=2, PERSISTENT=2)
    return dict(BM=256 if rows >= 256 else 128, BN=bn or 128, GROUP_M=2, PERSISTENT=1 if bn else 0)


def candidates(layout: str, G: int, M: int, N: int) -> list:
    """The configs a tuner times for an e4m3 -> bf16 tensorwise problem: the heuristic's, and each
    config one parameter away from it (every registered tile of the layout, every PERSISTENT,
    GROUP_M 1 and 4) - a walk around the rule, not the whole space (its 72 NT configs take over an
    hour of the model per shape). 64 x 64 is left out where the rows per group and the columns
    reach 128: it is the rule's tile only below that, and its many workgroups are slow to simulate."""
    rule = heuristic_config(layout, G, M, N)
    rows = M if layout in ("TN", "NTK") else M // max(G, 1)
    small = min(rows, N) < 128 or (rule["BM"], rule["BN"]) == (64, 64)
    out = [rule]
    out += [dict(rule, BM=bm, BN=bn) for bm, bn in _tensorwise_tiles(layout) if (bm, bn) != (64, 64) or small]
    out += [dict(rule, PERSISTENT=p) for p in PERSISTENT]
    out += [dict(rule, GROUP_M=g) for g in (1, 4)]
    return [dict(c) for c in dict.fromkeys(tuple(c.items()) for c in out)]


def problem_key(layout: str, G: int, M: int, N: int, K: int) -> tuple:
    """The tuned table's key: M = rows of a (sum_m) for NT / NN, the output rows for TN, where
    K = sum_k; N the output columns. Problems differing only in their split share a row."""
    return layout, G, M, N, K


@functools.lru_cache(maxsize=4)
def tuned_table(path=None) -> dict:
    """{problem_key: (config, source)} of the tuned table (default CONFIG_CSV). Read once."""
    return {problem_key(r["layout"], *(int(r[k]) for k in KEY[1:])): ({k: int(r[k]) for k in CONFIG}, r["source"])
            for r in tuned.read_rows(path or CONFIG_CSV)}


def _variant(layout, a_dtype, b_dtype, out_dtype, cfg, accumulate=False, gran="tensor"):
    """The registered variant of a config, or None. Tensorwise and row scales share the variants
    without a GRAN key (stride-0 scales are one scale); block scales have GRAN=block."""
    want = dict(LAYOUT=layout, FMT=_FORMATS[a_dtype], FMT_B=_FORMATS[b_dtype], OUT=_OUT_WGRAD[out_dtype], BM=cfg["BM"],
                BN=cfg["BN"])
    if accumulate or out_dtype == torch.float32:   # the variants that have an ACCUM key
        want["ACCUM"] = int(accumulate)
    if gran in ("block", "mx"):
        want["GRAN"] = gran
    return want if want in _FACTS.variants else None


def _call_variant(layout, x, cfg, gran):
    """The registered variant of a config for call ``x`` (its formats, output, accumulation,
    scale granularity), or None."""
    return _variant(layout, x.a.dtype, x.b.dtype, x.out_dtype, cfg, getattr(x, "accumulate", False), gran)


def parse_config(config) -> dict | None:
    """A caller's config, "BM=128,BN=128,GROUP_M=4,PERSISTENT=1" or the same as a dict (all four
    keys), as a dict; None for ""."""
    cfg = CONFIG_GRAMMAR.parse(config)
    if cfg is not None and (cfg["GROUP_M"] not in GROUP_MS or cfg["PERSISTENT"] not in PERSISTENT):
        guards.fail("config", f"config {cfg}: GROUP_M in {GROUP_MS}, PERSISTENT in {PERSISTENT}")
    return cfg


def _registered_tiles(layout, x, gran) -> list:
    """(BM, BN) of the variants registered for the call's layout, formats, output and scales, smallest first."""
    return sorted({(v["BM"], v["BN"]) for v in _FACTS.variants if _call_variant(layout, x, v, gran)},
                  key=lambda t: t[0] * t[1])


def _tiles_str(tiles) -> str:
    return ", ".join(f"{bm} x {bn}" for bm, bn in tiles) or "none"


def choose_config(x, layout, G, M, N, K, table=None, gran="tensor"):
    """The Choice for a call (options: GROUP_M, PERSISTENT): the caller's config, else the tuned row
    of its problem if its tile is registered for the call's formats and scales, else the heuristic."""
    forced = parse_config(x.config)
    if forced is not None:
        variant = _call_variant(layout, x, forced, gran)
        if variant is None:
            guards.fail("config", f"no registered {layout} {_FORMATS[x.a.dtype]} x {_FORMATS[x.b.dtype]} -> "
                                  f"{_OUT_WGRAD[x.out_dtype]} variant{_BLOCK_NOTE[gran]} with {forced['BM']} x "
                                  f"{forced['BN']} tiles; registered tiles: "
                                  f"{_tiles_str(_registered_tiles(layout, x, gran))}")
        return _choice(variant, forced, "config given by the caller")
    row = (tuned_table() if table is None else table).get(problem_key(layout, G, M, N, K))
    if row is not None and _call_variant(layout, x, row[0], gran) is not None:
        return _choice(_call_variant(layout, x, row[0], gran), row[0],
                       f"tuned table row (source={row[1]})")
    tiles = _registered_tiles(layout, x, gran)
    cfg = heuristic_config(layout, G, M, N, x.out_dtype, wide=_wide_columns(tiles))
    fit = [t for t in tiles if t[0] * t[1] <= cfg["BM"] * cfg["BN"]]
    if not fit:
        block = dict(GRAN=gran) if gran in ("block", "mx") else {}
        have = sorted({f"{v['FMT']} x {v['FMT_B']} -> {v['OUT']}{' (accumulate)' if v.get('ACCUM') else ''}"
                       for v in _FACTS.variants if v["LAYOUT"] == layout and v.get("GRAN") == block.get("GRAN")
                       and (v["FMT"] in _HALF.values()) == (gran == "none")})
        acc = " accumulating into out" if getattr(x, "accumulate", False) else ""
        guards.fail("dtype", f"no {layout} variant{_BLOCK_NOTE[gran]} for a {x.a.dtype} x b {x.b.dtype} -> "
                             f"{x.out_dtype}{acc}; registered for "
                             f"{layout}{_BLOCK_NOTE[gran]}: {', '.join(have) or 'none'}")
    cfg = dict(cfg, BM=fit[-1][0], BN=fit[-1][1])   # mixed formats have fewer tiles: the largest not above the rule's
    return _choice(_call_variant(layout, x, cfg, gran), cfg, "heuristic")


_BLOCK_NOTE = {"tensor": "", "row": "", "block": " with block scales", "mx": " with mx scales", "none": ""}


def _choice(variant, cfg, why) -> Choice:
    return Choice(_KERNEL, variant, why, {k: cfg[k] for k in ("GROUP_M", "PERSISTENT")})


def _grid(options, tiles, num_cu):
    """Workgroups: one per possible tile, or a persistent grid (PERSISTENT per CU, or num_cu)."""
    if num_cu is not None:
        return min(tiles, num_cu), f"persistent grid of {min(tiles, num_cu)} workgroups (num_cu)"
    if options["PERSISTENT"]:
        g = min(tiles, NUM_CUS * options["PERSISTENT"])
        return g, f"persistent grid of {g} workgroups ({options['PERSISTENT']} per CU)"
    return tiles, f"{tiles} workgroups (one per possible tile)"


_GRAN_NOTE = {"tensor": "tensor scales", "row": "row scales", "block": "block scales", "mx": "mx (e8m0 1x32) scales",
              "none": "bf16 (no scales)"}


def _plan_rows(x) -> Plan:
    G, device = _check_operands(x, "[sum_m, K] ([K, sum_m] with trans_a)", 3, _OUT_WGRAD)
    if x.accumulate and x.out is None:
        guards.fail("accumulate", "accumulate=True adds the product into out: pass out ([sum_m, N] of out_dtype)")
    if x.trans_a and not x.trans_b:
        guards.fail("layout", "trans_a=True (a [K, sum_m]) takes b as [G, N, K] (trans_b=True) only: the layouts are "
                              "NT, NN and TT")
    K, sum_m = x.a.shape if x.trans_a else x.a.shape[::-1]
    if x.trans_b:
        N, kb = x.b.shape[1], x.b.shape[2]
        b_form = "[G, N, K] (trans_b=True)"
    else:
        kb, N = x.b.shape[1], x.b.shape[2]
        b_form = "[G, K, N] (trans_b=False)"
    if kb != K:
        guards.fail("shape", f"b has K = {kb} (shape {list(x.b.shape)}, {b_form}) but a has K = {K} "
                             f"(shape {list(x.a.shape)}{', trans_a' if x.trans_a else ''})")
    if x.b.shape[0] != G:
        guards.fail("shape", f"b holds {x.b.shape[0]} groups (shape {list(x.b.shape)}) but group_lens has {G}")
    guards.check_multiple(K, "K", _FACTS.k_align, f"K%{_FACTS.k_align}")
    guards.check_multiple(N, "N", _FACTS.n_align, f"N%{_FACTS.n_align}")
    if x.trans_a:   # a's rows are read in 16-byte chunks along sum_m
        guards.check_multiple(sum_m, "sum_m (a.shape[1], trans_a)", 16, "sum_m%16")
    _check_out(x, (sum_m, N))
    gran, strides = _scale_strides(x, _rows_forms(sum_m, G, N, K))
    if gran == "mx":   # whole 32-blocks: a block's byte also covers the elements past K
        guards.check_multiple(K, "K", MX_BLOCK, f"K%{MX_BLOCK}")
    es, esize = x.a.element_size(), x.out_dtype.itemsize
    _check_sizes(sum_m, "sum_m", dict(a=es * (sum_m if x.trans_a else K), b=es * (K if x.trans_b else N),
                                      out=esize * N))
    if x.num_cu is not None and x.num_cu < 1:
        guards.fail("num_cu", f"num_cu = {x.num_cu}; expected None or >= 1")
    name = "grouped_gemm_fp8_kernel" if _scaled(x) else "grouped_gemm_bf16_kernel"
    shape = dict(out_shape=(sum_m, N), out_dtype=x.out_dtype)
    if sum_m == 0 or N == 0:
        return empty_plan(name, **shape)
    layout = ("TT" if x.trans_a else "NT") if x.trans_b else "NN"
    choice = choose_config(x, layout, G, sum_m, N, K, gran=gran)
    variant, cfg, source = choice.variant, choice.options, choice.why
    bm, bn = variant["BM"], variant["BN"]
    # tiles without reading group_lens on the host: sum_g ceil(len_g / BM) <= ceil(sum_m / BM) + G
    grid, grid_why = _grid(cfg, (-(-sum_m // bm) + G) * -(-N // bn), x.num_cu)
    what = {"NT": "forward (NT)", "NN": "dgrad (NN)", "TT": "TT (a MN-major)"}[layout]
    why = (f"{what}, {_GRAN_NOTE[gran]}, {bm} x {bn} tiles for {sum_m} rows over {G} groups, "
           f"GROUP_M={cfg['GROUP_M']}, {grid_why}; config: {source}")
    return kernel_plan(name, _KERNEL, variant, device, why, **shape,
                       grid=grid, G=G, M=sum_m, N=N, K=K, group_m=cfg["GROUP_M"], **strides)


def _plan_variable_k(x) -> Plan:
    G, device = _check_operands(x, "[sum_k, M]", 2, _OUT_WGRAD)
    if x.accumulate and x.out is None:
        guards.fail("accumulate", "accumulate=True adds the product into out: pass out ([G, M, N] of out_dtype)")
    sum_k, M = x.a.shape
    if x.b.shape[0] != sum_k:
        guards.fail("shape", f"b has {x.b.shape[0]} contraction rows (shape {list(x.b.shape)}) but a has "
                             f"{sum_k} (shape {list(x.a.shape)}): both are [sum_k, *]")
    N = x.b.shape[1]
    guards.check_multiple(M, "M", _FACTS.n_align, f"M%{_FACTS.n_align}")
    guards.check_multiple(N, "N", _FACTS.n_align, f"N%{_FACTS.n_align}")
    _check_out(x, (G, M, N))
    gran, strides = _scale_strides(x, _variable_k_forms(G, M, N, sum_k))
    es = x.a.element_size()
    _check_sizes(sum_k, "sum_k", dict(a=es * M, b=es * N, out=x.out_dtype.itemsize * N))
    name = "grouped_gemm_fp8_variable_k" if _scaled(x) else "grouped_gemm_bf16_variable_k"
    shape = dict(out_shape=(G, M, N), out_dtype=x.out_dtype)
    if G * M * N == 0:
        return empty_plan(name, **shape)
    choice = choose_config(x, "TN", G, M, N, sum_k, gran=gran)
    variant, cfg, source = choice.variant, choice.options, choice.why
    bm, bn = variant["BM"], variant["BN"]
    grid, grid_why = _grid(cfg, G * -(-M // bm) * -(-N // bn), None)
    return kernel_plan(name, _KERNEL, variant, device,
                       f"variable-K wgrad (TN), {_GRAN_NOTE[gran]}, {bm} x {bn} tiles (G x tiles of [M, N]), "
                       f"GROUP_M={cfg['GROUP_M']}, {grid_why}; config: {source}", **shape, grid=grid, G=G, M=M, N=N,
                       K=sum_k, group_m=cfg["GROUP_M"], **strides)


def _check_groups(x, plan) -> None:
    """group_lens non-negative, summing to at most the grouped dimension (the rest is a padded
    tail); group_offs its prefix sums from 0; TT: groups start on multiples of 16; the wgrad with
    block scales: non-empty groups start on multiples of 128."""
    rows_op = plan.op in ("grouped_gemm_fp8_kernel", "grouped_gemm_bf16_kernel")
    rows = x.a.shape[1] if rows_op and x.trans_a else x.a.shape[0]
    what = ("a.shape[1] (sum_m)" if x.trans_a else "a.shape[0] (sum_m)") if rows_op else "a.shape[0] (sum_k)"
    lens, offs = _check_lens(x, rows, what)
    layout, align = (plan.variant or {}).get("LAYOUT"), None
    if layout == "TT":
        align, why = 16, "TT reads a's rows in 16-byte chunks along sum_m"
    elif layout == "TN" and plan.variant.get("GRAN") == "block":
        align, why = SCALE_BLOCK, "block scales of the wgrad are per 128 rows of sum_k (DeepGEMM's K-grouped rule)"
    elif layout == "TN" and plan.variant.get("GRAN") == "mx":
        align, why = MX_BLOCK, "mx scales of the wgrad are per 32 rows of sum_k"
    if align:
        bad = ((offs[:-1] % align != 0) & (lens > 0)).nonzero()
        if len(bad):
            g = int(bad[0])
            guards.fail("group_offs", f"group {g} starts at row {int(offs[g])}, not a multiple of {align}: {why}")


def _check_lens(x, rows, what):
    """(group_lens, group_offs) on the host: lens non-negative, summing to at most ``rows`` (the
    grouped dimension, named ``what``), offs their prefix sums from 0."""
    lens, offs = x.group_lens.cpu(), x.group_offs.cpu()
    if lens.numel() and int(lens.min()) < 0:
        g = int((lens < 0).nonzero()[0])
        guards.fail("group_lens", f"group_lens[{g}] = {int(lens[g])} is negative")
    if int(lens.sum()) > rows:
        guards.fail("group_lens", f"group_lens sums to {int(lens.sum())}, more than {what} = {rows}")
    want = torch.cat([offs.new_zeros(1), lens.cumsum(0)])
    if not torch.equal(offs, want):
        g = int((offs != want).nonzero()[0])
        guards.fail("group_offs", f"group_offs[{g}] = {int(offs[g])}; expected {int(want[g])} "
                                  f"(0 then the running sum of group_lens)")
    return lens, offs


def _rows_out_shape(x):
    """(shape, dtype) of a rows op's result: [sum_m, N]."""
    return (x.a.shape[1] if x.trans_a else x.a.shape[0], x.b.shape[1] if x.trans_b else x.b.shape[2]), x.out_dtype


@op(plan=_plan_rows, alloc=torch.empty, check_data=_check_groups, fill={"group_offs": group_offsets},
    convert={"config": CONFIG_GRAMMAR.text}, out_shape=_rows_out_shape)
def grouped_gemm_fp8_kernel(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                            group_lens: torch.Tensor, group_offs: torch.Tensor | None = None, trans_b: bool = True,
                            out_dtype: torch.dtype = torch.bfloat16, num_cu: int | None = None, *,
                            out: torch.Tensor | None = None, trans_a: bool = False, accumulate: bool = False,
                            granularity: str | None = None, config: str = "", validate: bool = True) -> torch.Tensor:
    """Grouped GEMM with FP8 operands, groups along the rows of out (MoE forward and dgrad; with
    G = 1 and group_lens [M] a dense GEMM): for g < G and the rows r of group g
    (group_offs[g] <= r < group_offs[g + 1]),
        out[r, j] = rne(fp32(sa * sb) * sum_k A[r, k] B_g[j, k])   (tensor / row scales), or
        out[r, j] = rne(acc), acc += fp32(sum over 128-block kb) * fp32(sa[r, kb] * sb[j, kb])   (block),
        out[r, j] = rne(acc), acc += fp32(sum over 128-chunk of A B 2^(ea + eb - 254), ea / eb per 32)   (mx),
    fp32 accumulation, and with accumulate=True rne(that + fp32(out[r, j])) (one rounding):
      trans_a  trans_b  layout  A                      B_g
      False    True     NT      a [sum_m, K]           b [G, N, K]  (forward; DeepGEMM fp8_gemm_nt with G = 1)
      False    False    NN      a [sum_m, K]           b [G, K, N]  (dgrad; fp8_gemm_nn)
      True     True     TT      a [K, sum_m] (A = a^T)  b [G, N, K]  (fp8_gemm_tt)
    (fp8_gemm_tn, both operands MN-major, is grouped_gemm_fp8_variable_k with one group.)

    a, b: float8_e4m3fn or float8_e5m2 (mixed as hybrid training's dgrad has it: a e5m2 x b e4m3,
    NN / NT, bf16 out), contiguous in the shapes above. Scales, fp32 dequantisation factors
    (value = fp8 * scale), read through their strides (module docstring table), R = sum_m:
      tensor: a_scale, b_scale one value each;
      row:    a_scale [R] (per out row, i.e. per token), b_scale [G, N] (per group and out column);
      block:  a_scale [R, ceil(K/128)] (1x128), b_scale [G, ceil(N/128), ceil(K/128)] (128x128) or
              [G, N, ceil(K/128)] (one per column); e4m3 only.
      mx:     a_scale [R, K/32], b_scale [G, N, K/32], e8m0 (torch.uint8 or float8_e8m0fnu), one
              per 32 contraction elements, applied by the scaled MFMA (MXFP8); K % 32 == 0.
    granularity: None (from the shapes; mx from the e8m0 dtype) or "tensor" / "row" / "block" /
    "mx" (must fit the shapes and dtype).
    group_lens: int64 [G] (>= 0, summing to at most sum_m: rows past the sum are a padded tail,
    as of an over-allocated activation buffer, never read, their out rows 0 (accumulate: out's
    value + 0)); group_offs: int64 [G + 1] = [0, cumsum(group_lens)] (computed when None).
    K % 16 == 0, N % 16 == 0; TT: sum_m % 16 == 0 and every group_offs entry a multiple of 16.
    out_dtype: torch.bfloat16 or torch.float16, or torch.float32 (e4m3 only); out: optional
    [sum_m, N] of that dtype, required by accumulate=True (out += the product: DeepGEMM's
    d = a b^T + c with d = c). num_cu: cap the grid at this many workgroups (persistent: each
    loops over tiles); None leaves the grid to the config. config: force one (parse_config);
    default: the tuned table row of the problem, else heuristic_config (module docstring).
    validate: check group_lens / group_offs against sum_m (and TT's alignment) before the launch
    (on a GPU a device-to-host copy and a sync); False skips it for callers that know them valid.
    """


@op(plan=_plan_variable_k, alloc=torch.empty, check_data=_check_groups, fill={"group_offs": group_offsets},
    convert={"config": CONFIG_GRAMMAR.text},
    out_shape=lambda x: ((x.group_lens.shape[0], x.a.shape[1], x.b.shape[1]), x.out_dtype))
def grouped_gemm_fp8_variable_k(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                                group_lens: torch.Tensor, group_offs: torch.Tensor | None = None,
                                out_dtype: torch.dtype = torch.bfloat16, *,
                                out: torch.Tensor | None = None, accumulate: bool = False,
                                granularity: str | None = None, config: str = "",
                                validate: bool = True) -> torch.Tensor:
    """Grouped GEMM with FP8 operands, groups along the contraction (MoE wgrad; with one group
    DeepGEMM's fp8_gemm_tn, out [1, M, N]):
        out[g] = rne(fp32(sa * sb) * a_g^T b_g)   (tensor / row scales), or
        out[g] = rne(acc), acc += fp32(128-row block sum) * fp32(sa * sb of that block)   (block),
        out[g] = rne(acc), acc += fp32(128-row chunk's sum of a b 2^(ea + eb - 254), per 32 rows)   (mx),
    a_g / b_g the rows of group g, fp32 accumulation in 128-row chunks from the group's first
    row; an empty group gives zeros (accumulate: out[g] + 0).

    a: [sum_k, M], b: [sum_k, N], float8_e4m3fn or float8_e5m2 (one format, or e4m3 with e5m2
    in either order with bf16 out: hybrid training's wgrad), contiguous. Scales, fp32, read
    through their strides (module docstring table):
      tensor: one value each;
      row:    a_scale [M] (per out row, shared by the groups: Primus-Turbo's row-wise wgrad) or
              [G, M] (per group), b_scale [N] or [G, N];
      block:  a_scale [ceil(sum_k/128), M], b_scale [ceil(sum_k/128), N] (one per column,
              DeepGEMM's K-grouped wgrad) or [ceil(sum_k/128), ceil(N/128)] (128x128); block kb
              covers rows 128 kb .. 128 kb + 127 of sum_k, so every non-empty group must start on a
              multiple of 128 (checked with the groups); e4m3 only;
      mx:     a_scale [M, ceil(sum_k/32)], b_scale [N, ceil(sum_k/32)], e8m0, per 32 rows of sum_k
              (global blocks: every non-empty group starts on a multiple of 32).
    granularity: None (from the shapes; [G, X] and [ceil(sum_k/128), X] scales with
    G = ceil(sum_k/128) need it) or "tensor" / "row" / "block" / "mx" (from the e8m0 dtype).
    group_lens int64 [G] summing to at most sum_k (rows past the sum: a padded tail, never read);
    group_offs int64 [G + 1] (computed when None). M % 16 == 0, N % 16 == 0. out: optional [G, M, N] of out_dtype
    (torch.bfloat16, torch.float16 or torch.float32). accumulate: out += the product (beta = 1,
    in the kernel's epilogue: out[g] = rne(fp32(out[g]) + the scaled product)); out required,
    fp32 or bf16 (Megatron's main_grad; DeepGEMM's K-grouped wgrad accumulates into fp32 d).
    config, validate: as for grouped_gemm_fp8_kernel.
    """



def _operand_dtype(a):
    """The unscaled ops' default out_dtype: a's dtype (a non-tensor a meets its type guard)."""
    return getattr(a, "dtype", None)


@op(plan=_plan_rows, alloc=torch.empty, check_data=_check_groups,
    fill={"group_offs": group_offsets, "out_dtype": _operand_dtype}, convert={"config": CONFIG_GRAMMAR.text},
    out_shape=_rows_out_shape)
def grouped_gemm_bf16_kernel(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
                             group_offs: torch.Tensor | None = None, *, trans_a: bool = False, trans_b: bool = True,
                             out_dtype: torch.dtype | None = None, num_cu: int | None = None,
                             out: torch.Tensor | None = None, accumulate: bool = False, config: str = "",
                             validate: bool = True) -> torch.Tensor:
    """Grouped GEMM with BF16 (or FP16) operands, groups along the rows of out (MoE forward and
    dgrad; Primus-Turbo's grouped_gemm, DeepGEMM's bf16_gemm_nt / nn / tt with G = 1): for g < G
    and the rows r of group g (group_offs[g] <= r < group_offs[g + 1]),
        out[r, j] = rne(sum_k A[r, k] B_g[j, k])
    on v_mfma_f32_16x16x32_bf16 (fp16: _f16): fp32 accumulation over the whole contraction (each
    32-wide chunk as the MFMA sums it, the chunks in order: reference.grouped_gemm_bf16_ref), and
    with accumulate=True rne(that + fp32(out[r, j])) (one rounding; fp16 out: past 65504 it is inf,
    as a hardware fp16 store):
      trans_a  trans_b  layout  A                       B_g
      False    True     NT      a [sum_m, K]            b [G, N, K]  (forward)
      False    False    NN      a [sum_m, K]            b [G, K, N]  (dgrad)
      True     True     TT      a [K, sum_m] (A = a^T)  b [G, N, K]
    (TN, both operands MN-major, is grouped_gemm_bf16_variable_k.)

    a, b: torch.bfloat16, or both torch.float16 (NT and NN, 64 x 64 tiles), contiguous in the
    shapes above. group_lens: int64 [G] (>= 0, summing
    to at most sum_m: rows past the sum are a padded tail, never read, their out rows 0
    (accumulate: out's value + 0)); group_offs: int64 [G + 1] = [0, cumsum(group_lens)]
    (computed when None). K % 16 == 0, N % 16 == 0; TT: sum_m % 16 == 0 and every group_offs
    entry a multiple of 16. out_dtype: None (a's dtype), torch.bfloat16, torch.float16 or
    torch.float32 (fp16 operands: torch.float16); out: optional [sum_m, N] of that dtype, required
    by accumulate=True (bf16 or fp32 out). num_cu, config, validate: as for grouped_gemm_fp8_kernel.
    """


@op(plan=_plan_variable_k, alloc=torch.empty, check_data=_check_groups,
    fill={"group_offs": group_offsets, "out_dtype": _operand_dtype}, convert={"config": CONFIG_GRAMMAR.text},
    out_shape=lambda x: ((x.group_lens.shape[0], x.a.shape[1], x.b.shape[1]), x.out_dtype))
def grouped_gemm_bf16_variable_k(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor,
                                 group_offs: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
                                 out: torch.Tensor | None = None, accumulate: bool = False, config: str = "",
                                 validate: bool = True) -> torch.Tensor:
    """Grouped GEMM with BF16 (or FP16) operands, groups along the contraction (MoE wgrad; DeepGEMM's
    k_grouped_bf16 wgrad, bf16_gemm_tn with one group, out [1, M, N]):
        out[g] = rne(a_g^T b_g),
    a_g / b_g the rows of group g, fp32 accumulation in 32-row chunks from the group's first row
    (reference.grouped_gemm_bf16_variable_k_ref); an empty group gives zeros (accumulate: out[g] + 0).

    a: [sum_k, M], b: [sum_k, N], torch.bfloat16 or both torch.float16 (64 x 64 tiles), contiguous.
    group_lens int64 [G] summing to at most sum_k (rows past the sum: a padded tail, never read);
    group_offs int64 [G + 1] (computed when None). M % 16 == 0, N % 16 == 0. out: optional
    [G, M, N] of out_dtype (None: a's dtype; torch.bfloat16, torch.float16 or torch.float32; fp16
    operands: torch.float16, or torch.float32 with accumulate). accumulate: out += the product
    (fp32 add in the epilogue, one rounding; out required: Megatron's main_grad in fp32, bf16 or
    fp16 for bf16 operands, fp32 for fp16 ones). config, validate: as for grouped_gemm_fp8_kernel.
    """

def _check_fp4_scales(x):
    for n in ("a_scale", "b_scale"):
        guards.check_dtype(getattr(x, n), n, E8M0)


def _plan_fp4_rows(x) -> Plan:
    G, device = _check_operands(x, "[sum_m, K/2] (packed e2m1)", 3, _OUT, _FP4)
    _check_fp4_scales(x)
    sum_m, k_bytes = x.a.shape
    N, K = x.b.shape[1], 2 * k_bytes
    if x.b.shape[2] != k_bytes:
        guards.fail("shape", f"b has {x.b.shape[2]} bytes per row (shape {list(x.b.shape)}, [G, N, K/2]) but a has "
                             f"{k_bytes} (shape {list(x.a.shape)}, [sum_m, K/2])")
    if x.b.shape[0] != G:
        guards.fail("shape", f"b holds {x.b.shape[0]} groups (shape {list(x.b.shape)}) but group_lens has {G}")
    guards.check_multiple(K, "K", MX_BLOCK, f"K%{MX_BLOCK}")   # whole 32-blocks: 16-byte loads, one scale each
    guards.check_multiple(N, "N", _FACTS.n_align, f"N%{_FACTS.n_align}")
    _check_out(x, (sum_m, N))
    _, strides = _scale_strides(x, {"mx": _rows_forms(sum_m, G, N, K)["mx"]})
    _check_sizes(sum_m, "sum_m", dict(a=k_bytes, b=k_bytes, out=x.out_dtype.itemsize * N))
    if x.num_cu is not None and x.num_cu < 1:
        guards.fail("num_cu", f"num_cu = {x.num_cu}; expected None or >= 1")
    shape = dict(out_shape=(sum_m, N), out_dtype=x.out_dtype)
    if sum_m == 0 or N == 0:
        return empty_plan("grouped_gemm_fp4_kernel", **shape)
    choice = choose_config(x, "NT", G, sum_m, N, K, gran="mx")
    variant, cfg = choice.variant, choice.options
    bm, bn = variant["BM"], variant["BN"]
    grid, grid_why = _grid(cfg, (-(-sum_m // bm) + G) * -(-N // bn), x.num_cu)
    why = (f"MXFP4 forward / dgrad (NT), {bm} x {bn} tiles for {sum_m} rows over {G} groups, "
           f"GROUP_M={cfg['GROUP_M']}, {grid_why}; config: {choice.why}")
    return kernel_plan("grouped_gemm_fp4_kernel", _KERNEL, variant, device, why, **shape,
                       grid=grid, G=G, M=sum_m, N=N, K=K, group_m=cfg["GROUP_M"], **strides)


def _plan_fp4_variable_k(x) -> Plan:
    G, device = _check_operands(x, "[M, sum_k/2] (packed e2m1)", 2, _OUT_WGRAD, _FP4)
    _check_fp4_scales(x)
    if x.accumulate and x.out is None:
        guards.fail("accumulate", "accumulate=True adds the product into out: pass out ([G, M, N] of out_dtype)")
    M, k_bytes = x.a.shape
    N, sum_k = x.b.shape[0], 2 * k_bytes
    if x.b.shape[1] != k_bytes:
        guards.fail("shape", f"b has {x.b.shape[1]} bytes per row (shape {list(x.b.shape)}, [N, sum_k/2]) but a has "
                             f"{k_bytes} (shape {list(x.a.shape)}, [M, sum_k/2])")
    guards.check_multiple(M, "M", _FACTS.n_align, f"M%{_FACTS.n_align}")
    guards.check_multiple(N, "N", _FACTS.n_align, f"N%{_FACTS.n_align}")
    guards.check_multiple(sum_k, "sum_k", MX_BLOCK, f"sum_k%{MX_BLOCK}")
    _check_out(x, (G, M, N))
    _, strides = _scale_strides(x, {"mx": _variable_k_forms(G, M, N, sum_k)["mx"]})
    _check_sizes(max(sum_k, M, N), "sum_k, M and N", dict(a=k_bytes, b=k_bytes, out=x.out_dtype.itemsize * N))
    shape = dict(out_shape=(G, M, N), out_dtype=x.out_dtype)
    if G * M * N == 0:
        return empty_plan("grouped_gemm_fp4_variable_k", **shape)
    choice = choose_config(x, "NTK", G, M, N, sum_k, gran="mx")
    variant, cfg = choice.variant, choice.options
    bm, bn = variant["BM"], variant["BN"]
    grid, grid_why = _grid(cfg, G * -(-M // bm) * -(-N // bn), None)
    return kernel_plan("grouped_gemm_fp4_variable_k", _KERNEL, variant, device,
                       f"MXFP4 variable-K wgrad (NTK), {bm} x {bn} tiles (G x tiles of [M, N]), GROUP_M="
                       f"{cfg['GROUP_M']}, {grid_why}; config: {choice.why}", **shape, grid=grid, G=G, M=M, N=N,
                       K=sum_k, group_m=cfg["GROUP_M"], **strides)


def _check_fp4_groups(x, plan) -> None:
    """group_lens / group_offs as _check_lens has them; the wgrad's: every group_offs entry a
    multiple of 32 (its groups are whole 32-blocks of sum_k)."""
    if plan.op == "grouped_gemm_fp4_kernel":
        _check_lens(x, x.a.shape[0], "a.shape[0] (sum_m)")
        return
    _, offs = _check_lens(x, 2 * x.a.shape[1], "2 * a.shape[1] (sum_k)")
    bad = (offs % MX_BLOCK != 0).nonzero()
    if len(bad):
        g = int(bad[0])
        guards.fail("group_offs", f"group_offs[{g}] = {int(offs[g])}, not a multiple of {MX_BLOCK}: the FP4 wgrad's "
                                  f"groups are whole 32-blocks of sum_k (one e8m0 scale and 16 bytes each)")


@op(plan=_plan_fp4_rows, alloc=torch.empty, check_data=_check_fp4_groups, fill={"group_offs": group_offsets},
    convert={"config": CONFIG_GRAMMAR.text}, out_shape=lambda x: ((x.a.shape[0], x.b.shape[1]), x.out_dtype))
def grouped_gemm_fp4_kernel(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                            group_lens: torch.Tensor, group_offs: torch.Tensor | None = None,
                            out_dtype: torch.dtype = torch.bfloat16, num_cu: int | None = None, *,
                            out: torch.Tensor | None = None, config: str = "", validate: bool = True) -> torch.Tensor:
    """MXFP4 grouped GEMM (NT), groups along the rows of out (MoE forward, and the dgrad on
    grad_out and the weights quantised along N: Primus-Turbo's grouped_gemm_fp4, MX_BLOCKWISE):
    for g < G and the rows r of group g (group_offs[g] <= r < group_offs[g + 1]),
        out[r, j] = rne(acc), acc += fp32(sum over a 128-chunk of A[r, k] B_g[j, k] 2^(ea + eb - 254))
    (ea, eb the e8m0 scales of each element's 32-block; the chunks in order from +0, as the scaled
    16x16x128 MFMA sums them: reference.grouped_gemm_fp4_ref).

    a: [sum_m, K/2], b: [G, N, K/2], packed e2m1 (torch.uint8 or torch.float4_e2m1fn_x2: two
    elements per byte, element 2i in the low nibble; quant.quantize_mx(x, "e2m1")), contiguous.
    a_scale: [sum_m, K/32], b_scale: [G, N, K/32], e8m0 (torch.uint8 or float8_e8m0fnu), read
    through their strides. K % 32 == 0, N % 16 == 0. group_lens: int64 [G] (>= 0, summing to at
    most sum_m: rows past the sum are a padded tail, never read, their out rows 0); group_offs:
    int64 [G + 1] = [0, cumsum(group_lens)] (computed when None). out_dtype: torch.bfloat16 or
    torch.float16; out: optional [sum_m, N] of it. num_cu, config, validate: as for
    grouped_gemm_fp8_kernel.
    """


@op(plan=_plan_fp4_variable_k, alloc=torch.empty, check_data=_check_fp4_groups, fill={"group_offs": group_offsets},
    convert={"config": CONFIG_GRAMMAR.text},
    out_shape=lambda x: ((x.group_lens.shape[0], x.a.shape[0], x.b.shape[0]), x.out_dtype))
def grouped_gemm_fp4_variable_k(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                                group_lens: torch.Tensor, group_offs: torch.Tensor | None = None,
                                out_dtype: torch.dtype = torch.bfloat16, *, out: torch.Tensor | None = None,
                                accumulate: bool = False, config: str = "", validate: bool = True) -> torch.Tensor:
    """MXFP4 grouped GEMM with the groups along the contraction, both operands contraction-contiguous
    (the MoE wgrad of Primus-Turbo's grouped_gemm_fp4: grad_out and a quantised column-wise,
    [N, M/2] and [K, M/2] -> [G, N, K]):
        out[g] = rne(acc), acc += fp32(sum over a 128-chunk of a_g[i, c] b_g[j, c] 2^(ea + eb - 254))
    over the group's contraction c in [group_offs[g], group_offs[g + 1]), its chunks from the
    group's first element (reference.grouped_gemm_fp4_variable_k_ref); an empty group gives zeros.

    a: [M, sum_k/2], b: [N, sum_k/2], packed e2m1 (as grouped_gemm_fp4_kernel), contiguous;
    a_scale [M, sum_k/32], b_scale [N, sum_k/32] e8m0, per 32 contraction elements (global blocks).
    Every group_offs entry is a multiple of 32 (whole 32-blocks per group; Primus-Turbo's column
    quantiser pads each group to a multiple of 256 with zeros); M % 16 == 0, N % 16 == 0. group_lens
    int64 [G] summing to at most sum_k (the rest: a padded tail, never read); group_offs int64
    [G + 1] (computed when None). out: optional [G, M, N] of out_dtype (torch.bfloat16,
    torch.float16 or torch.float32). accumulate: out += the product (fp32 add in the epilogue,
    one rounding; out required: Megatron's main_grad in the weight's dtype or fp32). config,
    validate: as for grouped_gemm_fp8_kernel.
    """


FORMATS = {"e4m3": ("e4m3", "e4m3"), "e5m2": ("e5m2", "e5m2"), "hybrid": ("e4m3", "e5m2")}  # (a and b, grad_out)
TRAIN_GRANULARITIES = ("tensorwise", "rowwise", "blockwise", "mx_blockwise")   # Primus-Turbo's names


def _colwise(t, fmt):
    """Scales along the second-to-last dim: (fmt like t, sf [..., last dim])."""
    q, sf = quant.rowwise_cast_to_fp8(t.mT, fmt)
    return q.mT.contiguous(), sf


def _quantised(t, fmt, cast, scale_axis=None):
    """(fp8, fp32 scales) of operand t: a pre-quantised one's own buffers (its scale's size-1
    quantised axis squeezed), else cast(t, fmt)."""
    if not _is_pre_quantised(t):
        return cast(t, fmt)
    scale = t.scale_inv.reshape(1) if scale_axis is None else t.scale_inv.squeeze(scale_axis)
    return t.qdata, scale


def _high_precision(t):
    """t, or a pre-quantised t's values (fp8 * scale, in its original dtype) to re-quantise along
    another axis, as Primus-Turbo does for the backward's operands."""
    return (t.qdata.float() * t.scale_inv).to(t.dtype) if _is_pre_quantised(t) else t


def _quantise_forward(a, b, group_offs, trans_b, fmt, granularity):
    """(the forward's operands, what the backward needs) of one recipe (Primus-Turbo's):
    tensorwise: one scale per tensor, reused by every GEMM; rowwise: a per row and b per output
    column along K for the forward, b along N (the dgrad's contraction) and a per column for the
    wgrad; blockwise: a 1x128 and b 128x128 (the dgrad reads the same blocks transposed), a in
    128-row column blocks of each group's own padded segment for the wgrad; mx_blockwise: e8m0
    scales per 32 contraction elements of every operand, re-quantised along each GEMM's own
    contraction (b along N for the dgrad, a in 32-row blocks of each group's padded segment for
    the wgrad). A pre-quantised operand's buffers serve the forward (and the tensorwise backward)
    as they are."""
    if granularity == "mx_blockwise":
        aq, sa = quant.quantize_mx(a, fmt)                                               # [M, K/32]
        bq, sb = _mx_along(b, fmt, -1 if trans_b else -2)                                  # sb [G, N, K/32]
        b_dgrad = _mx_along(b, fmt, -2 if trans_b else -1)                                # scales [G, K, N/32]
        a_seg, sa_seg, seg_offs = quant.segment_quantize_mx(a, group_offs, fmt)
        return (aq, sa, bq, sb), dict(b=b_dgrad, a=(a_seg, sa_seg), seg_offs=seg_offs)
    if granularity == "tensorwise":
        (aq, sa), (bq, sb) = (_quantised(t, fmt, quant.tensorwise_cast_to_fp8) for t in (a, b))
        return (aq, sa, bq, sb), dict(b=(bq, sb), a=(aq, sa))
    if granularity == "rowwise":
        aq, sa = _quantised(a, fmt, quant.rowwise_cast_to_fp8, -1)
        bq, sb = _quantised(b, fmt, quant.rowwise_cast_to_fp8 if trans_b else _colwise, -1 if trans_b else -2)
        b_hp, a_hp = _high_precision(b), _high_precision(a)
        b_dgrad = _colwise(b_hp, fmt) if trans_b else quant.rowwise_cast_to_fp8(b_hp, fmt)   # scales [G, K]
        return (aq, sa, bq, sb), dict(b=b_dgrad, a=_colwise(a_hp, fmt))
    aq, sa = quant.blockwise_cast_to_fp8(a, (1, SCALE_BLOCK), fmt)
    bq, blocks = _quantised(b, fmt, lambda t, f: quant.blockwise_cast_to_fp8(t, (SCALE_BLOCK, SCALE_BLOCK), f), ())
    sb = blocks if trans_b else blocks.transpose(1, 2)                                   # [G, N/128, K/128]
    a_seg, sa_seg, seg_offs = quant.segment_cast_to_fp8(a, group_offs, SCALE_BLOCK, fmt)
    return (aq, sa, bq, sb), dict(b=(bq, sb.transpose(1, 2)), a=(a_seg, sa_seg), seg_offs=seg_offs)


_KERNEL_GRANULARITY = {"tensorwise": "tensor", "rowwise": "row", "blockwise": "block", "mx_blockwise": "mx"}


def _mx_along(b, fmt, axis):
    """(b's payload in b's layout, e8m0 scales [G, other dim, dim / 32]): b [G, X, Y] quantised in
    32-blocks along ``axis`` (-1: Y, -2: X)."""
    if axis == -1:
        return quant.quantize_mx(b, fmt)
    q, sc = quant.quantize_mx(b.mT, fmt)
    return q.mT.contiguous(), sc


class _Fp8GroupedGemm(torch.autograd.Function):
    """Forward NT/NN on a and b quantised by the recipe; the backward quantises grad_out the same
    way (in the gradient format: e5m2 for "hybrid") and runs the dgrad (the other b layout) and
    the variable-K wgrad on the operands the forward kept (_quantise_forward)."""

    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b, out_dtype, num_cu, fmt, granularity, validate,
                main_grad):
        fwd_fmt, ctx.grad_fmt = FORMATS[fmt]
        ctx.main_grad = main_grad
        (aq, sa, bq, sb), keep = _quantise_forward(a, b, group_offs, trans_b, fwd_fmt, granularity)
        kernel_gran = _KERNEL_GRANULARITY[granularity]
        out = grouped_gemm_fp8_kernel(aq, sa, bq, sb, group_lens, group_offs, trans_b, out_dtype, num_cu,
                                      granularity=kernel_gran, validate=validate)
        ctx.save_for_backward(*keep["b"], *keep["a"], group_lens, group_offs, keep.get("seg_offs"))
        ctx.trans_b, ctx.num_cu, ctx.out_dtype, ctx.granularity = trans_b, num_cu, out_dtype, granularity
        ctx.dtypes = a.dtype, b.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        bq, sb, aq, sa, lens, offs, seg_offs = ctx.saved_tensors
        go, fmt, gran = grad_out.contiguous(), ctx.grad_fmt, ctx.granularity
        kernel_gran = _KERNEL_GRANULARITY[gran]
        w_lens, w_offs = lens, offs
        if gran == "tensorwise":
            (gq, sg), (gq_w, sg_w) = (quant.tensorwise_cast_to_fp8(go, fmt),) * 2
        elif gran == "rowwise":
            (gq, sg), (gq_w, sg_w) = quant.rowwise_cast_to_fp8(go, fmt), _colwise(go, fmt)
        elif gran == "blockwise":
            (gq, sg) = quant.blockwise_cast_to_fp8(go, (1, SCALE_BLOCK), fmt)
            gq_w, sg_w, _ = quant.segment_cast_to_fp8(go, offs, SCALE_BLOCK, fmt)
        else:
            (gq, sg), (gq_w, sg_w, _) = quant.quantize_mx(go, fmt), quant.segment_quantize_mx(go, offs, fmt)
        if seg_offs is not None:
            w_lens, w_offs = seg_offs[1:] - seg_offs[:-1], seg_offs     # the wgrad runs on the padded segments
        # the groups were checked (or vouched for) by the forward
        grad_a = grouped_gemm_fp8_kernel(gq, sg, bq, sb, lens, offs, not ctx.trans_b, ctx.out_dtype, ctx.num_cu,
                                         granularity=kernel_gran, validate=False)
        lhs, rhs = ((gq_w, sg_w), (aq, sa)) if ctx.trans_b else ((aq, sa), (gq_w, sg_w))
        grad_b = _wgrad(ctx, grouped_gemm_fp8_variable_k, (*lhs, *rhs, w_lens, w_offs), granularity=kernel_gran)
        return grad_a.to(ctx.dtypes[0]), grad_b, *(None,) * 9


def _wgrad(ctx, op, args, **kw):
    """b's gradient from the variable-K op: its product in ctx.out_dtype returned in b's dtype, or
    (ctx.main_grad set: Megatron's fusion) main_grad += the product in the kernel's epilogue and a
    zero stand-in (no allocation) returned. The groups were checked (or vouched for) by the forward."""
    if ctx.main_grad is None:
        return op(*args, ctx.out_dtype, validate=False, **kw).to(ctx.dtypes[1])
    op(*args, ctx.main_grad.dtype, out=ctx.main_grad, accumulate=True, validate=False, **kw)
    return torch.zeros((), dtype=ctx.dtypes[1], device=ctx.main_grad.device).expand(ctx.main_grad.shape)


def _enum_name(v) -> str:
    """An enum member's name (or a string), lower case: Primus-Turbo's config fields read by name."""
    return str(getattr(v, "name", v)).lower()


def _quant_config(config, format):
    """(format, granularity) of Primus-Turbo's ``config`` (a Float8QuantConfig: format,
    granularity, block size, scale dtype; read by field and enum member name), or of ``format``
    with tensorwise scales; GuardError for a recipe the op does not do."""
    if config is None:
        return format or "e4m3", "tensorwise"
    fmt = _enum_name(getattr(config, "format", getattr(config, "dtype", "e4m3")))
    if fmt not in FORMATS or (format is not None and format != fmt):
        guards.fail("format", f"config.format = {fmt!r}{f' and format = {format!r}' if format else ''}: expected one "
                              f"of {', '.join(map(repr, FORMATS))}, given once")
    granularity = _enum_name(getattr(config, "granularity", "tensorwise"))
    if granularity not in TRAIN_GRANULARITIES:
        guards.fail("granularity", f"config.granularity = {granularity.upper()}: grouped_gemm_fp8 quantises "
                                   f"{', '.join(g.upper() for g in TRAIN_GRANULARITIES)}")
    block = getattr(config, "block_size", None)
    want_block, scale_dtypes = {"blockwise": (SCALE_BLOCK, ("fp32", "float32")),
                                "mx_blockwise": (MX_BLOCK, ("e8m0",))}.get(granularity, (block, ("fp32", "float32")))
    if block != want_block:
        guards.fail("block_size", f"config.block_size = {block!r}: {granularity.upper()} scales are "
                                  f"{want_block}-wide here")
    scale_dtype = _enum_name(getattr(config, "scale_dtype", scale_dtypes[0]))
    if scale_dtype not in scale_dtypes:
        guards.fail("scale_dtype", f"config.scale_dtype = {scale_dtype.upper()}: {granularity.upper()} scales here "
                                   f"are {scale_dtypes[0].upper()}")
    return fmt, granularity


def _is_pre_quantised(t) -> bool:
    """Primus-Turbo's QuantizedTensor (fp8 qdata, fp32 scale_inv, granularity, block_size,
    quantized_axis; its dtype is the original one), recognised by those fields."""
    return all(hasattr(t, f) for f in ("qdata", "scale_inv", "granularity"))


def _check_operand(t, name: str, fmt: str, granularity: str, block, axis) -> None:
    """A plain tensor to quantise, or a pre-quantised one made by this call's recipe (its
    granularity, block size, format and quantised axis: axis None for tensorwise, () for
    blockwise weights); other wrappers are refused by name rather than read as a tensor of their
    outer shape."""
    if _is_pre_quantised(t):
        got = str(getattr(t.granularity, "name", t.granularity)).lower()
        if granularity == "mx_blockwise":
            guards.fail("type", f"{name} is pre-quantised: MX_BLOCKWISE quantises its operands itself here (each "
                                "GEMM along its own contraction)")
        if granularity == "blockwise" and name == "a":
            guards.fail("type", "a is pre-quantised: BLOCKWISE quantises the activation itself (row blocks for the "
                                "forward, segment-padded column blocks for the wgrad), as Primus-Turbo does")
        if got != granularity or getattr(t, "block_size", None) != block:
            guards.fail("granularity", f"{name} is quantised {got.upper()} with block_size "
                                       f"{getattr(t, 'block_size', None)}; the config asks {granularity.upper()} "
                                       f"with block_size {block}")
        want = formats.TORCH_DTYPES[FORMATS[fmt][0]]
        if t.qdata.dtype != want:
            guards.fail("dtype", f"{name}.qdata is {t.qdata.dtype}; the config's format quantises to {want}")
        if granularity == "rowwise" and getattr(t, "quantized_axis", None) != axis % t.qdata.dim():
            guards.fail("axis", f"{name} is quantised along axis {getattr(t, 'quantized_axis', None)}; this call "
                                f"needs its scales along axis {axis % t.qdata.dim()} (the contraction)")
        return
    _refuse_wrapper(t, name)


def _refuse_wrapper(t, name: str) -> None:
    """A wrapper other than a pre-quantised QuantizedTensor is refused by name rather than read as a
    tensor of its outer shape."""
    wrapper = next((c.__name__ for c in type(t).__mro__ if "Quantized" in c.__name__ or c.__name__ == "Float8Tensor"),
                   None)
    if not isinstance(t, torch.Tensor) or wrapper:
        guards.fail("type", f"{name} must be a bf16 / fp16 / fp32 torch.Tensor (quantised by the op) or a "
                            f"pre-quantised QuantizedTensor; got {wrapper or type(t).__name__}")


def grouped_gemm_fp8(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor, group_offs: torch.Tensor | None = None,
                     trans_b: bool = True, out_dtype: torch.dtype | None = None, config=None,
                     num_cu: int | None = None, fuse_bgrad_accum_pattern: str | None = None, *,
                     format: str | None = None, validate: bool = True) -> torch.Tensor:
    """Differentiable MoE grouped GEMM in FP8: out[r] = a[r] . B_g for the rows r of group g
    (B_g = b[g]^T if trans_b, b [G, N, K]; else b[g], b [G, K, N]). Primus-Turbo's signature and
    argument order (``turbo.ops.grouped_gemm_fp8``).

    a, b: bf16, fp16 or fp32 (one dtype), quantised on every call in the format and granularity
    of ``config`` (Primus-Turbo's Float8QuantConfig: format E4M3 / E5M2 / HYBRID; granularity
    TENSORWISE, ROWWISE (a per row, b per output column; the backward re-quantises along the
    other axes), BLOCKWISE with block_size 128 (a 1x128, b 128x128, the wgrad's operands in
    128-row column blocks of each group; E4M3, bf16 or fp32 out) with scale_dtype FP32, or
    MX_BLOCKWISE with block_size 32 and scale_dtype E8M0 (MXFP8: e8m0 scales per 32 elements of
    each GEMM's contraction on the scaled MFMA; E4M3, bf16 out)), or of
    ``format`` with tensorwise scales: "e4m3" (default), "e5m2", or "hybrid" (a and b in e4m3,
    grad_out in e5m2: its wider range for gradients); out_dtype: bf16 or fp16, default a.dtype. The backward
    quantises grad_out and runs grouped_gemm_fp8_kernel (grad_a) and
    grouped_gemm_fp8_variable_k (grad_b), each computed in out_dtype and returned in its input's
    dtype. group_lens / group_offs / num_cu / validate as in grouped_gemm_fp8_kernel (the forward
    checks the groups; the backward reuses them).

    fuse_bgrad_accum_pattern="megatron" (Megatron's gradient-accumulation fusion, b a parameter
    with ``main_grad`` (fp32 or bf16, b's shape) and ``grad_added_to_main_grad``): the backward
    adds the weight gradient into b.main_grad in the wgrad kernel's epilogue (one rounding to
    main_grad's dtype) and b's autograd gradient is a zero stand-in; the forward sets
    b.grad_added_to_main_grad = True so Megatron's hook does not add it again."""
    format, granularity = _quant_config(config, format)
    block = getattr(config, "block_size", None)
    _check_operand(a, "a", format, granularity, block, -1)
    _check_operand(b, "b", format, granularity, block, -1 if trans_b else -2)
    out_dtype = _out_dtype(a, b, out_dtype)
    if format not in FORMATS:
        guards.fail("format", f"format = {format!r}; expected one of {', '.join(map(repr, FORMATS))}")
    if group_offs is None:
        group_offs = group_offsets(group_lens)
    fwd_fmt, grad_fmt = FORMATS[format]
    gran = _KERNEL_GRANULARITY[granularity]
    wgrad_fmts = (grad_fmt, fwd_fmt) if trans_b else (fwd_fmt, grad_fmt)    # the wgrad's (lhs, rhs)
    _check_recipe_kernels(fwd_fmt, grad_fmt, wgrad_fmts, gran, trans_b, out_dtype, format, granularity)
    main_grad = fused_main_grad(b, fuse_bgrad_accum_pattern, *wgrad_fmts, gran)
    return _apply_fused(_Fp8GroupedGemm, b, main_grad, a, b, group_lens, group_offs, trans_b, out_dtype, num_cu,
                        format, granularity, validate)


def _out_dtype(a, b, out_dtype):
    """The autograd ops' operand dtypes (one of bf16, fp16, fp32, shared) and out_dtype (bf16 or
    fp16; a's dtype when None), checked."""
    if a.dtype not in (*_OUT, torch.float32) or b.dtype != a.dtype:
        guards.fail("dtype", f"a and b must share one dtype, torch.bfloat16, torch.float16 or torch.float32; "
                             f"got a {a.dtype}, b {b.dtype}")
    out_dtype = out_dtype or a.dtype
    if out_dtype not in _OUT:
        guards.fail("dtype", f"out_dtype is {out_dtype} (a's dtype when None); expected torch.bfloat16 or "
                             "torch.float16")
    return out_dtype


def _apply_fused(fn, b, main_grad, *args):
    """fn.apply(*args, main_grad); with Megatron's fusion b.grad_added_to_main_grad is set by the
    forward, so Megatron's hook does not add b's (stand-in) gradient again."""
    out = fn.apply(*args, main_grad)
    if main_grad is not None:
        b.grad_added_to_main_grad = True
    return out


def _has_variant(layout, fmt_a, fmt_b, out, gran, accumulate=False) -> bool:
    """Some tile is registered for this layout, format pair, out ("bf16" / "f16" / "f32"),
    accumulation and scale granularity (the kernel's: block and mx have their GRAN key, the others
    none)."""
    key = gran if gran in ("block", "mx") else None
    return any(v["LAYOUT"] == layout and v["FMT"] == fmt_a and v["FMT_B"] == fmt_b and v["OUT"] == out
               and bool(v.get("ACCUM")) == accumulate and v.get("GRAN") == key for v in _FACTS.variants)


def _check_recipe_kernels(fwd_fmt, grad_fmt, wgrad_fmts, gran, trans_b, out_dtype, format, granularity) -> None:
    """Every GEMM of the step (forward, dgrad, wgrad) has a registered variant for the recipe's
    formats, scales and out_dtype, checked before the forward launches (a missing backward kernel
    would otherwise fail only after it)."""
    fwd, dgrad = ("NT", "NN") if trans_b else ("NN", "NT")
    out = _OUT_WGRAD[out_dtype]
    for name, layout, (fa, fb) in (("forward", fwd, (fwd_fmt, fwd_fmt)), ("dgrad", dgrad, (grad_fmt, fwd_fmt)),
                                   ("wgrad", "TN", wgrad_fmts)):
        if not _has_variant(layout, fa, fb, out, gran):
            scales = f", {gran} scales" if gran in ("block", "mx") else ""
            guards.fail("format", f"format {format!r} with {granularity.upper()} and out_dtype {out_dtype}: no "
                                  f"{name} kernel ({layout}, {fa} x {fb} -> {out}{scales}) is registered")


def fused_main_grad(b, pattern, lhs_fmt, rhs_fmt, gran="none", layout="TN"):
    """b.main_grad for fuse_bgrad_accum_pattern (checked here, before any launch), or None; the
    wgrad accumulating into it is the ``layout`` variant (TN; the FP4 wgrad NTK) of formats
    lhs_fmt x rhs_fmt and the kernel's scale granularity gran."""
    if pattern is None:
        return None
    if pattern != "megatron":
        guards.fail("fuse_bgrad_accum_pattern", f"fuse_bgrad_accum_pattern = {pattern!r}; expected None or "
                                                "'megatron'")
    main_grad = getattr(b, "main_grad", None)
    if not hasattr(b, "grad_added_to_main_grad") or not isinstance(main_grad, torch.Tensor):
        guards.fail("fuse_bgrad_accum_pattern", "fuse_bgrad_accum_pattern='megatron' needs b.main_grad (a tensor) "
                                                "and b.grad_added_to_main_grad set up before the backward")
    guards.check_shape(main_grad, "b.main_grad", tuple(b.shape))
    out = _OUT_WGRAD.get(main_grad.dtype)
    if not _has_variant(layout, lhs_fmt, rhs_fmt, out, gran, accumulate=True):
        scaled = f" {gran}-scaled" if gran in ("block", "mx") else ""
        guards.fail("dtype", f"b.main_grad is {main_grad.dtype}: no wgrad kernel accumulates {lhs_fmt} x {rhs_fmt}"
                             f"{scaled} products into it (see the registry's {layout} ACCUM variants)")
    if not main_grad.is_contiguous() or main_grad.device != b.device:
        guards.fail("layout", f"b.main_grad must be contiguous and on b's device ({b.device}); got "
                              f"{main_grad.device}, strides {main_grad.stride()}")
    return main_grad


# ---- grouped_gemm_fp4: Primus-Turbo's differentiable MXFP4 grouped GEMM (docs/primus_turbo_fp4.md) ----
FP4_MODE = "even"   # Primus-Turbo's e8m0 rule: amax rounded half-up to e2m1's one mantissa bit, then the floor
_FP4_CONFIG = dict(granularity="mx_blockwise", format="e2m1_x2", block_size="32", scale_dtype="e8m0",
                   use_gradient_sr="false", use_preshuffle="false")   # Float4QuantConfig's fields, the values taken
_FP4_CONFIG_WHY = dict(use_gradient_sr="the quantiser rounds to nearest even (stochastic rounding is random)",
                       use_preshuffle="the kernels read row-major payloads and scales")


def _fp4_config(config) -> None:
    """Primus-Turbo's Float4QuantConfig (None: its defaults), read by field and enum member name:
    MX_BLOCKWISE, E2M1_X2, block_size 32, E8M0 scales, no stochastic rounding, no pre-shuffle."""
    for field, want in _FP4_CONFIG.items() if config is not None else ():
        got = getattr(config, field, want)
        if _enum_name(got) != want:
            guards.fail(field, f"config.{field} = {got!r}: grouped_gemm_fp4 takes {want.upper()} only"
                               f"{f' ({_FP4_CONFIG_WHY[field]})' if field in _FP4_CONFIG_WHY else ''}")


def _check_fp4_operand(t, name: str) -> None:
    """A plain tensor to quantise, or Primus-Turbo's QuantizedTensor quantised MX_BLOCKWISE (block
    32) along its last axis: packed e2m1 qdata [..., K/2], e8m0 scale_inv [..., K/32]."""
    if not _is_pre_quantised(t):
        _refuse_wrapper(t, name)
        return
    got, block = _enum_name(t.granularity), getattr(t, "block_size", None)
    if got != "mx_blockwise" or block != MX_BLOCK:
        guards.fail("granularity", f"{name} is quantised {got.upper()} with block_size {block}; grouped_gemm_fp4 "
                                   f"takes MX_BLOCKWISE with block_size {MX_BLOCK}")
    guards.check_dtype(t.qdata, f"{name}.qdata", _FP4)
    guards.check_dtype(t.scale_inv, f"{name}.scale_inv", E8M0)
    *lead, k = t.shape
    guards.check_shape(t.qdata, f"{name}.qdata", (*lead, k // 2))
    guards.check_shape(t.scale_inv, f"{name}.scale_inv (quantised along the last axis)", (*lead, k // MX_BLOCK))


def _fp4_buffers(t):
    """A pre-quantised operand's (payload, scales) as bytes, and its values in its dtype (to
    re-quantise along another axis, as Primus-Turbo does)."""
    q, s = t.qdata.view(torch.uint8), t.scale_inv.view(torch.uint8)
    return (q, s), quant.dequantize_mx(q, s, "e2m1").to(t.dtype)


class _Fp4GroupedGemm(torch.autograd.Function):
    """Primus-Turbo's three MXFP4 GEMMs: forward a x b (both quantised along K: a 1 x 32, b in
    32 x 32 tiles), dgrad grad_out (1 x 32 along N) x the same tiles of b read along N, wgrad on
    grad_out and a quantised along each group's rows after the 16-point Hadamard transform (it
    cancels in their product) in 32-aligned segments."""

    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, out_dtype, num_cu, validate, main_grad):
        if _is_pre_quantised(a):
            (aq, sa), a_hp = _fp4_buffers(a)
        else:
            (aq, sa), a_hp = quant.quantize_mx(a, "e2m1", FP4_MODE), a
        if _is_pre_quantised(b):
            (bq, sb), b_hp = _fp4_buffers(b)
            bc, sbc = quant.quantize_mx_2d(b_hp, "e2m1", FP4_MODE)[2:]
        else:
            bq, sb, bc, sbc = quant.quantize_mx_2d(b, "e2m1", FP4_MODE)
        out = grouped_gemm_fp4_kernel(aq, sa, bq, sb, group_lens, group_offs, out_dtype, num_cu, validate=validate)
        a_col, sa_col, seg_offs = quant.segment_quantize_fp4(a_hp, group_offs, mode=FP4_MODE)
        ctx.save_for_backward(bc, sbc, a_col, sa_col, group_lens, group_offs, seg_offs)
        ctx.out_dtype, ctx.num_cu, ctx.main_grad, ctx.dtypes = out_dtype, num_cu, main_grad, (a.dtype, b.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        bc, sbc, a_col, sa_col, lens, offs, seg_offs = ctx.saved_tensors
        go = grad_out.contiguous()
        gq, sg = quant.quantize_mx(go, "e2m1", FP4_MODE)
        g_col, sg_col, _ = quant.segment_quantize_fp4(go, offs, mode=FP4_MODE)
        grad_a = grouped_gemm_fp4_kernel(gq, sg, bc, sbc, lens, offs, ctx.out_dtype, ctx.num_cu, validate=False)
        grad_b = _wgrad(ctx, grouped_gemm_fp4_variable_k, (g_col, sg_col, a_col, sa_col, seg_offs.diff(), seg_offs))
        return grad_a.to(ctx.dtypes[0]), grad_b, *(None,) * 6


def grouped_gemm_fp4(a: torch.Tensor, b: torch.Tensor, group_lens: torch.Tensor, group_offs: torch.Tensor | None = None,
                     trans_b: bool = True, out_dtype: torch.dtype | None = None, config=None,
                     num_cu: int | None = None, fuse_bgrad_accum_pattern: str | None = None, *,
                     validate: bool = True) -> torch.Tensor:
    """Differentiable MoE grouped GEMM in MXFP4: out[r] = a[r] . b[g]^T for the rows r of group g
    (group_offs[g] <= r < group_offs[g + 1]). Primus-Turbo's ``grouped_gemm_fp4`` signature,
    argument order and defaults (NT only: trans_b=True, b [G, N, K]).

    a [sum_m, K], b [G, N, K]: bf16, fp16 or fp32 (one dtype), quantised on every call to e2m1
    with e8m0 scales per 32 elements of each GEMM's contraction (Primus-Turbo's recipe and e8m0
    rule, quant.quantize_mx mode "even"): the forward reads a 1 x 32 along K and b in 32 x 32
    tiles; the dgrad grad_out 1 x 32 along N and the same tiles of b along N; the wgrad grad_out
    and a along each group's rows, each 16 rows first multiplied by H16 / 4 (quant.hadamard16,
    the fixed Hadamard transform Primus-Turbo calls RHT; orthogonal, it cancels in the product).
    Or a / b pre-quantised (Primus-Turbo's QuantizedTensor, MX_BLOCKWISE along the last axis: e2m1
    qdata, e8m0 scale_inv): their buffers serve the forward, their dequantised values are
    re-quantised for the backward. config: Primus-Turbo's Float4QuantConfig (MX_BLOCKWISE,
    E2M1_X2, block_size 32, E8M0; use_gradient_sr and use_preshuffle False) or None.
    K % 32 == 0 and N % 32 == 0 (each is a contraction). out_dtype: bf16 or fp16 (a's dtype when
    None). The GEMMs are grouped_gemm_fp4_kernel (forward, dgrad) and grouped_gemm_fp4_variable_k
    (wgrad), computed in out_dtype, gradients returned in the inputs' dtypes; group_lens /
    group_offs / num_cu / validate as in grouped_gemm_fp4_kernel (the forward checks the groups).

    fuse_bgrad_accum_pattern="megatron" (b a parameter with ``main_grad`` (bf16, fp16 or fp32, b's
    shape) and ``grad_added_to_main_grad``): the backward adds the weight gradient into
    b.main_grad in the wgrad kernel's epilogue (one rounding), b's autograd gradient is a zero
    stand-in and the forward sets b.grad_added_to_main_grad = True (as grouped_gemm_fp8)."""
    _fp4_config(config)
    _check_fp4_operand(a, "a")
    _check_fp4_operand(b, "b")
    if not trans_b:
        guards.fail("trans_b", f"trans_b = {trans_b!r}: grouped_gemm_fp4 is NT only (b [G, N, K], trans_b=True), as "
                               "Primus-Turbo's")
    out_dtype = _out_dtype(a, b, out_dtype)
    if a.dim() != 2 or b.dim() != 3:
        guards.fail("shape", f"a must be 2-D [sum_m, K] and b 3-D [G, N, K]; got a {list(a.shape)}, b {list(b.shape)}")
    N, K = b.shape[1:]
    if a.shape[1] != K:
        guards.fail("shape", f"a has K = {a.shape[1]} (shape {list(a.shape)}) but b has K = {K} "
                             f"(shape {list(b.shape)})")
    for name, n, gemm in (("K", K, "the forward's"), ("N", N, "the dgrad's")):
        if n % MX_BLOCK:
            guards.fail(f"{name}%{MX_BLOCK}", f"{name} = {n} is not a multiple of {MX_BLOCK}: {name} is {gemm} "
                                              f"contraction, quantised in 32-element e8m0 blocks")
    if group_offs is None:
        group_offs = group_offsets(group_lens)
    main_grad = fused_main_grad(b, fuse_bgrad_accum_pattern, "e2m1", "e2m1", "mx", "NTK")
    return _apply_fused(_Fp4GroupedGemm, b, main_grad, a, b, group_lens, group_offs, out_dtype, num_cu, validate)
