"""DeepGEMM-style FP8 (and FP8 x FP4) block-scale grouped GEMM (NT) on gfx950, and its unscaled
BF16 form: d[m, n] = sum_k a[m, k] b[group(m), n, k].

a: e4m3 rows with 1x128 scales sfa; b: e4m3 [G, N, K] with 128x128 scales sfb, or e2m1 [G, N, K/2]
with 1x32 scales; or (A_FMT bf16) a and b bf16 without scales; d: bf16 or f16. One body,
compile-time variants:
  MASKED 0  contiguous layout: a [M, K], `layout` = m_indices int32 [M] (group of each row,
            -1 for padding). A tile's group is the one of its first row. Rows whose m_indices
            differ from the tile's group are not loaded (read as 0).
  PSUM 1    (contiguous) DeepGEMM's psum layout: `layout` = int32 [G], each group's end row;
            group g starts at the previous end aligned to M_ALIGN (128); any G. A workgroup
            finds its group by counting the groups whose aligned end is at or before its first
            row, 64 ends at a time (each lane of a wave reads one end, a ballot's popcount: a
            uniform value), until a chunk holds an end past that row (G <= 64: one pass; no
            device sync). Rows at or past the group's end are padding.
            Contiguous padding rows (and tiles of padding only) are left untouched (zero_pad 0:
            those tiles exit at once, the rows' stores are dropped) or written as zeros
            (zero_pad 1: padding-only tiles run with an empty K loop).
  MASKED 1  masked layout: a [G, M_max, K] (rows = G*M_max), `layout` = masked_m int32 [G].
            Tiles at or past masked_m[g] exit at once; rows >= masked_m[g] are not written.
  UE8M0 0   fp32 scales (DeepGEMM's SM90 recipe), software promotion: each 128-K block is
            one MFMA with C = 0 (exact sum, one fp32 rounding, scales 1.0), then
            acc = acc + p * (sfa * sfb) (fp32 product, product, add: three RNE roundings).
  UE8M0 1   e8m0 scale bytes: the hardware scales of v_mfma_scale_f32_16x16x128_f8f6f4 (lane
            n + 16 j supplies row n's scale for 32-K block j of the step: docs/gfx950_isa.md
            §1.5), the MFMA accumulating straight into acc. sfa is per 128 K (the same byte for
            the four 32-K blocks); sfb may vary per row of b (DeepGEMM's packed (1, 1, 128)
            recipe) or per 128 rows.
  B_FMT     "e4m3" | "e2m1" (UE8M0 only): e2m1 b is packed two per byte (even K in the low
            nibble); the MFMA's src0 format code is 4 and each lane's operand is its 16 bytes
            (32 K) of the row, zeros above; sfb holds one scale per row of b and 32-K block.
  A_FMT     "e4m3" | "bf16": bf16 a [.., K] and b [G, N, K] (B_FMT not given: b is bf16 too, UE8M0
            0), no scales: sfa and sfb are not read (null pointers). A K block is still 128 bytes
            (64 bf16) with the same loads, LDS layout and swizzle; its two 16-byte halves per lane
            (bytes 16g.. and 64 + 16g..) are the operands of two v_mfma_f32_16x16x32_bf16 (K 32 each:
            lane l holds row l%16, K 8(l/16)..+7, docs/gfx950_isa.md §1.3), both accumulating
            straight into acc, K half 0 first. Each MFMA is (the emulator's model, emu/matrix.py)
            the exact sum of its 32 products rounded once to fp32, then one RNE add into acc:
            mxgemm.reference sums 32-K chunks the same way (bit-exact). Registers as the e4m3
            path's without the scale registers; the kernel's k argument is K in elements, a row
            is 2K bytes; K % 16 (32 bytes: the 16-byte chunk rule with room to spare).
  SFA_KMAJOR 1 (fp32 scales only): sfa is row-major ([.., rows, K blocks], sfa_sk1 = 4, sfa_sk4 = 16)
            and ends at byte rows * sfa_sm. The four lanes of a row (lane groups g = 0..3) then load
            the scales of a window of its next K blocks (sfa_window: one K-loop iteration's steps, 12
            or 16), each a quarter (3 or 4 blocks) in one load, and a step's ds_bpermute brings its
            block from the group that holds it; not one load per step: at long K each row's scales
            are a line of their own, and the A and B DMA of the steps in between evict it from the
            L1 (masked m 256 per group, N 2048, K 7168: 16 lines per 16 rows and step went to the
            L2 again). The window's offset is a voffset, so the last window's blocks past the
            tensor's end read 0 (the range check is per dword); those past a row's end read the
            next row's scales, which no step uses.
  OUT       "bf16" | "f16": RNE conversion of the fp32 accumulator.
  BM x BN   workgroup tile (rows x columns); 4 waves as 2 x 2, each (BM/2) x (BN/2) in 16x16 MFMA
            tiles. BN divides 128, so one per-128-row sfb value covers the workgroup per K block.

Per K block of 128: A (BM x 128 bytes) goes to LDS by 16-byte buffer->LDS DMA (LDS chunk
c of row r holds memory chunk c ^ (r & 7)), and so does e4m3 B (BN x 128 bytes, after A in the
same buffer; b_through_lds); e2m1 and bf16 B come from global straight into registers. A, B,
sfa and sfb are loaded one K block ahead (two buffers), or two for the FP8 forms' 128 x 64 and
32 x 32 tiles (three; load_depth). The K loop runs one register set per step of a group of
depth + 1 steps (bf16: one step per iteration). MFMA operands: src0 = B rows (n),
src1 = A rows (m), so lane l accumulates D^T[n = 4(l/16) + i][m = l%16], i.e. 4 consecutive
columns of one output row. Epilogue (CShuffle): the tile, converted, goes through LDS and is
written as 16-byte row chunks (rows out of the group get an out-of-range offset: the store is
dropped; with zero_pad, rows of no group inside d get zeros instead).

Kernel arguments: a, sfa, b, sfb, d, layout (pointers), rows, n, k, m_max, groups, zero_pad
(int32), then the scales' byte strides (int32): sfa_sg, sfa_sm, sfa_sk4, sfa_sk1, sfb_sg,
sfb_sn, sfb_sk4, sfb_sk1, sfb_shift. rows = M (contiguous) or G*M_max (masked); m_max is read
only when MASKED, zero_pad only when contiguous. The scale of (group g, row m, K block kb; 32-K
blocks for e2m1 sfb, else 128-K) is the element at byte
    sfa: g*sfa_sg + m*sfa_sm + (kb/4)*sfa_sk4 + (kb%4)*sfa_sk1   (contiguous: g = 0, m = the row)
    sfb: g*sfb_sg + (n >> sfb_shift)*sfb_sn + (kb/4)*sfb_sk4 + (kb%4)*sfb_sk1
so row-major and MN-major scales, and UE8M0 bytes packed four to an int32 (byte kb%4 of word
kb/4), are all read in place; sfb_shift is 7 for one scale per 128 rows of b, 0 for one per
row (UE8M0 only: the fp32 path loads one sfb per workgroup). Byte offsets are 32-bit buffer
offsets: a (rows*K), one group of b (N*K, N*K/2 for e2m1), d (rows*N*2) and every scale offset
must stay below 2^31 (the caller's guard). N % BN == 0; K % 16 == 0 (K % 32 for e2m1): a partial
last K block loads its 16-byte chunks past K out of range (zeros, docs/buffer_oob.md) instead of
from the next row, and for e2m1 the scale bytes of its missing 32-K blocks too (byte 0, not a
NaN code), so its sum is that of the K it has. Launch: grid = (n / BN, m_tiles, 1), block =
(256, 1, 1) with m_tiles = ceil(M / BM) (contiguous) or G * ceil(M_max / BM) (masked); a
workgroup's tile is not its grid position but the XCD order's (_xcd_tile: each XCD a contiguous run
of tiles, so that its L2 holds the A rows of few row tiles).
"""
from types import SimpleNamespace

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl, scf
from ir_builder import (
    INVALID_OFFSET,
    XCDS,
    Builder,
    Int,
    flatten,
    k_loop,
    lds_alias_scopes,
    loads_done_barrier,
    pipelined_step,
)

