"""MX GEMM for prefill: out[m, n] = sum_k A[m, k] B[n, k] with 1x32 e8m0 K-block scales (MXFP8,
MXFP6, MXFP4, A8W4), one body for every target.

Operands: a [M, K] (fp8 bytes), [M, 3K/4] (e2m3 / e3m2: a little-endian 6-bit string, four
codes in three bytes) or [M, K/2] (e2m1 packed two per byte, even k in the low nibble), b [N, K]
likewise, a_scale [M, K/32] and b_scale [N, K/32] e8m0 bytes; out [M, N] bf16 / f16 / f32.
SCALE_SHUFFLED=1 (gfx950) takes both scales pre-shuffled instead (mxgemm.quant.shuffle_scales, the
layout of aiter's e8m0_shuffle and Triton's CDNA4 tutorial): each 32-row group's bytes contiguous, K
rounded up to 256, one dword per MMA lane holding its scales of two 16-row tiles and two K steps, so
the scale lines a wave reads are whole and no lane exchange is needed (the MMA's op_sel picks the
byte); each dword is refilled from the next window once its two steps have run.
A_FMT, B_FMT in {e4m3, e5m2, e2m3, e3m2, e2m1} (gfx1250: no FP6). The element width (8 / 6 / 4
bits) is a parameter of the one body: a row's K step is 128 / 96 / 64 bytes (8 / 6 / 4 chunks of
16 bytes).

The seam. The body (`_body`) owns everything that does not depend on the target: the tiling
(a BM x BN output tile per workgroup, WAVES waves as WAVES/2 x 2, each wave (2 BM / WAVES) x
(BN/2) in 16 x 16 tiles), the split of the K steps over grid z, 64-bit tile rebasing, the LDS
ring of NUM_BUFFERS stages of STAGE_STEPS K steps each, the K loop (wait for stage kt, read its
fragments, issue stage kt+1, MMA) and the epilogue (masked stores, or fp32 atomics for split-K).
STAGE_STEPS 2 (MXFP4) makes a row's stage 128 bytes, a whole cache line: with one 64-byte step
per stage, the next step fetches the same lines again. A target object supplies the
rest, chosen by `compile_for_build(arch, ...)` from TARGETS:
  wave                     lanes per wave
  stage_loads(...)         global -> LDS of one operand's K step (and its scale bytes)
  stage_wait()             the wait + workgroup barrier that makes a stage visible
  fragment(op, buf, r0)    LDS -> the MMA operand registers of rows r0 .. r0+15
  mma                      the scaled 16x16x128 MMA atom
  window_* / scale_plan... where its scale bytes come from (VGPR windows on gfx950, LDS on gfx1250)
  acc_coords(lane)         (row, first column) of a lane's accumulator elements (consecutive)
gfx950 (`Gfx950`): wave64, 16-byte buffer -> LDS DMA (LDS chunk c of row r holds memory chunk
c ^ (r % chunks_per_row) for 8 or 4 chunks; FP6's 6 chunks stay in place), a wave-uniform
branch skipping the waves past the tile in a last partial DMA issue (FP6 64-row tiles: 6 KiB),
FP6 fragments as three 8-byte LDS reads (24 bytes per lane, 6 VGPRs of the 8 the MFMA
operand is given; docs/gfx950_isa.md §1.3), scale windows: a loop iteration is WINDOW_TURNS
turns of the NUM_BUFFERS-stage ring, each stage on a buffer known at trace time; its last stage
loads the next iteration's K-block bytes of each row into VGPRs, spread over the 4 lane groups,
and each stage takes its bytes from the lane group holding them (ds_bpermute): one touch of a
row's scale line per iteration, where per-stage byte loads touched it every stage, after the
operand DMA had evicted it from L1 (NUM_BUFFERS 3: the DMA two stages ahead, the buffers told apart by alias scopes),
v_mfma_scale_f32_16x16x128_f8f6f4 with src0 = B rows and src1 = A rows, so lane l accumulates
out[m = l % 16][n = 4 (l / 16) + i], i < 4.
gfx1250 (`Gfx1250`; run on the gfx1250 emulator, docs/gfx1250_isa.md): wave32 (128
threads), Tensor Data Mover tile loads (tensor_load_to_lds, one wave per tile, rows padded by 16
bytes in LDS, rows past M / N land as zeros), scale words (four K-block bytes of a row) staged in
LDS after the A and B tiles, v_wmma_scale_f32_16x16x128_f8f6f4 (or _32x16x128_f4 for fp4 x fp4)
with src0 = B rows, src1 = A rows: lane l accumulates out[m = l % 16][n = 8 (l / 16) + i], i < 8.
Its options (SCALE_PATH, B_STREAMING, CLUSTER_M / CLUSTER_N, F4_WIDE) are described at the
class; NUM_BUFFERS 2..4 keeps NUM_BUFFERS-1 steps in flight. A cluster launch rounds the grid up
to whole clusters.

Numerics (mxgemm.reference.mx_gemm_ref with chunk=128 models it exactly): each MMA sums one
128-wide K step (four scaled 32-blocks) exactly and rounds once to fp32, then adds it to the
fp32 accumulator (one more RNE rounding); steps are added in increasing K from +0. The
epilogue rounds to bf16 / f16 (RNE) or stores fp32. SPLITK=1: grid z cuts the K steps into
`splits` contiguous ranges of ceil(steps / splits); each adds its fp32 partial into out (f32,
zeroed by the caller) with buffer_atomic_add_f32: deterministic for splits <= 2 (fp32 addition
commutes), otherwise arrival order decides the last roundings.

Tails: rows past M, columns past N load as zero (voffset 0x80000000 is out of range) and are
never stored; K % 128 == 0. 64-bit addressing: every buffer resource starts at the tile's
first row (and the split's first K step), so a 32-bit voffset spans one tile: BM rows of a or
a_scale, BN rows of b, BM rows of out.

Kernel arguments: a, a_scale, b, b_scale, out (pointers), M, N, K, splits (int32).
Launch: grid = (ceil(N / BN), ceil(M / BM), splits), block = (WAVES * wave, 1, 1).
Variant keys: A_FMT, B_FMT, BM, BN (64, 128, 256), OUT (bf16, f16, f32), SPLITK (0, 1; 1 needs
OUT=f32), NUM_BUFFERS (gfx950 2, or 3 without FP6; gfx1250 2..4), STAGE_STEPS (1; gfx950 2 without
SPLITK); gfx950 also WAVES (4, or 8: twice the waves per CU, twice the LDS reads of B) and
WINDOW_TURNS (1..4: a scale window of n ring turns touches a row's scale line 1/n as often, for
up to n times its VGPRs) and SCALE_SHUFFLED (0, 1); gfx1250 also SCALE_PATH, B_STREAMING, CLUSTER_M, CLUSTER_N, F4_WIDE.
"""
import contextlib
from types import SimpleNamespace

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl, scf, vector
from ir_builder import (
    BUFFER_FLAGS,
    INVALID_OFFSET,
    WAIT_LGKMCNT0,
    Builder,
    Int,
    k_loop,
    lds_alias_scopes,
    loads_done_barrier,
    workgroup_barrier,
)