THREADS = 256
BLOCK_K = 128                     # one scale block = one MFMA 16x16x128
FP4_BLOCK = 32                    # K of one FP4 weight scale (and of one lane's e2m1 operand chunk)
E8M0_ONE = 127                    # hardware scale byte for 1.0
TILES = (32, 64, 128)             # allowed BM and BN
M_ALIGN = 128                     # psum layout: each group starts at the previous end aligned to this
BAND = 4                          # contiguous layouts: row tiles whose tiles one XCD takes together
FMT_CODE = {"e4m3": 0, "e2m1": 4}  # the scaled MFMA's cbsz / blgp operand format
A_FMTS = ("e4m3", "bf16")


def load_depth(bm, bn, bf16: bool) -> int:
    """K steps whose loads are in flight while one computes (LDS buffers: one more). Two for the FP8
    forms' 128 x 64 tile, the one for grids too small to fill the GPU with 128 x 128 (a workgroup
    per CU: one step's MFMAs hide little of a load; contiguous m 64 per group, N 2048, K 512: 4.50
    -> 4.04 us on the model), and for 32 x 32. One for 64 x 128 (masked buffers of 64 rows, bound
    by HBM: the third register set costs its third workgroup per CU, 7.06 -> 7.18 us at N 7168,
    K 512) and 128 x 128 (past 256 VGPRs); bf16 keeps its third workgroup per CU."""
    return 2 if not bf16 and (bm, bn) in ((128, 64), (32, 32)) else 1


def sfa_window(bm, bn, sfa_kmajor) -> int:
    """K blocks of sfa a row's four lanes load at once (SFA_KMAJOR; 0: one per step), the steps of one
    K-loop iteration: lane group g loads blocks g*c .. g*c+c-1 of the window in one load, c = 3 (a
    dwordx3) where loads run two steps ahead (an iteration a multiple of the three register sets),
    else 4 (a dwordx4)."""
    return 4 * (3 if load_depth(bm, bn, False) == 2 else 4) if sfa_kmajor else 0


def b_through_lds(b_fmt) -> bool:
    """e4m3 b reaches the MFMAs through LDS by DMA, as A does: loaded into registers, each B row
    went through the CU's L1 once per wave row that uses it (twice), the L1 the limit of the
    two-workgroups-per-CU cells on the model."""
    return b_fmt == "e4m3"


def buffer_bytes(bm, bn, b_fmt) -> int:
    """One LDS buffer: the A tile of a K block, then the B tile when b_through_lds."""
    return (bm + (bn if b_through_lds(b_fmt) else 0)) * BLOCK_K


def _check(bm, bn, masked, psum, ue8m0, a_fmt, b_fmt, out, sfa_kmajor):
    bf16 = a_fmt == "bf16"
    if (sfa_kmajor not in (0, 1) or (sfa_kmajor and (ue8m0 or bf16))
            or bm not in TILES or bn not in TILES or masked not in (0, 1) or psum not in (0, 1) or ue8m0 not in (0, 1)
            or a_fmt not in A_FMTS or out not in ("bf16", "f16") or (masked and psum)
            or (b_fmt != "bf16" if bf16 else b_fmt not in FMT_CODE) or (b_fmt == "e2m1" and not ue8m0)
            or (bf16 and ue8m0)):
        raise ValueError(f"variant BM={bm} BN={bn} MASKED={masked} PSUM={psum} UE8M0={ue8m0} A_FMT={a_fmt} "
                         f"B_FMT={b_fmt} OUT={out} SFA_KMAJOR={sfa_kmajor}: BM, BN in {TILES}; MASKED, PSUM, UE8M0, "
                         f"SFA_KMAJOR in (0, 1), PSUM only contiguous; A_FMT in {A_FMTS}; B_FMT in "
                         f"{tuple(FMT_CODE)} (e4m3 a), e2m1 only with UE8M0; bf16 a: b bf16, no scales (UE8M0 0); "
                         f"SFA_KMAJOR only with fp32 scales; OUT bf16 or f16")


def _psum_group(B, layout, groups, row_base):
    """psum layout: (the group whose rows hold row_base, that group's end row) — the group is the
    number of groups whose aligned end is at or before row_base. The ends are counted 64 at a time:
    lane l reads the end of group base + l and a ballot's popcount counts those before row_base; the
    ends do not decrease, so a chunk with a group end past row_base (popcount < 64) or the last
    chunk ends the search (G <= 64: one pass). Every value is uniform: a scalar loop, no sync.
    Past the last group's aligned end the end is 0 (no group)."""
    lane = Int(fx.thread_idx.x.ir_value()) % 64
    ends = B.rsrc(layout, groups * 4)
    search = scf.WhileOp([B.i32, B.i32], [B.c(0), B.c(0)])
    before = search.before.blocks.append(B.i32, B.i32)
    with ir.InsertionPoint(before):
        base = Int(before.arguments[0])
        g = base + lane
        end = Int(rocdl.raw_ptr_buffer_load(B.i32, ends, g * 4, B.c(0), aux=B.c_attr(0)))
        ended = arith.andi(B.cmp("ult", g, groups), B.cmp("sle", (end + (M_ALIGN - 1)) & -M_ALIGN, row_base))
        count = Int(arith.trunci(B.i32, llvm.intr_ctpop(rocdl.ballot(B.i64, ended))))
        more = arith.andi(B.cmp("eq", count, B.c(64)), B.cmp("slt", base + 64, groups))
        scf.ConditionOp(more, [base, count])
    after = search.after.blocks.append(B.i32, B.i32)
    with ir.InsertionPoint(after):
        scf.YieldOp([Int(after.arguments[0]) + 64, after.arguments[1]])
    group = Int(search.results[0]) + Int(search.results[1])
    has = B.cmp("slt", group, groups)
    return group, Int(B.sel(has, B.gload(B.i32, layout, Int(B.sel(has, group, B.c(0))) * 4, 4), B.c(0)))