BK = 128                           # K per step = the MMA's K
SCALE_BLOCK = 32
FMT_CODE = {"e4m3": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}   # MMA cbsz / blgp (docs/gfx950_isa.md §1.2)
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}        # element bits
TILES = (64, 128, 256)
OUTS = ("bf16", "f16", "f32")
WAVES = 4                          # per workgroup, as WAVES / 2 rows x 2 columns (gfx950 option WAVES: 4 or 8)
SCALE_PATHS = ("tdm", "buffer_lds_stage", "buffer_lds_stage_ab_split")   # gfx1250
CLUSTER_BARRIER = -3               # s_barrier_signal / _wait id of the cluster barrier (docs/gfx1250_isa.md §5)


def wave_index(b, wave):
    """This thread's wave in the workgroup, a uniform value (readfirstlane)."""
    return Int(rocdl.readfirstlane(b.i32, Int(fx.thread_idx.x.ir_value()) // wave))


class Operand:
    """One operand tile in LDS: `rows` rows (BM for A, BN for B) of `steps` K steps each."""

    def __init__(self, rows, fmt, lds_off, pad=0, steps=1):
        self.rows, self.fmt, self.lds_off = rows, fmt, lds_off
        self.bits = BITS[fmt]
        self.step_bytes = BK * self.bits // 8                     # bytes of one row per K step
        self.row_bytes = steps * self.step_bytes                  # bytes of one row per stage
        self.chunks = self.row_bytes // 16                        # 16-byte chunks per row
        self.frag_bytes = 32 * self.bits // 8                     # one lane's 32 values of a row
        self.row_stride = self.row_bytes + pad                    # LDS bytes from row to row
        self.lds_bytes = rows * self.row_stride

    def swizzle(self, byte, row):
        """Where chunk-aligned byte `byte` of row `row`'s stage sits in LDS (an involution): chunk
        c ^ (row % chunks) for a power-of-two chunk count, spreading a column of rows over LDS
        banks; FP6 rows (6 chunks, whose 24-byte fragments straddle chunks) are not swizzled."""
        return byte ^ Int(row) % self.chunks * 16 if self.chunks & (self.chunks - 1) == 0 else byte


class Gfx950:
    """gfx950: wave64, buffer -> LDS DMA, v_mfma_scale_f32_16x16x128_f8f6f4."""
    wave = 64
    acc_width = 4                  # accumulator floats per lane per 16 x 16 tile
    pad = 0                        # LDS bytes after each operand row
    scales_in_lds = False          # scale bytes travel in VGPRs, a window per loop iteration
    b_tiles = 1                    # 16-column B tiles per MMA
    cluster = None
    buffer_flags = BUFFER_FLAGS

    def __init__(self, b, waves=WAVES, window_turns=1, scale_shuffled=0):
        self.b, self.waves, self.window_turns, self.shuffled = b, waves, window_turns, scale_shuffled
        self.acc_t = b.v4f32

    def threads(self):
        return self.waves * self.wave

    def dma_plan(self, op, tid, rows_left, row_bytes, base):
        """Per DMA issue j: (LDS byte of this wave's 1 KiB slice, voffset of this lane's chunk, None
        or the wave-uniform condition of a last partial issue, the voffset for a stage whose first K
        step is the last (out of range past that step; None with one step per stage)). Slot
        s = 4096 j + 16 tid: row s / chunks, LDS chunk s % chunks holds memory chunk `op.swizzle` of it."""
        b, t, wave_bytes = self.b, self.threads(), 16 * self.wave
        plan, wave = [], wave_index(b, self.wave)
        for j in range(-(-op.lds_bytes // (16 * t))):
            s = j * t + Int(tid)
            row = s // op.chunks
            byte = op.swizzle(s % op.chunks * 16, row)
            voff = b.sel(b.cmp("slt", row, rows_left), row * row_bytes + byte, b.c(INVALID_OFFSET))
            first = None if op.row_bytes == op.step_bytes else \
                b.sel(b.cmp("ult", byte, b.c(op.step_bytes)), voff, b.c(INVALID_OFFSET))
            waves = (op.lds_bytes - j * t * 16) // wave_bytes        # waves with a slice of the tile left
            live = None if waves >= self.waves else b.cmp("slt", wave, b.c(waves))
            plan.append((op.lds_off + j * t * 16 + wave * wave_bytes, voff, live, first))
        return plan

    def stage_loads(self, rsrc, plan, buf, kt, op, first_only=None, scopes=None):
        b = self.b
        for dst, voff, live, first in plan:
            voff = voff if first_only is None else b.sel(first_only, first, voff)
            branch = None if live is None else scf.IfOp(live, [], has_else=False)
            with ir.InsertionPoint(branch.then_block) if branch else contextlib.nullcontext():
                rocdl.raw_ptr_buffer_load_lds(rsrc, b.gep(buf, dst), b.c(16), voff, Int(kt) * op.row_bytes,
                                              b.c(0), aux=b.c_attr(0), **(scopes or {}))
                if branch:
                    scf.YieldOp([])

    def stage_wait(self, depth, stage):
        """The stage's DMA and scale loads have landed: with two stages in flight, the next stage's
        DMA (issued last) may still be pending."""
        loads_done_barrier(0 if depth == 1 else len(stage.a_dma) + len(stage.b_dma))

    def fragments_wait(self):
        rocdl.s_waitcnt(WAIT_LGKMCNT0)

    def drain(self):
        """Nothing: the epilogue stores only registers."""

    def _first_only(self, stage, kt):
        return None if stage.steps == 1 else arith.andi(stage.half_last, self.b.cmp("eq", kt, stage.last))

    def issue_dma(self, stage, kt, live, buf, scopes=None):
        """Stage kt's operand tiles -> LDS (empty resources past the end); a half-full last stage
        loads its first step only."""
        first_only = self._first_only(stage, kt)
        for k, plan, op in (("a", stage.a_dma, stage.A), ("b", stage.b_dma, stage.B)):
            self.stage_loads(llvm.select(live, stage.rs[k], stage.null), plan, buf, kt, op, first_only, scopes)

    def window_plan(self, stage, rows, lefts, span):
        """voffset of this lane's piece of a scale window per 16-row tile: a row's window is the
        span * steps dwords of its K-block bytes (one dword a K step), lane group h holds dwords
        h * n .. h * n + n - 1 (n = ceil(span * steps / 4)); lane groups past the window hold none.
        Shuffled scales: per pair of 16-row tiles (32 rows from an even tile), lane (row r, K block
        h) reads the dword (h, r) of each of the window's n = span * steps / 2 chunks (256 bytes:
        two K steps of the 32 rows), whose bytes are its scales of the two tiles and two steps."""
        b, (r16, h) = self.b, self.lane_rows()
        if self.shuffled:
            stage.n = span * stage.steps // 2
            return [b.sel(b.cmp("slt", r - r16, left), (r - r16) // 32 * stage.group_bytes + (h * 16 + r16) * 4,
                          b.c(INVALID_OFFSET)) for r, left in zip(rows[::2], lefts[::2])]
        stage.n = -(-span * stage.steps // 4)
        group = b.cmp("slt", h * stage.n, b.c(span * stage.steps))
        return [b.sel(arith.andi(b.cmp("slt", r, left), group), Int(r) * stage.kblocks + h * (4 * stage.n),
                      b.c(INVALID_OFFSET)) for r, left in zip(rows, lefts)]

    def issue_window(self, stage, kt0, chunks=None):
        """The scale window of the stages from kt0 -> VGPRs (A tiles, then B tiles): a line touch per
        row per window, where per-stage byte loads touch it every stage (the operand DMA evicts it
        from L1 in between). Resources rebased at stage kt0 end with the scale tensor (past it:
        zeros; soffset is not range checked). Shuffled: the window's `chunks` (default all) per pair."""
        b, n = self.b, stage.n
        vt = b.i32 if n == 1 or self.shuffled else ir.VectorType.get([n], b.i32)
        off = Int(kt0) * (stage.step_scale_bytes * stage.steps)
        mi = stage.mi // 2 if self.shuffled else stage.mi
        win = []
        for k, voffs in (("sa", stage.window[:mi]), ("sb", stage.window[mi:])):
            left = arith.maxsi(Int(stage.records[k]) - off, b.c(0))
            rs = rocdl.make_buffer_rsrc(b.rsrc_t, b.gep(stage.bases[k], b.u64(off)), b.c(0, b.i16), b.u64(left),
                                        b.c(self.buffer_flags))
            if self.shuffled:      # a chunk's dwords lie 256 bytes apart
                win += [[rocdl.raw_ptr_buffer_load(vt, rs, Int(v) + 256 * c if c else v, b.c(0), aux=b.c_attr(0))
                         for c in (range(n) if chunks is None else chunks)] for v in voffs]
            else:
                win += [rocdl.raw_ptr_buffer_load(vt, rs, v, b.c(0), aux=b.c_attr(0)) for v in voffs]
        return win

    def next_window(self, stage, win, slot, kt, span):
        """The scale registers after stage kt, slot `slot` of a `span`-stage window: the next window
        after the window's last stage; shuffled, each chunk is replaced by the next window's as soon as
        its second K step is done (a few loads a stage instead of a burst at the window's end)."""
        if not self.shuffled:
            return self.issue_window(stage, Int(kt) + 1) if slot == span - 1 else win
        last = slot * stage.steps + stage.steps - 1      # the stage's last K step in the window
        if last % 2 == 0:
            return win
        c = last // 2
        fresh = self.issue_window(stage, Int(kt) + (span - slot), [c])
        return [w[:c] + f + w[c + 1:] for w, f in zip(win, fresh)]

    def window_scales(self, stage, win, j, kt):
        """The scale operands of window stage j (= stage kt), per K step the A then the B tiles: lane
        (row, group g) takes the step's dword d from lane (row, group d // n) (ds_bpermute) and
        its byte g. A half-full last stage's second step gets 0 (its bytes are the next row's)."""
        b, n = self.b, stage.n
        first_only = self._first_only(stage, kt)
        scales = []
        if self.shuffled:          # (dword, byte): the MMA's scale operand selects the byte (op_sel)
            for u in range(stage.steps):
                d = j * stage.steps + u
                for w in win:
                    x = w[d // 2] if u == 0 else b.sel(first_only, b.c(0), w[d // 2])
                    scales += [(x, d % 2 * 2 + r1) for r1 in (0, 1)]
            return scales
        lane = Int(fx.thread_idx.x.ir_value()) % self.wave
        shift = lane // 16 * 8
        for u in range(stage.steps):
            d = j * stage.steps + u
            src = (lane % 16 + 16 * (d // n)) * 4
            for w in win:
                x = arith.shrui(rocdl.ds_bpermute(b.i32, src, w if n == 1 else llvm.extractelement(w, b.c(d % n))),
                                shift)
                scales.append(x if u == 0 else b.sel(first_only, b.c(0), x))
        return scales

    def fragment(self, op, buf, row, u=0, scopes=None):
        """v8i32 MMA operand of K step u of LDS row `row` (this lane's, lane group g): fp8 chunks g and
        g + 4 of the step (bytes 16g.. and 64 + 16g..); fp4 / fp6 the 16 / 24 bytes of K 32g .. 32g + 31 (K-contiguous,
        docs/gfx950_isa.md §1.3; fp6 in three 8-byte reads, as its fragments straddle chunks) in the
        low dwords, zeros above (the MFMA reads 4 / 6 of the 8 VGPRs)."""
        b = self.b
        g = Int(fx.thread_idx.x.ir_value()) % self.wave // 16
        size = 8 if op.frag_bytes % 16 else 16
        starts = ([u * op.step_bytes + 16 * (g + 4 * h) for h in range(2)] if op.bits == 8 else
                  [u * op.step_bytes + g * op.frag_bytes + size * p for p in range(op.frag_bytes // size)])
        vt = ir.VectorType.get([size // 4], b.i32)
        base = op.lds_off + Int(row) * op.row_stride
        parts = [llvm.load(vt, b.gep(buf, base + op.swizzle(s, row)), alignment=size, **(scopes or {}))
                 for s in starts]
        zero = arith.constant(vt, ir.DenseElementsAttr.get_splat(vt, ir.IntegerAttr.get(b.i32, 0)))
        parts += [zero] * (32 // size - len(parts))
        while len(parts) > 1:             # pairwise concatenation up to v8i32
            n = 2 * ir.VectorType(parts[0].type).shape[0]
            parts = [llvm.shufflevector(ir.VectorType.get([n], b.i32), parts[i], parts[i + 1], list(range(n)))
                     for i in range(0, len(parts), 2)]
        return parts[0]

    def lane_rows(self):
        """(row of the 16-row tile this lane feeds, K block of the 128-wide step whose scale it holds)."""
        lane = Int(fx.thread_idx.x.ir_value()) % self.wave
        return lane % 16, lane // 16

    def mma(self, acc, a_frag, a_scale, a_fmt, b_frag, b_scale, b_fmt):
        """A scale is a VGPR (its byte 0) or (VGPR, which byte)."""
        (sa, ba), (sb, bb) = (s if isinstance(s, tuple) else (s, 0) for s in (a_scale, b_scale))
        return fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(
            self.acc_t, [b_frag, a_frag, acc, FMT_CODE[b_fmt], FMT_CODE[a_fmt], bb, sb, ba, sa])

    def acc_coords(self):
        """(row in the 16 x 16 tile, first of the 4 consecutive columns) of this lane's accumulator."""
        lane = Int(fx.thread_idx.x.ir_value()) % self.wave
        return lane % 16, lane // 16 * 4


class Piece:
    """One 2-D tile a Tensor Data Mover load brings to LDS: `rows` rows of `inner` elements."""

    def __init__(self, base, rows_left, stride, inner, rows, elem_bytes, step_bytes, lds_off, pad, mask):
        self.base, self.rows_left, self.stride, self.inner, self.rows = base, rows_left, stride, inner, rows
        self.elem_bytes, self.step_bytes, self.lds_off, self.pad, self.mask = elem_bytes, step_bytes, lds_off, pad, mask


class Gfx1250:
    """gfx1250: wave32, Tensor Data Mover -> LDS, v_wmma_scale_f32_16x16x128_f8f6f4.

    Options: SCALE_PATH "tdm" (waves 0-3 load A, B, a_scale, b_scale tiles by TDM),
    "buffer_lds_stage" (waves 0, 1 load A, B by TDM; every lane loads scale words with
    buffer_load and stores them into the stage at the end of the step), "buffer_lds_stage_ab_split"
    (scales as before; A and B split in row halves over waves 0-3); B_STREAMING (B fragments
    read per 16-column tile between the WMMAs instead of all before them); CLUSTER_M x
    CLUSTER_N workgroups share A (B) tiles by TDM multicast, with a cluster barrier per step;
    F4_WIDE (fp4 x fp4) covers two B tiles per v_wmma_scale_f32_32x16x128_f4."""
    wave = 32
    acc_width = 8
    pad = 16                       # TDM row padding: spreads rows over LDS banks (docs/gfx1250_isa.md §4)
    scales_in_lds = True
    shuffled = 0
    # V# dword 3 on RDNA-style targets: bit 24 must be 1, OOB_SELECT (29:28) = 3 gives raw-buffer
    # range checks against num_records (docs/gfx1250_isa.md §6)
    buffer_flags = BUFFER_FLAGS | 1 << 24 | 3 << 28

    def __init__(self, b, scale_path="tdm", cluster_m=1, cluster_n=1, f4_wide=0):
        self.b, self.scale_path, self.waves = b, scale_path, WAVES
        self.cluster = (cluster_m, cluster_n) if cluster_m * cluster_n > 1 else None
        self.b_tiles = 2 if f4_wide else 1
        self.acc_t = ir.VectorType.get([8 * self.b_tiles], b.f32)

    def threads(self):
        return self.waves * self.wave

    def lane(self):
        return Int(fx.thread_idx.x.ir_value()) % self.wave

    def lane_rows(self):
        """(row of the 16-row tile this lane feeds, None: a lane holds all four K blocks' scales)."""
        return self.lane() % 16, None

    def masks(self):
        """TDM multicast masks (A, B) of this workgroup: grid x walks N tiles, y M tiles, and the
        cluster's flat index is x + y * CLUSTER_N (docs/gfx1250_isa.md §5)."""
        if self.cluster is None:
            return 0, 0
        b, (cm, cn) = self.b, self.cluster
        lx, ly = rocdl.cluster_workgroup_id_x(b.i32), rocdl.cluster_workgroup_id_y(b.i32)
        a_mask = b.c((1 << cn) - 1) << Int(ly) * cn
        b_mask = b.c(sum(1 << (y * cn) for y in range(cm))) << lx
        return a_mask, b_mask

    def dma_plan(self, op, tid, rows_left, row_bytes, base):
        """The TDM pieces of one operand tile: the whole tile, or two row halves (ab_split)."""
        mask = self.masks()[op.lds_off != 0]    # the stage holds A first (offset 0), then B
        halves = 2 if self.scale_path == "buffer_lds_stage_ab_split" else 1
        h_rows = op.rows // halves
        b = self.b
        return [Piece(b.gep(base, arith.extui(b.i64, b.c(h * h_rows) * row_bytes)), Int(rows_left) - h * h_rows,
                      row_bytes, op.row_bytes, h_rows, 1, op.row_bytes,
                      op.lds_off + h * h_rows * op.row_stride, op.row_stride - op.row_bytes, mask)
                for h in range(halves)]

    def scale_plan(self, st, rows, lefts, kb, bases):
        """TDM path: the a_scale / b_scale tile pieces (one i32 of four K-block bytes per row).
        Buffer paths: the indices of the scale words (a rows, then b rows) this thread stages."""
        if self.scale_path == "tdm":
            a_mask, b_mask = self.masks()
            words = Int(st.kblocks) // 4
            return [Piece(bases[k], left, words, 1, op.rows, 4, 4, off, 0, mask)
                    for k, left, op, off, mask in (("sa", st.m_left, st.A, st.sa_off, a_mask),
                                                   ("sb", st.n_left, st.B, st.sb_off, b_mask))]
        return [j * self.threads() + Int(fx.thread_idx.x.ir_value())
                for j in range((st.A.rows + st.B.rows) // self.threads())]

    def tdm_load(self, piece, buf, kt, live):
        """tensor_load_to_lds of one piece of step kt into stage `buf` (docs/gfx1250_isa.md §4)."""
        b = self.b
        gaddr = llvm.ptrtoint(b.i64, b.gep(piece.base, arith.extui(b.i64, Int(kt) * piece.step_bytes)))
        lds = Int(llvm.ptrtoint(b.i32, buf)) + piece.lds_off
        hi = Int(arith.trunci(b.i32, Int(gaddr) >> 32)) | -(1 << 31)
        g0 = vector.from_elements(b.v4i32, [arith.extui(b.i32, live), lds, arith.trunci(b.i32, gaddr), hi])
        cfg = (piece.elem_bytes.bit_length() - 1) << 16
        if piece.pad:
            cfg |= (1 << 20) | ((piece.step_bytes // 4).bit_length() - 2) << 22 | (piece.pad // 4 - 1) << 25
        dw0 = b.c(cfg) if isinstance(piece.mask, int) else b.c(cfg) | piece.mask
        rows = Int(arith.maxsi(piece.rows_left, b.c(0)))   # rows at or past it land as zeros
        inner = piece.inner
        g1 = vector.from_elements(b.v8i32, [
            dw0, b.c((inner & 0xFFFF) << 16),
            b.c(inner >> 16) | (rows & 0xFFFF) << 16,
            rows >> 16 | inner << 16,
            b.c(piece.rows), piece.stride, b.c(0), b.c(0)])
        z4 = vector.from_elements(b.v4i32, [b.c(0)] * 4)
        rocdl.tensor_load_to_lds(g0, g1, z4, z4, vector.from_elements(b.v8i32, [b.c(0)] * 8))

    def issue(self, stage, kt, live):
        """Each TDM piece of step kt by its own wave; scale words of the buffer paths into VGPRs
        (returned: `commit` stores them into the stage once they have landed)."""
        b, buf = self.b, stage.buffer(kt)
        pieces = stage.a_dma[:1] + stage.b_dma[:1] + (stage.scales if self.scale_path == "tdm" else
                                                      stage.a_dma[1:] + stage.b_dma[1:])
        wave = wave_index(b, self.wave)
        for w, piece in enumerate(pieces):
            branch = scf.IfOp(b.cmp("eq", wave, b.c(w)), [], has_else=False)
            with ir.InsertionPoint(branch.then_block):
                self.tdm_load(piece, buf, kt, live)
                scf.YieldOp([])
        if self.scale_path == "tdm":
            return []
        words = []
        for w in stage.scales:
            is_a = b.cmp("slt", w, b.c(stage.A.rows))
            row = b.sel(is_a, w, Int(w) - stage.A.rows)
            left = b.sel(is_a, stage.m_left, stage.n_left)
            voff = b.sel(b.cmp("slt", row, left), Int(row) * stage.kblocks, b.c(INVALID_OFFSET))
            rsrc = llvm.select(live, llvm.select(is_a, stage.rs["sa"], stage.rs["sb"]), stage.null)
            words.append(rocdl.raw_ptr_buffer_load(b.i32, rsrc, voff, Int(kt) * 4, aux=b.c_attr(0)))
        return words

    def commit(self, stage, words, buf):
        """Store the scale words of a buffer path into their stage (a, then b rows, 4 bytes each)."""
        b = self.b
        for w, v in zip(stage.scales, words):
            llvm.store(v, b.gep(buf, stage.sa_off + Int(w) * 4), alignment=4)

    def cluster_barrier(self):
        """Every workgroup of the cluster is past this point: wave 0 signals, all waves wait."""
        b = self.b
        branch = scf.IfOp(b.cmp("eq", wave_index(b, self.wave), b.c(0)), [], has_else=False)
        with ir.InsertionPoint(branch.then_block):
            rocdl.s_barrier_signal(CLUSTER_BARRIER)
            scf.YieldOp([])
        rocdl.s_barrier_wait(CLUSTER_BARRIER)

    def stage_wait(self, depth, stage):
        """This wave's TDM loads of the step have landed (each wave issues one per step, `depth`
        steps are in flight), every wave's are visible after the workgroup barrier; with
        multicast, no workgroup of the cluster still reads the stage the next issue overwrites."""
        rocdl.s_wait_tensorcnt(depth - 1)
        workgroup_barrier()
        if self.cluster:
            self.cluster_barrier()

    def fragments_wait(self):
        """LLVM waits (s_wait_dscnt) before the first use of each LDS read on its own."""

    def drain(self):
        """After the K loop: this wave's TDM loads (the disabled ones past the end too) are done;
        with multicast, so are every peer's, which may write into this workgroup's LDS."""
        rocdl.s_wait_tensorcnt(0)
        if self.cluster:
            rocdl.s_barrier()
            self.cluster_barrier()

    def scales(self, stage, buf, rows, op_off):
        """This lane's scale word (four K-block bytes of its row) per 16-row tile."""
        b = self.b
        return [llvm.load(b.i32, b.gep(buf, op_off + Int(r) * 4), alignment=4) for r in rows]

    def fragment(self, op, buf, row, u=0, scopes=None):
        """v16i32 (fp8) / v8i32 (fp4) operand of K step u of LDS row `row`: the step's 16-byte chunks g,
        g + 2, ... for lane group g (docs/gfx1250_isa.md §3.2)."""
        b = self.b
        g = self.lane() // 16
        base = op.lds_off + (Int(row) * op.row_stride + (u * op.step_bytes + g * 16))
        parts = [llvm.load(b.v4i32, b.gep(buf, base + 32 * s), alignment=16) for s in range(op.step_bytes // 32)]
        while len(parts) > 1:
            n = ir.VectorType(parts[0].type).shape[0]
            t = ir.VectorType.get([2 * n], b.i32)
            parts = [llvm.shufflevector(t, parts[i], parts[i + 1], list(range(2 * n))) for i in range(0, len(parts), 2)]
        return parts[0]

    def mma(self, acc, a_frag, a_scale, a_fmt, b_frag, b_scale, b_fmt):
        """src0 = B rows (n), src1 = A rows (m): lane l accumulates out[l % 16][8 (l / 16) + i].
        F4_WIDE (fp4 x fp4): src0 = two stacked B tiles (v_wmma_scale_f32_32x16x128_f4), whose
        32-row scale operand is one row per lane: tile 0's word in lanes 0-15, tile 1's in 16-31
        (docs/gfx1250_isa.md §3.5); the accumulator holds tile 0's 8 columns, then tile 1's."""
        if self.b_tiles == 1:
            return fx.rocdl.wmma_scale_f32_16x16x128_f8f6f4(self.acc_t, b_frag, a_frag, acc, b_scale, a_scale,
                                                            fmtA=FMT_CODE[b_fmt], fmtB=FMT_CODE[a_fmt])
        b = self.b
        pair = llvm.shufflevector(ir.VectorType.get([16], b.i32), b_frag[0], b_frag[1], list(range(16)))
        low = b.cmp("ult", self.lane(), b.c(16))
        return fx.rocdl.wmma_scale_f32_32x16x128_f4(self.acc_t, pair, a_frag, acc, b.sel(low, b_scale[0], b_scale[1]),
                                                    a_scale)

    def acc_coords(self):
        """(row in the 16 x 16 tile, first of the 8 consecutive columns) of this lane's accumulator."""
        return self.lane() % 16, self.lane() // 16 * 8


TARGETS = {"gfx950": Gfx950, "gfx1250": Gfx1250}


def _check(arch, a_fmt, b_fmt, bm, bn, out, splitk, num_buffers, b_streaming, stage_steps=1, scale_path="tdm",
           cluster_m=1, cluster_n=1, f4_wide=0, waves=WAVES, window_turns=1, scale_shuffled=0):
    ok = (a_fmt in FMT_CODE and b_fmt in FMT_CODE and bm in TILES and bn in TILES and out in OUTS
          and splitk in (0, 1) and (not splitk or out == "f32") and b_streaming in (0, 1)
          and stage_steps in (1, 2) and (stage_steps == 1 or arch == "gfx950" and not splitk))
    if arch == "gfx1250":
        # its fragment reads know fp8 / fp4 rows; its scales are staged in LDS
        ok = ok and BITS[a_fmt] != 6 and BITS[b_fmt] != 6 and waves == WAVES and window_turns == 1 \
            and not scale_shuffled
        # buffer scale paths: every thread stages (BM + BN) / 128 scale words
        ok = ok and 2 <= num_buffers <= 4 and scale_path in SCALE_PATHS and cluster_m * cluster_n <= 16 and (
            scale_path == "tdm" or (bm + bn) % (WAVES * Gfx1250.wave) == 0) and (
            f4_wide in (0, 1) and (not f4_wide or a_fmt == b_fmt == "e2m1"))
    else:
        # three buffers: the wait counts the DMA, so every wave issues each one (no FP6 partial issue)
        # eight waves: 4 x 2, a wave's rows whole 16-row tiles
        ok = ok and (num_buffers == 2 or num_buffers == 3 and 6 not in (BITS[a_fmt], BITS[b_fmt])) \
            and waves in (4, 8) and bm // (waves // 2) % 16 == 0 and 1 <= window_turns <= 4 and not b_streaming \
            and (scale_path, cluster_m, cluster_n, f4_wide) == ("tdm", 1, 1, 0)
        # shuffled scales: a window of whole 256-byte chunks (an even K step count), tiles in pairs
        ok = ok and scale_shuffled in (0, 1) and (not scale_shuffled or not splitk and bm // (waves // 2) % 32 == 0
                                                  and num_buffers * window_turns * stage_steps % 2 == 0)
    if not ok:
        raise ValueError(
            f"{arch} variant A_FMT={a_fmt} B_FMT={b_fmt} BM={bm} BN={bn} OUT={out} SPLITK={splitk} "
            f"NUM_BUFFERS={num_buffers} B_STREAMING={b_streaming} STAGE_STEPS={stage_steps} SCALE_PATH={scale_path} "
            f"CLUSTER_M={cluster_m} CLUSTER_N={cluster_n} F4_WIDE={f4_wide} WAVES={waves} "
            f"WINDOW_TURNS={window_turns} SCALE_SHUFFLED={scale_shuffled}: formats in "
            f"{tuple(FMT_CODE)}, BM and BN in {TILES}, OUT in "
            f"{OUTS}, SPLITK 0 or 1 (1 needs OUT=f32), STAGE_STEPS 1 or 2 (2: gfx950, SPLITK 0); gfx950: "
            f"NUM_BUFFERS 2 (3 without FP6), WAVES 4 or 8 (BM >= 64), WINDOW_TURNS 1..4 and no gfx1250 option, "
            f"SCALE_SHUFFLED 1 without SPLITK, with 32-row multiples per wave and an even window of K steps; "
            f"gfx1250: no FP6, WAVES 4, WINDOW_TURNS 1, SCALE_SHUFFLED 0, "
            f"NUM_BUFFERS 2..4, SCALE_PATH in {SCALE_PATHS}, CLUSTER_M * CLUSTER_N <= 16, (BM + BN) % 128 == 0 "
            f"on the buffer scale paths, F4_WIDE only for e2m1 x e2m1")


def _body(target, cfg, a, a_scale, bp, b_scale, out, M, N, K, splits, lds):
    t = _tile(target, cfg, M, N, K, splits)
    _stage(t, a, a_scale, bp, b_scale, K, lds)
    acc = _k_loop(t)
    target.drain()
    _epilogue(t, acc, out, N)


def _tile(target, cfg, M, N, K, splits):
    """The workgroup's tile: operands, waves, its rows and columns, its share of the K steps."""
    t = SimpleNamespace(target=target, b=target.b, M=M, N=N)
    t.a_fmt, t.b_fmt, t.bm, t.bn, t.out_t, t.splitk, t.num_buffers, t.b_streaming, t.steps = cfg
    b = t.b
    t.A = Operand(t.bm, t.a_fmt, 0, target.pad, t.steps)
    t.B = Operand(t.bn, t.b_fmt, t.A.lds_bytes, target.pad, t.steps)
    t.stage_bytes = stage_lds_bytes(target, t.A, t.B)
    t.tid = fx.thread_idx.x.ir_value()
    wave = wave_index(b, target.wave)
    t.wm, t.wn = wave >> 1, wave & 1
    t.wave_rows = t.bm // (target.waves // 2)     # A rows (output rows) per wave
    t.n0 = Int(fx.block_idx.x.ir_value()) * t.bn
    t.m0 = Int(fx.block_idx.y.ir_value()) * t.bm
    steps = Int(K) // BK
    # stages of STAGE_STEPS K steps; with 2, an odd step count leaves the last stage half full
    stages = steps if t.steps == 1 else (steps + 1) // 2
    per_split = (stages + (Int(splits) + -1)) // splits
    lo = Int(arith.minui(Int(fx.block_idx.z.ir_value()) * per_split, stages))
    t.nsteps = Int(arith.minui(lo + per_split, stages)) - lo     # stages of this split
    t.k_lo = lo if t.steps == 1 else lo * 2                     # its first K step
    t.half_last = None if t.steps == 1 else b.cmp("ne", steps & 1, b.c(0))
    t.kblocks = Int(K) // SCALE_BLOCK
    return t


def _stage(t, a, a_scale, bp, b_scale, K, lds):
    """The global->LDS loader's plan (t.stage): tile-rebased resources (row r of the tile at
    voffset r * row_bytes, K step kt at soffset), DMA and scale plans, this lane's fragment rows,
    the LDS ring of stages (t.buffer)."""
    b, target, A, B = t.b, t.target, t.A, t.B
    bases = {}

    def base(key, ptr, row0, row_bytes, k_off):
        bases[key] = b.gep(ptr, Int(b.u64(row0)) * b.u64(row_bytes) + b.u64(k_off))
        return bases[key]

    a_row = Int(K) // BK * A.step_bytes
    b_row = Int(K) // BK * B.step_bytes
    t.flags = flags = target.buffer_flags
    k_lo, kblocks = t.k_lo, t.kblocks
    rs = {"a": b.rsrc_rebased(base("a", a, t.m0, a_row, k_lo * A.step_bytes), flags),
          "b": b.rsrc_rebased(base("b", bp, t.n0, b_row, k_lo * B.step_bytes), flags)}
    # shuffled scales: a 32-row group's bytes (K rounded up to 256, 128 bytes a K step) are contiguous
    shuffled = target.shuffled
    group_bytes = (kblocks + 7) // 8 * 256
    for k, ptr, row0 in (("sa", a_scale, t.m0), ("sb", b_scale, t.n0)):
        if shuffled:
            base(k, ptr, Int(row0) // 32, group_bytes, k_lo * 128)
        else:
            base(k, ptr, row0, kblocks, k_lo * (BK // SCALE_BLOCK))
        if target.scales_in_lds:       # gfx950 makes its scale resources per window
            rs[k] = b.rsrc_rebased(bases[k], flags)
    null = rocdl.make_buffer_rsrc(b.rsrc_t, llvm.mlir_zero(b.gptr), b.c(0, b.i16), b.c(0, b.i64),
                                  b.c(flags))
    t.m_left, t.n_left = Int(t.M) - t.m0, Int(t.N) - t.n0
    stage = t.stage = SimpleNamespace(A=A, B=B, steps=t.steps, half_last=t.half_last, rs=rs, null=null, bases=bases,
                                      last=None if t.steps == 1 else Int(t.nsteps) - 1,
                                      m_left=t.m_left, n_left=t.n_left, kblocks=kblocks, group_bytes=group_bytes,
                                      step_scale_bytes=128 if shuffled else BK // SCALE_BLOCK,
                                      sa_off=A.lds_bytes + B.lds_bytes, sb_off=A.lds_bytes + B.lds_bytes + 4 * t.bm)
    stage.a_dma = target.dma_plan(A, t.tid, t.m_left, a_row, bases["a"])
    stage.b_dma = target.dma_plan(B, t.tid, t.n_left, b_row, bases["b"])

    # This lane's fragment rows and scale sources per 16-row tile.
    r16, kb = target.lane_rows()
    t.a_rows = [t.wm * t.wave_rows + (16 * i + r16) for i in range(t.wave_rows // 16)]
    t.b_rows = [t.wn * (t.bn // 2) + (16 * j + r16) for j in range(t.bn // 32)]
    t.mi, t.nj = len(t.a_rows), len(t.b_rows)
    stage.mi = t.mi
    lefts = [t.m_left] * t.mi + [t.n_left] * t.nj
    if target.scales_in_lds:
        stage.scales = target.scale_plan(stage, t.a_rows + t.b_rows, lefts, kb, bases)
    else:
        # scale bytes from the bases on
        stage.records = {k: (left + 31) // 32 * group_bytes - k_lo * 128 if shuffled else
                         left * kblocks - k_lo * (BK // SCALE_BLOCK)
                         for k, left in (("sa", t.m_left), ("sb", t.n_left))}
        t.window = t.num_buffers * target.window_turns
        stage.window = target.window_plan(stage, t.a_rows + t.b_rows, lefts, t.window)
    t.depth = t.num_buffers - 1              # K steps in flight ahead of the one computed

    def buffer(kt):
        return b.gep(lds, Int(kt) % t.num_buffers * t.stage_bytes)

    t.buffer = stage.buffer = buffer
    t.slot_buffer = lambda slot: b.gep(lds, b.c(slot * t.stage_bytes))
    t.scopes = lds_alias_scopes(t.num_buffers, "mx_gemm stages") if t.depth > 1 and not target.scales_in_lds \
        else [None] * t.num_buffers


def _k_loop(t):
    """Prologue (the first `depth` stages in flight), then per stage: wait for it, read its
    fragments, issue stage kt + depth, the MMAs. gfx950: the loop runs WINDOW_TURNS x NUM_BUFFERS
    stages (a scale window) per iteration, each on a buffer known at trace time (alias scopes, with two
    stages in flight, tell the buffers apart), and a half-full last stage (STAGE_STEPS 2, odd K
    steps) runs both steps, the second on the zeros its out-of-range loads left (+0 leaves an
    accumulator, never -0, as it is). -> the accumulators."""
    b, target, stage, depth, nsteps = t.b, t.target, t.stage, t.depth, t.nsteps
    zero = b.splat(target.acc_t, 0.0)
    t.g = target.b_tiles                   # B tiles (16 columns each) one MMA covers
    na = t.mi * t.nj // t.g                # accumulators: one per (A tile, group of g B tiles)
    if not target.scales_in_lds:
        # stage 0's DMA, the first scale window, (two in flight) stage 1's DMA; each stage then
        # issues stage kt + depth's DMA (the iteration's last stage the next window first), so a
        # wait for all but one stage's DMA covers the window
        for s in range(depth):
            target.issue_dma(stage, b.c(s), b.cmp("slt", b.c(s), nsteps), t.slot_buffer(s), t.scopes[s])
            if s == 0:
                window = target.issue_window(stage, b.c(0))
                fx.rocdl.sched_barrier(0)
        return k_loop(nsteps, [zero] * na, window, lambda kt, acc, cur, slot: _mma_step(t, kt, acc, cur, slot),
                      unroll=t.window)
    if target.cluster:
        target.cluster_barrier()           # no workgroup multicasts into a peer that has not started
    for s in range(depth):                 # steps 0 .. depth-1 in flight
        target.commit(stage, target.issue(stage, b.c(s), b.cmp("slt", b.c(s), nsteps)), t.buffer(b.c(s)))
    idx = ir.IndexType.get()
    loop = scf.ForOp(arith.constant(idx, 0), arith.index_cast(idx, nsteps), arith.constant(idx, 1), [zero] * na)
    with ir.InsertionPoint(loop.body):
        kt = arith.index_cast(b.i32, loop.induction_variable)
        scf.YieldOp(_mma_step(t, kt, list(loop.inner_iter_args), [])[0])
    return list(loop.results)


def _mma_step(t, kt, acc, scales, slot=None):
    """Stage kt of the loop body -> (accumulators, the scale registers of the stages after it).
    Every fragment of the stage is read before the next stage's DMA is issued: LLVM waits for
    all LDS DMA before an LDS read, but for the DMA into other buffers (alias scopes say which).
    gfx950: slot is the stage's place in the loop iteration (its buffer modulo NUM_BUFFERS), `scales` the
    iteration's scale window, replaced by the next one in its last stage."""
    b, target, stage, A, B, g, mi, nj = t.b, t.target, t.stage, t.A, t.B, t.g, t.mi, t.nj
    a_fmt, b_fmt, a_rows, b_rows, steps = t.a_fmt, t.b_fmt, t.a_rows, t.b_rows, t.steps
    scopes = None if slot is None else t.scopes[slot % t.num_buffers]
    target.stage_wait(t.depth, stage)
    buf = t.buffer(kt) if slot is None else t.slot_buffer(slot % t.num_buffers)
    if target.scales_in_lds:
        scales = target.scales(stage, buf, a_rows, stage.sa_off) + target.scales(stage, buf, b_rows, stage.sb_off)
    window = scales
    if slot is not None:
        scales = target.window_scales(stage, window, slot, kt)
    a_frag = [[target.fragment(A, buf, r, u, scopes) for r in a_rows] for u in range(steps)]
    b_frag = None if t.b_streaming else [[target.fragment(B, buf, r, u, scopes) for r in b_rows]
                                         for u in range(steps)]
    kn = Int(kt) + t.depth
    if slot is None:
        nxt = target.issue(stage, kn, b.cmp("slt", kn, t.nsteps))
    else:
        dst = (slot + t.depth) % t.num_buffers
        nxt = target.next_window(stage, window, slot, kt, t.window)
        if nxt is not window:
            fx.rocdl.sched_barrier(0)      # the window's loads before the DMA: the wait counts on them
        target.issue_dma(stage, kn, b.cmp("slt", kn, t.nsteps), t.slot_buffer(dst), t.scopes[dst])
    target.fragments_wait()

    def b_operand(frags, sc, j):   # the MMA's B operand and scales: one tile, or g stacked tiles
        if g == 1:
            return frags[j], sc[mi + j]
        return [frags[j + u] for u in range(g)], sc[mi + j:mi + j + g]

    if t.b_streaming:
        # one B group at a time: the next group's LDS reads overlap this group's WMMAs
        def group(j):
            return {j + u: target.fragment(B, buf, b_rows[j + u]) for u in range(g)}

        frags = group(0)
        for j in range(0, nj, g):
            cur, frags = frags, group(j + g) if j + g < nj else None
            fx.rocdl.sched_barrier(0)
            for i in range(mi):
                acc[(i * nj + j) // g] = target.mma(acc[(i * nj + j) // g], a_frag[0][i], scales[i], a_fmt,
                                                    *b_operand(cur, scales, j), b_fmt)
            fx.rocdl.sched_barrier(0)
    else:
        for u in range(steps):             # K steps in increasing K: the accumulation order
            sc = scales[u * (mi + nj):]
            for i in range(mi):
                for j in range(0, nj, g):
                    acc[(i * nj + j) // g] = target.mma(acc[(i * nj + j) // g], a_frag[u][i], sc[i], a_fmt,
                                                        *b_operand(b_frag[u], sc, j), b_fmt)
    fx.rocdl.sched_barrier(0)
    if target.scales_in_lds:
        target.commit(stage, nxt, t.buffer(kn))
        nxt = []
    return acc, nxt


def _epilogue(t, acc, out, N):
    """Each lane holds acc_width consecutive columns of one row per 16 x 16 tile: stored (bf16 /
    f16 packed, f32 in 16-byte parts) or, split-K, added with fp32 atomics; rows and columns past
    the problem get an out-of-range offset (dropped)."""
    b, target, g, nj, esz = t.b, t.target, t.g, t.nj, 4 if t.out_t == "f32" else 2
    out_at = (Int(b.u64(t.m0)) * b.u64(N) + b.u64(t.n0)) * esz
    out_rs = b.rsrc_rebased(b.gep(out, out_at), t.flags)
    row_l, col_l = target.acc_coords()
    half = {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get()}.get(t.out_t)
    width = target.acc_width
    packed_t = ir.VectorType.get([width // 2], b.i32)
    for i in range(t.mi):
        row = t.wm * t.wave_rows + (16 * i + row_l)
        for j in range(nj):
            col = t.wn * (t.bn // 2) + (16 * j + col_l)
            ok = arith.andi(b.cmp("slt", row, t.m_left), b.cmp("slt", col, t.n_left))
            voff = b.sel(ok, (row * N + col) * esz, b.c(INVALID_OFFSET))
            v = acc[(i * nj + j) // g]
            if g > 1:                      # this B tile's rows of the stacked accumulator
                v = llvm.shufflevector(ir.VectorType.get([width], b.f32), v, v, list(range(width * (j % g),
                                                                                          width * (j % g + 1))))
            if t.splitk:
                for e in range(width):
                    x = llvm.extractelement(v, b.c(e))
                    rocdl.raw_ptr_buffer_atomic_fadd(b.f32, x, out_rs, Int(voff) + 4 * e, b.c(0), aux=b.c_attr(0))
            elif half is None:
                for q in range(width // 4):    # 16-byte stores
                    part = v if width == 4 else llvm.shufflevector(b.v4f32, v, v, list(range(4 * q, 4 * q + 4)))
                    rocdl.raw_ptr_buffer_store(part, out_rs, Int(voff) + 16 * q if q else voff, b.c(0),
                                               aux=b.c_attr(0))
            else:
                packed = llvm.bitcast(packed_t, arith.truncf(ir.VectorType.get([width], half), v))
                rocdl.raw_ptr_buffer_store(packed, out_rs, voff, b.c(0), aux=b.c_attr(0))


def stage_lds_bytes(target, A, B):
    """One ring stage: the A and B tiles, then (targets staging scales in LDS) one 4-byte word
    of K-block scales per A row and per B row."""
    return A.lds_bytes + B.lds_bytes + (4 * (A.rows + B.rows) if target.scales_in_lds else 0)


def lds_bytes(arch, a_fmt, b_fmt, bm, bn, num_buffers, stage_steps=1):
    target = TARGETS[arch]
    return num_buffers * stage_lds_bytes(target, Operand(bm, a_fmt, 0, target.pad, stage_steps),
                                         Operand(bn, b_fmt, 0, target.pad, stage_steps))


def build(symbol, arch, a_fmt="e4m3", b_fmt="e4m3", bm=128, bn=128, out="bf16", splitk=0, num_buffers=2,
          b_streaming=0, stage_steps=1, **opts):
    """The ``@flyc.jit`` launcher for one variant on ``arch`` (compile-only use; see compile_for_build).
    ``opts``: the target's own options (gfx1250: scale_path, cluster_m, cluster_n)."""
    _check(arch, a_fmt, b_fmt, bm, bn, out, splitk, num_buffers, b_streaming, stage_steps, **opts)
    target_cls = TARGETS[arch]
    cfg = (a_fmt, b_fmt, bm, bn, out, splitk, num_buffers, b_streaming, stage_steps)
    threads = opts.get("waves", WAVES) * target_cls.wave
    cluster = (opts.get("cluster_n", 1), opts.get("cluster_m", 1), 1)
    clustered = cluster != (1, 1, 1)

    @fx.struct
    class SharedStorage:
        buf: fx.Array[fx.Int8, lds_bytes(arch, a_fmt, b_fmt, bm, bn, num_buffers, stage_steps), 16]

    @flyc.kernel(name=symbol)
    def mx_gemm_kernel(a: fx.Pointer, a_scale: fx.Pointer, b: fx.Pointer, b_scale: fx.Pointer, out: fx.Pointer,
                       M: fx.Int32, N: fx.Int32, K: fx.Int32, splits: fx.Int32):
        lds = fx.SharedAllocator().allocate(SharedStorage).peek()
        _body(target_cls(Builder(), **opts), cfg, *[fx.to_llvm_ptr(p) for p in (a, a_scale, b, b_scale, out)],
              *[v.ir_value() for v in (M, N, K, splits)], fx.to_llvm_ptr(lds.buf.ptr))

    @flyc.jit
    def mx_gemm(a: fx.Pointer, a_scale: fx.Pointer, b: fx.Pointer, b_scale: fx.Pointer, out: fx.Pointer,
                M: fx.Int32, N: fx.Int32, K: fx.Int32, splits: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        # a cluster launch needs whole clusters: the grid rounds up (the extra tiles load zeros, store nothing)
        gx, gy = (N + bn - 1) // bn, (M + bm - 1) // bm
        if clustered:
            gx, gy = (gx + cluster[0] - 1) // cluster[0] * cluster[0], (gy + cluster[1] - 1) // cluster[1] * cluster[1]
        attrs = {"rocdl.cluster_dims": ",".join(map(str, cluster))} if clustered else None
        mx_gemm_kernel(a, a_scale, b, b_scale, out, M, N, K, splits, value_attrs=attrs).launch(
            grid=(gx, gy, splits), block=(threads, 1, 1), stream=stream, cluster=cluster if clustered else None)

    return mx_gemm


def compile_for_build(arch: str, symbol: str, A_FMT="e4m3", B_FMT="e4m3", BM=128, BN=128, OUT="bf16",
                      SPLITK=0, NUM_BUFFERS=2, **target_opts):
    """Trace + compile once for ``arch`` (also FLYDSL_GPU_ARCH, set by the build); returns the jit fn.
    ``target_opts``: the other variant keys (STAGE_STEPS; gfx1250: SCALE_PATH, B_STREAMING, CLUSTER_M,
    CLUSTER_N, F4_WIDE). Null pointers and Python ints are compile placeholders: nothing touches a device."""
    fn = build(symbol, arch, A_FMT, B_FMT, BM, BN, OUT, SPLITK, NUM_BUFFERS,
               **{k.lower(): v for k, v in target_opts.items()})
    p = lambda t: flyc.from_c_void_p(t, 0)  # noqa: E731
    out_t = {"bf16": fx.BFloat16, "f16": fx.Float16, "f32": fx.Float32}[OUT]
    flyc.compile(fn, p(fx.Uint8), p(fx.Uint8), p(fx.Uint8), p(fx.Uint8), p(out_t), BM, BN, BK, 1)
    return fn