def _xcd_tile(B, n_tiles, m_tiles, band):
    """(column tile, band, row tile in the band) of this workgroup. Workgroup w (x fastest) runs on
    XCD w % XCDS, so in grid order each XCD would take every eighth column tile of every row tile:
    the A rows of every group through each XCD's L2. Instead each XCD takes a contiguous run of the
    tile order (bands of ``band`` row tiles, each band column tile by column tile, its row tiles
    together), so an XCD reads the A rows of few bands and each B tile once for its band. The grid's
    last w % XCDS workgroups keep their place; a permutation of the grid. Every load waits for it,
    so its divisions are small_divmod's (the op keeps the grid under 2**21 workgroups)."""
    w = Int(fx.block_idx.x.ir_value()) + Int(fx.block_idx.y.ir_value()) * n_tiles
    total = n_tiles * m_tiles
    dealt = total - total % XCDS
    q = Int(B.sel(B.cmp("slt", w, dealt), w % XCDS * (dealt // XCDS) + w // XCDS, w))
    band_index, r = B.small_divmod(q, n_tiles * band)
    first = band_index * band                       # the band's first row tile
    rows_in_band = Int(B.sel(B.cmp("slt", m_tiles - first, band), m_tiles - first, band))
    column, row = B.small_divmod(r, rows_in_band)
    return column, band_index, row


def _body(bm, bn, masked, psum, ue8m0, b_fmt, out, sfa_kmajor, a, sfa, b, sfb, d, layout, rows, n, k, m_max, groups,
          zero_pad, sfa_st, sfb_st, lds):
    rows, n, k, m_max, groups = map(Int, (rows, n, k, m_max, groups))
    if b_fmt == "bf16":
        k = k * 2                                   # from here on: bytes of a row of a (and of b)
    sfa_sg, sfa_sm = map(Int, sfa_st[:2])
    B = Builder()
    tiles = (m_max + (bm - 1)) // bm                # masked: a group's row tiles, a band of the XCD order
    bx, band_index, row = (_xcd_tile(B, n // bn, groups * tiles, tiles) if masked
                           else _xcd_tile(B, n // bn, (rows + (bm - 1)) // bm, B.c(BAND)))
    if masked:
        group = band_index                          # masked: a band is a group's row tiles
        m_in_group = row * bm
        limit = B.gload(B.i32, layout, group * 4, 4)
        row_base = group * m_max + m_in_group
        run = B.cmp("slt", m_in_group, limit)
        active, pad = run, None
        sfa_tile = group * sfa_sg + m_in_group * sfa_sm   # byte of the scales of the tile's row 0

        def row_ok(rl):
            return B.cmp("slt", m_in_group + rl, limit)
    elif psum:
        row_base = (band_index * BAND + row) * bm
        group, end = _psum_group(B, layout, groups, row_base)
        run = B.cmp("slt", row_base, end)

        def row_ok(rl):
            return B.cmp("slt", row_base + rl, end)
    else:
        row_base = (band_index * BAND + row) * bm
        group = Int(B.gload(B.i32, layout, row_base * 4, 4))
        run = arith.andi(B.cmp("sge", group, B.c(0)), B.cmp("slt", group, groups))

        def row_ok(rl):
            r = row_base + rl
            inside = B.cmp("slt", r, rows)
            owner = B.gload(B.i32, layout, Int(B.sel(inside, r, row_base)) * 4, 4)
            return arith.andi(arith.andi(inside, B.cmp("eq", owner, group)), run)
    if not masked:
        # zero_pad: rows of no group are written as zeros, a tile of padding rows only too (its
        # K loop empty, its loads reading group 0's addresses through the empty resource)
        pad = B.cmp("ne", Int(zero_pad), B.c(0))
        active = arith.ori(run, pad)
        group = Int(B.sel(run, group, B.c(0)))
        sfa_tile = row_base * sfa_sm
    if_run = scf.IfOp(active, [], has_else=False)
    with ir.InsertionPoint(if_run.then_block):
        t = _tile(B, bm, bn, ue8m0, b_fmt, out, sfa_kmajor, rows, n, k, lds, group, bx * bn, row_base, row_ok, sfa_tile,
                  tuple(map(Int, sfa_st)), tuple(map(Int, sfb_st)), None if masked else run, pad)
        _epilogue(t, _k_loop(t, *_loaders(t, a, sfa, b, sfb, d)))
        scf.YieldOp([])


def _tile(B, bm, bn, ue8m0, b_fmt, out, sfa_kmajor, rows, n, k, lds, group, n0, row_base, row_ok, sfa_tile, sfa_st,
          sfb_st, run, pad):
    """What every part of one workgroup's tile uses: its geometry, this lane's place in it, the
    K blocks (k in bytes). run: whether the tile has a group (None: always, the masked layout);
    pad: write rows of no group as zeros (None: never)."""
    b_lds = b_through_lds(b_fmt)
    t = SimpleNamespace(
        B=B, bm=bm, bn=bn, ue8m0=ue8m0, fp4=b_fmt == "e2m1", bf16=b_fmt == "bf16", b_fmt=b_fmt, out=out, rows=rows,
        n=n, k=k, lds=lds,
        group=group, n0=n0, row_base=row_base,
        row_ok=row_ok, sfa_tile=sfa_tile, sfa_st=sfa_st, sfb_st=sfb_st, run=run, pad=pad,
        wm_rows=bm // 2, wn_cols=bn // 2, m_tiles=bm // 2 // 16, n_tiles=bn // 2 // 16,
        dmas=bm * (BLOCK_K // 16) // THREADS,        # 16-byte A chunks per thread per K block
        b_lds=b_lds, bdmas=bn * (BLOCK_K // 16) // THREADS if b_lds else 0,   # B's, when b_lds
        buf_bytes=buffer_bytes(bm, bn, b_fmt), depth=load_depth(bm, bn, b_fmt == "bf16"),
        window=sfa_window(bm, bn, sfa_kmajor))
    t.buffers = t.depth + 1
    t.tid = Int(fx.thread_idx.x.ir_value())
    lane = t.tid % 64
    t.wave = Int(rocdl.readfirstlane(B.i32, t.tid // 64))
    t.g, t.r16 = lane // 16, lane % 16
    t.wm, t.wn = t.wave >> 1, t.wave & 1
    t.kb = (k + (BLOCK_K - 1)) // BLOCK_K           # K blocks, the last one possibly partial
    if run is not None:
        t.kb = Int(B.sel(run, t.kb, B.c(0)))        # a padding tile: no K block, a zero accumulator
    t.last = t.kb - 1
    t.tail = k - t.last * BLOCK_K                   # bytes of K in the last block
    return t


def _last_block(t, offsets, in_block):
    """The offsets for the last K block: 16-byte chunks at or past its end made out of range
    (loads of 0) instead of reading on into the next row."""
    B = t.B
    return [B.sel(B.cmp("ult", c, t.tail), o, B.c(INVALID_OFFSET)) for o, c in zip(offsets, in_block)]


def _loaders(t, a, sfa, b, sfb, d):
    """The global loads of one K block: load_step(kt, live) -> (B halves [n-tile][2] (none when b
    goes through LDS), sfa [m-tile], sfb) into registers, dma_step(kt, live): A (and B) into its
    LDS buffer by buffer->LDS DMA; past the end (live false) both read the empty resource."""
    B, (sfa_sk4, sfa_sk1), (sfb_sg, sfb_sn, sfb_sk4, sfb_sk1, sfb_shift) = t.B, t.sfa_st[2:], t.sfb_st
    a_rsrc = B.rsrc(a, t.rows * t.k)
    # strided scales: range checks only reject INVALID_OFFSET; K-major windows: up to the tensor's end
    sfa_rsrc = B.rsrc(sfa, t.rows * t.sfa_st[1] if t.window else B.c(INVALID_OFFSET - 1))
    row_bytes = t.k // 2 if t.fp4 else t.k            # of b: e2m1 packs two K per byte
    b_rsrc = B.rsrc(B.gep(b, arith.muli(B.u64(t.group), B.u64(t.n * row_bytes))), t.n * row_bytes)
    sfb_group = t.group * sfb_sg
    t.d_rsrc = B.rsrc(d, t.rows * t.n * 2)
    t.null_rsrc = B.rsrc(llvm.mlir_zero(B.gptr), B.c(0))
    dma_voff, dma_chunk = _dma_offsets(t, t.dmas, lambda rl: (t.row_base + rl) * t.k, t.row_ok)
    dma_voff_last = _last_block(t, dma_voff, dma_chunk)
    t.a_lds_off, sfa_voff = _lane_rows(t)
    # This lane's columns (MFMA src0 rows) of each n-tile: offsets into b (e4m3: K bytes 16g..
    # and 64 + 16g.. of the block; e2m1: K 32g.. in 16 bytes) and, per lane for UE8M0 (the
    # scaled MFMA takes row n's scale for 32-K block j from lane n + 16 j), into sfb.
    cols = [t.n0 + (t.wn * t.wn_cols + (nt * 16 + t.r16)) for nt in range(t.n_tiles)]
    k_of_chunk = [t.g * FP4_BLOCK] if t.fp4 else [t.g * 16 + 64 * h for h in range(2)]
    b_voff = [] if t.b_lds else [[c * row_bytes + t.g * 16 + 64 * h for h in range(len(k_of_chunk))] for c in cols]
    b_voff_last = [_last_block(t, chunks, k_of_chunk) for chunks in b_voff]
    b_dma_voff, b_dma_chunk = _dma_offsets(t, t.bdmas, lambda rl: (t.n0 + rl) * row_bytes)
    b_dma_voff_last = _last_block(t, b_dma_voff, b_dma_chunk)
    if t.fp4:  # one scale per row of b and 32-K block: lane group g reads block 4 kt + g
        sfb_rsrc = B.rsrc(sfb, B.c(INVALID_OFFSET - 1))
        sfb_voff = [sfb_group + c * sfb_sn + t.g * sfb_sk1 for c in cols]
        sfb_voff_last = _last_block(t, sfb_voff, k_of_chunk * len(cols))   # a block past K: byte 0, not NaN
    elif t.ue8m0:
        sfb_rsrc = B.rsrc(sfb, B.c(INVALID_OFFSET - 1))
        sfb_voff = [sfb_group + (c >> sfb_shift) * sfb_sn for c in cols]
    elif not t.bf16:  # one fp32 scale per 128 columns: uniform over the workgroup (BN divides 128)
        sfb_row = B.gep(sfb, sfb_group + (t.n0 >> sfb_shift) * sfb_sn)
    scale_t = B.i8 if t.ue8m0 else B.f32
    window_t = ir.VectorType.get([t.window // 4], B.f32) if t.window else None

    def k_block(kt, sk4, sk1):
        """Byte offset of K block kt in a scale tensor."""
        return (kt >> 2) * sk4 + (kt & 3) * sk1

    def load_step(kt, live, at=0, prev=None):
        """Step kt's register loads -> (B halves, sfa [m-tile], sfb, sfa windows [m-tile]; with windows
        sfa is [], the step takes its scales from the window); ``at``: kt's place in its sfa window
        (known at trace time), prev: step kt - 1's registers (its windows)."""
        br, sr = llvm.select(live, b_rsrc, t.null_rsrc), llvm.select(live, sfa_rsrc, t.null_rsrc)
        soff, is_last = kt * (BLOCK_K // 2 if t.fp4 else BLOCK_K), B.cmp("eq", kt, t.last)
        bw = [[rocdl.raw_ptr_buffer_load(B.v4i32, br, B.sel(is_last, last, v), soff, aux=B.c_attr(0))
               for v, last in zip(chunks, lasts)] for chunks, lasts in zip(b_voff, b_voff_last)]
        if t.bf16:
            return bw, [], [], []                    # no scales
        win = []
        if not t.window:
            sa = [rocdl.raw_ptr_buffer_load(scale_t, sr, sfa_voff[mt], k_block(kt, sfa_sk4, sfa_sk1), aux=B.c_attr(0))
                  for mt in range(t.m_tiles)]
        else:  # K-major: K block kt at byte 4 kt of the row (sfa_voff holds the lane group's part)
            win = prev[3] if at else [rocdl.raw_ptr_buffer_load(window_t, sr, sfa_voff[mt] + kt * 4, B.c(0),
                                                                aux=B.c_attr(0)) for mt in range(t.m_tiles)]
            sa = []
        if t.fp4:
            sbr = llvm.select(live, sfb_rsrc, t.null_rsrc)
            sb = [rocdl.raw_ptr_buffer_load(B.i8, sbr, B.sel(is_last, last, v), kt * sfb_sk4, aux=B.c_attr(0))
                  for v, last in zip(sfb_voff, sfb_voff_last)]
            return bw, [arith.extui(B.i32, x) for x in sa], [arith.extui(B.i32, x) for x in sb], win
        if t.ue8m0:
            sbr, sbk = llvm.select(live, sfb_rsrc, t.null_rsrc), k_block(kt, sfb_sk4, sfb_sk1)
            sb = [rocdl.raw_ptr_buffer_load(B.i8, sbr, v, sbk, aux=B.c_attr(0)) for v in sfb_voff]
            return bw, [arith.extui(B.i32, x) for x in sa], [arith.extui(B.i32, x) for x in sb], win
        return bw, sa, [B.gload(B.f32, sfb_row, k_block(Int(B.sel(live, kt, B.c(0))), sfb_sk4, sfb_sk1), 4)], win

    def dma_step(kt, live, slot):
        lds_buf = B.gep(t.lds, kt % t.buffers * t.buf_bytes)
        is_last = B.cmp("eq", kt, t.last)
        for rsrc, base, voffs, lasts in ((a_rsrc, 0, dma_voff, dma_voff_last),
                                         (b_rsrc, t.bm * BLOCK_K, b_dma_voff, b_dma_voff_last)):
            rs = llvm.select(live, rsrc, t.null_rsrc)
            for j, (v, last) in enumerate(zip(voffs, lasts)):
                dst = B.gep(lds_buf, B.c(base + j * THREADS * 16) + t.wave * 1024)
                rocdl.raw_ptr_buffer_load_lds(rs, dst, B.c(16), B.sel(is_last, last, v), kt * BLOCK_K, B.c(0),
                                              aux=B.c_attr(0), **_scopes(t, slot))
    return load_step, dma_step


def _scopes(t, slot) -> dict:
    """Alias scopes of LDS buffer ``slot`` (the DMAs writing it, the reads of it); one buffer
    pair (depth 1): none needed."""
    if t.depth == 1:
        return {}
    if not hasattr(t, "lds_scopes"):
        t.lds_scopes = lds_alias_scopes(t.buffers, "tile buffers")
    return t.lds_scopes[slot]


def _dma_offsets(t, dmas, row_offset, row_ok=None):
    """A (or B) tile DMA: thread slot s = j*256 + tid fills LDS bytes 16s.. of the tile, i.e. tile
    row s/8, memory chunk (s%8) ^ (row&7); rows not row_ok load from an invalid offset (zeros).
    -> (global offsets, their byte within the K block)."""
    B, voff, chunk_bytes = t.B, [], []
    for j in range(dmas):
        s = B.c(j * THREADS) + t.tid
        rl = s // 8
        chunk = s % 8 ^ rl & 7
        v = row_offset(rl) + chunk * 16
        voff.append(v if row_ok is None else B.sel(row_ok(rl), v, B.c(INVALID_OFFSET)))
        chunk_bytes.append(chunk * 16)
    return voff, chunk_bytes


def _tile_lds_offsets(t, base, rl):
    """LDS offsets of row rl's memory chunks g and g+4 in a swizzled tile at ``base``."""
    return [base + rl * BLOCK_K + ((t.g + 4 * h) ^ rl & 7) * 16 for h in range(2)]


def _lane_rows(t):
    """This lane's rows (MFMA src1 columns): LDS offsets of memory chunks g and g+4, sfa offsets;
    and, b through LDS, its B rows' (MFMA src0 rows) chunk offsets per n-tile."""
    B, a_lds_off, sfa_voff = t.B, [], []
    for mt in range(t.m_tiles):
        rl = t.wm * t.wm_rows + (mt * 16 + t.r16)
        a_lds_off.append(_tile_lds_offsets(t, 0, rl))
        quarter = t.g * t.window if t.window else 0    # bytes: lane group g's window/4 blocks, 4 bytes each
        sfa_voff.append(B.sel(t.row_ok(rl), t.sfa_tile + rl * t.sfa_st[1] + quarter, B.c(INVALID_OFFSET)))
    t.b_lds_off = [_tile_lds_offsets(t, t.bm * BLOCK_K, t.wn * t.wn_cols + (nt * 16 + t.r16))
                   for nt in range(t.n_tiles)] if t.b_lds else []
    return a_lds_off, sfa_voff


def _zeros(B):
    return arith.constant(B.v4i32, ir.DenseElementsAttr.get_splat(B.v4i32, B.c_attr(0)))


def _cat(B, halves):
    """v8i32 MFMA operand: e4m3 halves, or one e2m1 chunk in the low half (zeros above)."""
    return llvm.shufflevector(B.v8i32, halves[0], halves[1] if len(halves) == 2 else _zeros(B), list(range(8)))


def _k_loop(t, load_step, dma_step):
    """The K loop: per K block, the MFMAs of the block loaded t.depth steps earlier while step
    kt + t.depth is prefetched. -> the fp32 accumulators [n-tile][m-tile]."""
    B = t.B
    zero_acc = B.splat(B.v4f32, 0.0)
    one = B.c(E8M0_ONE)

    v8bf16 = ir.VectorType.get([8], B.bf16)

    def read_tile(kt, slot, win):
        """Step kt's operands from its LDS buffer: A halves [m-tile] (and B halves [n-tile]); and its
        sfa [m-tile] out of the windows: block j of a window is element j % c of lane group j // c
        (c = window / 4), which a ds_bpermute brings to the row's four lanes."""
        tile = B.gep(t.lds, kt % t.buffers * t.buf_bytes)

        def read(offsets):
            return [[llvm.load(B.v4i32, B.gep(tile, o), alignment=16, **_scopes(t, slot % t.buffers)) for o in row]
                    for row in offsets]
        halves = read(t.a_lds_off)
        holder, at = divmod(window_at(slot), t.window // 4 or 1)
        sa = [llvm.bitcast(B.f32, rocdl.ds_bpermute(B.i32, t.r16 * 4 + holder * 64,
                                                     llvm.bitcast(B.i32, llvm.extractelement(w, B.c(at)))))
              for w in win]
        return (halves if t.bf16 else [_cat(B, hs) for hs in halves]), read(t.b_lds_off), sa

    def run_step(kt, acc, cur, slot, in_flight):
        bw, sa, sb, win = cur[0]
        (af, b_tile, win_sa), nxt = pipelined_step(B, kt, t.kb, lambda kt: read_tile(kt, slot, win),
                                          lambda kn, live: load_step(kn, live, window_at(slot + t.depth), cur[-1]),
                                          lambda kt, live: dma_step(kt, live, (slot + t.depth) % t.buffers), t.depth,
                                          in_flight)
        bw, sa = b_tile or bw, win_sa or sa
        nxt = (*cur[1:], nxt)
        acc = [list(x) for x in acc]
        if t.bf16:  # K half h of the block: bytes 16g + 64h of each row, one 16x16x32 MFMA
            for h in range(2):
                for mt in range(t.m_tiles):
                    for nt in range(t.n_tiles):
                        acc[nt][mt] = fx.rocdl.mfma_f32_16x16x32_bf16(
                            B.v4f32, [llvm.bitcast(v8bf16, bw[nt][h]), llvm.bitcast(v8bf16, af[mt][h]), acc[nt][mt]])
            fx.rocdl.sched_barrier(0)
            return acc, nxt
        if not t.ue8m0:
            promote = [B.splat_value(B.v4f32, arith.mulf(sa[mt], sb[0])) for mt in range(t.m_tiles)]
        for mt in range(t.m_tiles):
            for nt in range(t.n_tiles):
                if t.ue8m0:
                    acc[nt][mt] = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(
                        B.v4f32, [_cat(B, bw[nt]), af[mt], acc[nt][mt], FMT_CODE[t.b_fmt], 0, 0, sb[nt], 0, sa[mt]])
                else:
                    p = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(
                        B.v4f32, [_cat(B, bw[nt]), af[mt], zero_acc, 0, 0, 0, one, 0, one])
                    acc[nt][mt] = arith.addf(acc[nt][mt], arith.mulf(p, promote[mt]))
        fx.rocdl.sched_barrier(0)
        return acc, nxt

    def window_at(step):
        """A step's place in its sfa window; steps are loop slots (iterations of one window each)."""
        return step % t.window if t.window else 0

    first = B.c(1, B.i1) if t.run is None else t.run
    regs = []
    for kt in range(t.depth):   # the prologue: steps 0 .. depth-1 in flight
        live = first if kt == 0 else arith.andi(first, B.cmp("slt", B.c(kt), t.kb))
        regs.append(load_step(B.c(kt), live, window_at(kt), regs[-1] if kt else None))
        dma_step(B.c(kt), live, kt)
    # the vector-memory ops a step's barrier may leave pending: those of the step before it, the loads
    # of step kt + 1 (fp32 sfb not counted: it may be a scalar load; sfa only where a window starts;
    # counting fewer only waits longer); in the last steps the DMA only: the registers' loads there are
    # past the end, dead code the compiler removes
    bw, sa, sb, _ = regs[0]

    def in_flight(slot):
        if t.depth == 1:
            return 0
        sfa_loads = t.m_tiles if window_at(slot + 1) == 0 else 0
        return len(flatten(bw)) + sfa_loads + (len(sb) if t.ue8m0 else 0) + t.dmas + t.bdmas
    in_flight_last = 0 if t.depth == 1 else t.dmas + t.bdmas
    # bf16: the pair's second register set takes 128 x 128 to 170 VGPRs (2 workgroups per CU, not 3), which
    # costs more than the overlap gains (masked m 512, N 7168, K 256: 24.33 -> 25.32 us on the model)
    return k_loop(t.kb, [[zero_acc] * t.m_tiles for _ in range(t.n_tiles)], regs,
                  lambda kt, acc, cur, slot: run_step(kt, acc, cur, slot, in_flight(slot)),
                  unroll=1 if t.bf16 else t.window or t.depth + 1, tail_step=lambda *a: run_step(*a, in_flight_last))


def _epilogue(t, acc):
    """CShuffle: the converted BM x BN tile goes through LDS (reusing the tile buffers) so that d is
    written in 16-byte row chunks. C tile row pitch BN*2 bytes; 16-byte chunk c of row r sits at
    chunk c ^ (r % chunks) (the 16 rows one MFMA tile writes hit distinct banks)."""
    B, bn = t.B, t.bn
    chunks = bn * 2 // 16
    out_t = ir.VectorType.get([4], ir.BF16Type.get() if t.out == "bf16" else ir.F16Type.get())
    v2i32 = ir.VectorType.get([2], B.i32)

    def c_tile_offset(row, col):  # col: element column, a multiple of 4
        chunk = col >> 3 ^ row % chunks
        return row * (bn * 2) + (chunk * 16 + (col & 4) * 2)

    loads_done_barrier()  # every wave is past its last tile reads and its last (empty) DMA
    for mt in range(t.m_tiles):
        row = t.wm * t.wm_rows + (mt * 16 + t.r16)
        for nt in range(t.n_tiles):
            col = t.wn * t.wn_cols + (nt * 16 + t.g * 4)
            packed = llvm.bitcast(v2i32, arith.truncf(out_t, acc[nt][mt]))
            llvm.store(packed, B.gep(t.lds, c_tile_offset(row, col)), alignment=8)
    loads_done_barrier()
    rows_per_pass = THREADS // chunks
    for p in range((t.bm + rows_per_pass - 1) // rows_per_pass):
        row = B.c(p * rows_per_pass) + t.tid // chunks
        col = t.tid % chunks * 8
        live = B.cmp("slt", row, B.c(t.bm))
        row = Int(B.sel(live, row, B.c(0)))  # the threads of a partial last pass read row 0, store nothing
        v = llvm.load(B.v4i32, B.gep(t.lds, c_tile_offset(row, col)), alignment=16)
        ok = arith.andi(live, t.row_ok(row))
        if t.pad is not None:  # a row of no group inside d: zeros
            v = B.sel(ok, v, _zeros(B))
            ok = arith.andi(live, arith.ori(ok, arith.andi(t.pad, B.cmp("slt", t.row_base + row, t.rows))))
        voff = B.sel(ok, ((t.row_base + row) * t.n + (t.n0 + col)) * 2, B.c(INVALID_OFFSET))
        rocdl.raw_ptr_buffer_store(v, t.d_rsrc, voff, B.c(0), aux=B.c_attr(0))


def build(symbol: str, bm=128, bn=128, masked=0, psum=0, ue8m0=0, a_fmt="e4m3", b_fmt=None, out="bf16", sfa_kmajor=0):
    """The ``@flyc.jit`` launcher for one variant (compile-only use; see compile_for_build);
    b_fmt None: a's format."""
    b_fmt = b_fmt or a_fmt
    _check(bm, bn, masked, psum, ue8m0, a_fmt, b_fmt, out, sfa_kmajor)

    @fx.struct
    class SharedStorage:
        buf: fx.Array[fx.Int8, (load_depth(bm, bn, a_fmt == "bf16") + 1) * buffer_bytes(bm, bn, b_fmt), 16]

    @flyc.kernel(name=symbol)
    def blockscale_grouped_gemm_kernel(a: fx.Pointer, sfa: fx.Pointer, b: fx.Pointer, sfb: fx.Pointer, d: fx.Pointer,
                             layout: fx.Pointer, rows: fx.Int32, n: fx.Int32, k: fx.Int32, m_max: fx.Int32,
                             groups: fx.Int32, zero_pad: fx.Int32, sfa_sg: fx.Int32, sfa_sm: fx.Int32,
                             sfa_sk4: fx.Int32, sfa_sk1: fx.Int32, sfb_sg: fx.Int32, sfb_sn: fx.Int32,
                             sfb_sk4: fx.Int32, sfb_sk1: fx.Int32, sfb_shift: fx.Int32):
        lds = fx.SharedAllocator().allocate(SharedStorage).peek()
        _body(bm, bn, masked, psum, ue8m0, b_fmt, out, sfa_kmajor,
              *[fx.to_llvm_ptr(p) for p in (a, sfa, b, sfb, d, layout)],
              *[v.ir_value() for v in (rows, n, k, m_max, groups, zero_pad)],
              [v.ir_value() for v in (sfa_sg, sfa_sm, sfa_sk4, sfa_sk1)],
              [v.ir_value() for v in (sfb_sg, sfb_sn, sfb_sk4, sfb_sk1, sfb_shift)], fx.to_llvm_ptr(lds.buf.ptr))

    @flyc.jit
    def blockscale_grouped_gemm(a: fx.Pointer, sfa: fx.Pointer, b: fx.Pointer, sfb: fx.Pointer, d: fx.Pointer,
                      layout: fx.Pointer, rows: fx.Int32, n: fx.Int32, k: fx.Int32, m_max: fx.Int32,
                      groups: fx.Int32, zero_pad: fx.Int32, sfa_sg: fx.Int32, sfa_sm: fx.Int32, sfa_sk4: fx.Int32,
                      sfa_sk1: fx.Int32, sfb_sg: fx.Int32, sfb_sn: fx.Int32, sfb_sk4: fx.Int32, sfb_sk1: fx.Int32,
                      sfb_shift: fx.Int32, m_tiles: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        blockscale_grouped_gemm_kernel(a, sfa, b, sfb, d, layout, rows, n, k, m_max, groups, zero_pad, sfa_sg, sfa_sm,
                                       sfa_sk4, sfa_sk1, sfb_sg, sfb_sn, sfb_sk4, sfb_sk1, sfb_shift).launch(
            grid=(n // bn, m_tiles, 1), block=(THREADS, 1, 1), stream=stream)

    return blockscale_grouped_gemm


def compile_for_build(arch: str, symbol: str, BM=128, BN=128, MASKED=0, PSUM=0, UE8M0=0, A_FMT="e4m3", B_FMT=None,
                      OUT="bf16", SFA_KMAJOR=0):
    """Trace + compile once (arch from FLYDSL_GPU_ARCH, set by the build); returns the jit fn.
    Null pointers and Python ints are compile placeholders: nothing touches a device."""
    fn = build(symbol, BM, BN, MASKED, PSUM, UE8M0, A_FMT, B_FMT, OUT, SFA_KMAJOR)
    p = lambda t: flyc.from_c_void_p(t, 0)  # noqa: E731
    u8, f32, i32 = fx.Uint8, fx.Float32, fx.Int32
    sf = u8 if UE8M0 else f32
    ab = fx.BFloat16 if A_FMT == "bf16" else u8
    flyc.compile(fn, p(ab), p(sf), p(ab), p(sf), p(fx.BFloat16 if OUT == "bf16" else fx.Float16), p(i32),
                 BM, BN, BLOCK_K, BM, 1, 0, BM, 1, 4, 1, 4, 1, 4, 1, 7, 1)
    return fn
