"""Tensorwise FP8 grouped GEMM for MoE training (gfx950): forward NT, dgrad NN, wgrad TN (variable K).

One body computes, per group g, out_g[i, j] = rne(fp32(a_scale * b_scale) * sum_c A_g(i, c) B_g(j, c))
on v_mfma_f32_16x16x128_f8f6f4 (OCP e4m3 / e5m2, fp32 accumulation), for three layouts:

  LAYOUT  A_g(i, c)                 B_g(j, c)                 out                 groups along
  NT      a[offs[g] + i, c]         b[g, j, c]                [sum_m, N]          rows of a / out
  NN      a[offs[g] + i, c]         b[g, c, j]                [sum_m, N]          rows of a / out
  TN      a[offs[g] + c, i]         b[offs[g] + c, j]         [G, M, N]           contraction (variable K)

  a: NT/NN [sum_m, K], TN [sum_k, M];  b: NT [G, N, K], NN [G, K, N], TN [sum_k, N];  all fp8 bytes.
  a_scale, b_scale: fp32 scalars (pointers); group_offs: int64 [G + 1], non-decreasing (rows
  before offs[0] belong to no group: never read, never written). Rows from offs[G] to M, a
  padded tail of an over-allocated a: NT/NN write them as zeros without reading them (tiles
  after the groups' with an empty contraction); TN never reads them.

Numerics: each MFMA sums one 128-wide contraction chunk [128 s, 128 s + 128) of the tile (zero
padded past the end); chunks are accumulated in increasing order into fp32 from +0 (for TN the
chunks start at the group's first row). The epilogue multiplies by the fp32 product a_scale *
b_scale, with ACCUM=1 adds (fp32) the value out held (beta = 1: Megatron's fused main_grad
accumulation), and rounds to bf16 or fp16 (RNE) or stores fp32. mxgemm.reference.grouped_gemm_fp8_ref
models exactly this order.

Tiles: a workgroup of 4 waves (2 x 2) owns a BM x BN output tile; each wave a (BM/2) x (BN/2)
block of 16 x 16 MFMA tiles. Per 128-wide contraction step both operand tiles go global ->
VGPR (16-byte buffer loads, prefetched one step ahead) -> LDS (two ping-pong buffers, one
barrier per step) -> MFMA operands: 16-byte ds_reads for contraction-contiguous ("K-major")
operands, ds_read_b64_tr_b8 transposing reads for the others (NN's B, both TN operands).
The MFMA computes the transposed tile (src0 = B rows, src1 = A rows) so a lane holds 4
consecutive output columns of one row: one 8-byte store.

Masking: rows past a group's end, columns past N (or M for TN) and contraction past K (or past
the group for TN) load as zero (buffer voffset 0x80000000, out of range); stores of such rows
and columns are dropped the same way. N, K (NT/NN) and M, N (TN) must be multiples of 16; group
sizes are arbitrary, empty groups allowed (TN writes zeros for them).

64-bit addressing: every buffer resource is rebuilt per tile and per contraction step from a
64-bit base pointer advanced to the tile's first row/column and the step's first contraction
index, so a 32-bit voffset stays below max(BM, BN, 128) row strides whatever the tensor size
(row counts themselves are i32).

Tile order: for NT/NN the workgroup scans group_offs on device (one scalar loop over G) to
find its group and the total tile count; within a group tiles go in bands of `group_m`
M-tiles (L2 reuse of B). TN has G x (M/BM) x (N/BN) tiles dealt cyclically over the groups
(tile t: group t % G), so workgroups running together share out skewed contraction lengths.
Persistent and one-tile-per-workgroup launches are the same body: workgroup w runs tiles w,
w + grid, ... < total, so a grid capped at num_cu CUs loops and an over-launched grid exits early.

Kernel arguments (no hidden ones):
  a, a_scale, b, b_scale, group_offs, out     global pointers
  G, M, N, K, group_m, grid                   int32  (NT/NN: M = sum_m; TN: K = sum_k)
Launch: block = (256, 1, 1); grid = (grid, 1, 1) for any grid >= 1 (the argument must equal the
launch's workgroup count: the kernel strides its tile loop by it).
Variant keys: LAYOUT, FMT (a's format), FMT_B (b's: the f8f6f4 MFMA takes one format code per
source, so e4m3 x e5m2 mixes are the same body), OUT (bf16 / f16 / f32), ACCUM (0: out = result;
1: out += result; absent = 0), BM, BN (64, 128, 256).
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl, scf
from ir_builder import INVALID_OFFSET, Builder, Int, workgroup_barrier

THREADS = 256
BK = 128                          # contraction per step = the MFMA's K
PAD = 16                          # LDS row padding (bytes) against bank conflicts
FMT_CODE = {"e4m3": 0, "e5m2": 1}  # MFMA cbsz / blgp
LAYOUTS = ("NT", "NN", "TN")
K_MAJOR = {"NT": (True, True), "NN": (True, False), "TN": (False, False)}  # (A, B) contraction-contiguous


class _Ir(Builder):
    """The shared builder plus the loop, barrier and rebased-resource helpers of this kernel."""

    def __init__(self):
        super().__init__()
        self.v2i32 = ir.VectorType.get([2], self.i32)
        self.idx = ir.IndexType.get()

    def ceil_div(self, a, d):
        return arith.divui(arith.addi(a, self.c(d - 1)), self.c(d))

    def for_range(self, n, init=()):
        """scf.for over i32 [0, n) with loop-carried values: (op, i32 induction var, carried)."""
        loop = scf.ForOp(arith.constant(self.idx, 0), arith.index_cast(self.idx, n), arith.constant(self.idx, 1),
                         list(init))
        return loop, loop.body


class _Operand:
    """One MFMA operand X(r, c) (r: output rows for A / columns for B; c: contraction) of a tile.

    k_major: X(r, c) at base + r * ld + c (16-byte rows of the contraction), else at
    base + c * ld + r. `rows` is how many BMN rows of this tile exist; lds_off the operand's
    region inside one LDS buffer."""

    def __init__(self, b, bmn, k_major, lds_off):
        self.bmn, self.k_major, self.lds_off = bmn, k_major, lds_off
        self.stride = BK + PAD if k_major else bmn + PAD       # LDS row stride (bytes)
        self.lds_bytes = (bmn if k_major else BK) * self.stride
        self.chunks = bmn * BK // (THREADS * 16)                 # 16-byte loads per thread and step
        per_row = BK // 16 if k_major else bmn // 16
        tid = Int(fx.thread_idx.x.ir_value())
        self.slots = []                                          # (row-dim index, contraction index, LDS byte)
        for p in range(self.chunks):
            q = tid + p * THREADS
            line, col = q // per_row, q % per_row
            col = col * 16
            r, c = (line, col) if k_major else (col, line)
            self.slots.append((r, c, line * self.stride + col))

    def step_base(self, b, tile_base, ld, kt):
        """64-bit base of contraction step kt."""
        adv = b.u64(kt * BK)
        return b.gep(tile_base, adv if self.k_major else arith.muli(adv, b.u64(ld)))

    def load(self, b, base, ld, rows, c_left):
        """This thread's 16-byte chunks of the step (zeros outside rows x c_left)."""
        rs = b.rsrc_rebased(base)
        out = []
        for r, c, _ in self.slots:
            ok = arith.andi(b.cmp("slt", r, rows), b.cmp("slt", c, c_left))
            off = r * ld + c if self.k_major else c * ld + r
            voff = arith.select(ok, off, b.c(INVALID_OFFSET))
            out.append(rocdl.raw_ptr_buffer_load(b.v4i32, rs, voff, b.c(0), aux=ir.IntegerAttr.get(b.i32, 0)))
        return out

    def store_lds(self, b, buf, regs):
        for (_, _, at), v in zip(self.slots, regs):
            llvm.store(v, b.gep(buf, b.c(self.lds_off) + at), alignment=16)

    def mfma_operand(self, b, buf, r0, lane):
        """v8i32 operand of rows r0 .. r0+15 (lane l: row l % 16, contraction 16(l/16) + i % 16 + 64(i/16))."""
        g, s = lane // 16, lane % 16
        region = b.gep(buf, b.c(self.lds_off))
        if self.k_major:
            row = (r0 + s) * self.stride
            parts = [llvm.load(b.v4i32, b.gep(region, row + (g * 16 + h)), alignment=16) for h in (0, 64)]
            return llvm.shufflevector(b.v8i32, parts[0], parts[1], list(range(8)))
        # Transposing reads: lane s of a 16-lane group reads 8 bytes of contraction row
        # (k0 + s/2) at rows 8(s%2).. ; lane j receives the rows-dim element j of rows k0..k0+7.
        col = r0 + s % 2 * 8
        parts = []
        for k0 in (0, 8, 64, 72):
            krow = g * 16 + k0 + s // 2
            at = krow * self.stride + col
            parts.append(rocdl.ds_read_tr8_b64(b.v2i32, b.gep(region, at)))
        lo = llvm.shufflevector(b.v4i32, parts[0], parts[1], list(range(4)))
        hi = llvm.shufflevector(b.v4i32, parts[2], parts[3], list(range(4)))
        return llvm.shufflevector(b.v8i32, lo, hi, list(range(8)))


def _tile(b, cfg, ops, lds, a_base, a_ld, a_rows, b_base, b_ld, b_rows, c_len, out_base, out_ld, scale):
    """One BM x BN output tile. *_base: 64-bit tile bases; *_rows: existing rows of each
    operand tile; c_len: contraction length; out_ld: output row stride in elements."""
    bm, bn, (fmt_a, fmt_b), out_t, accum = cfg
    A, B = ops
    tid = Int(fx.thread_idx.x.ir_value())
    lane = tid % 64
    wave = Int(rocdl.readfirstlane(b.i32, tid // 64))
    wm, wn = wave // 2, wave % 2
    mi_n, nj_n = bm // 32, bn // 32
    a_r0 = [wm * (bm // 2) + 16 * i for i in range(mi_n)]
    b_r0 = [wn * (bn // 2) + 16 * j for j in range(nj_n)]
    buf_bytes = A.lds_bytes + B.lds_bytes
    steps = b.ceil_div(c_len, BK)

    def load(kt):
        c_left = arith.subi(c_len, kt * BK)
        return (A.load(b, A.step_base(b, a_base, a_ld, kt), a_ld, a_rows, c_left),
                B.load(b, B.step_base(b, b_base, b_ld, kt), b_ld, b_rows, c_left))

    def buffer(kt):
        return b.gep(lds, (kt & 1) * buf_bytes)

    def stage(kt, regs):
        buf = buffer(kt)
        A.store_lds(b, buf, regs[0])
        B.store_lds(b, buf, regs[1])

    stage(b.c(0), load(b.c(0)))
    workgroup_barrier()
    zero = b.splat(b.v4f32, 0.0)
    loop, body = b.for_range(steps, [zero] * (mi_n * nj_n))
    with ir.InsertionPoint(body):
        kt = Int(arith.index_cast(b.i32, loop.induction_variable))
        acc = list(loop.inner_iter_args)
        nxt = kt + 1
        regs = load(nxt)                                  # prefetch; all-zero past the last step
        buf = buffer(kt)
        a_ops = [A.mfma_operand(b, buf, r0, lane) for r0 in a_r0]
        b_ops = [B.mfma_operand(b, buf, r0, lane) for r0 in b_r0]
        zero_scale = b.c(0)                               # constant 0 scales: the unscaled opcode
        for i in range(mi_n):
            for j in range(nj_n):
                acc[i * nj_n + j] = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(
                    b.v4f32, [b_ops[j], a_ops[i], acc[i * nj_n + j], FMT_CODE[fmt_b], FMT_CODE[fmt_a], 0, zero_scale,
                              0, zero_scale])
        stage(nxt, regs)
        workgroup_barrier()
        scf.YieldOp(acc)
    acc = list(loop.results)

    _epilogue(b, out_t, accum, acc, out_base, out_ld, scale, lane, a_r0, b_r0, a_rows, b_rows)


OUT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def _epilogue(b, out_t, accum, acc, out_base, out_ld, scale, lane, a_r0, b_r0, a_rows, b_rows):
    """Lane holds out[i0 + lane%16, j0 + 4(lane/16) .. +3] of each 16 x 16 tile: one 8-byte (half)
    or 16-byte (fp32) access; accum reads the same bytes first (zeros where the store is dropped)."""
    out_rs = b.rsrc_rebased(out_base)
    elem = {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get(), "f32": b.f32}[out_t]
    v4e = ir.VectorType.get([4], elem)
    raw = b.v4f32 if out_t == "f32" else b.v2i32     # what one lane's four elements load / store as
    aux = ir.IntegerAttr.get(b.i32, 0)
    splat = llvm.shufflevector(b.v4f32, llvm.insertelement(llvm.mlir_undef(b.v4f32), scale, b.c(0)),
                               llvm.mlir_undef(b.v4f32), [0, 0, 0, 0])
    row_l = lane % 16
    col_l = lane // 16 * 4
    nj_n = len(b_r0)
    for i, r0 in enumerate(a_r0):
        row = r0 + row_l
        for j, c0 in enumerate(b_r0):
            col = c0 + col_l
            ok = arith.andi(b.cmp("slt", row, a_rows), b.cmp("slt", col, b_rows))
            voff = arith.select(ok, (row * out_ld + col) * OUT_BYTES[out_t], b.c(INVALID_OFFSET))
            v = arith.mulf(acc[i * nj_n + j], splat)
            if accum:
                old = rocdl.raw_ptr_buffer_load(raw, out_rs, voff, b.c(0), aux=aux)
                v = arith.addf(v, old if out_t == "f32" else arith.extf(b.v4f32, llvm.bitcast(v4e, old)))
            if out_t != "f32":
                v = llvm.bitcast(raw, arith.truncf(v4e, v))
            rocdl.raw_ptr_buffer_store(v, out_rs, voff, b.c(0), aux=aux)


def _offset(b, group_offs, g):
    """group_offs[g] as a uniform i32 (row counts stay below 2^31). Loads after the tile loop's
    stores may not be scalar loads; readfirstlane keeps the buffer resources built from them in
    SGPRs (no waterfall loops)."""
    return rocdl.readfirstlane(b.i32, arith.trunci(b.i32, llvm.load(
        b.i64, b.gep(group_offs, arith.muli(b.u64(g), b.c(8, b.i64))))))


def _group_bounds(b, group_offs, g):
    """(group_offs[g], group_offs[g + 1])."""
    return [_offset(b, group_offs, arith.addi(g, b.c(d))) for d in (0, 1)]


def _group_scan(b, group_offs, G, bm, n_tiles, tile):
    """Scalar scan of group_offs: (total tiles, group of `tile`, its index in the group, group start, end)."""
    zero = b.c(0)
    loop, body = b.for_range(G, [zero, zero, zero, zero, zero])
    with ir.InsertionPoint(body):
        g = arith.index_cast(b.i32, loop.induction_variable)
        start, sel_g, sel_local, sel_s, sel_e = loop.inner_iter_args
        s, e = _group_bounds(b, group_offs, g)
        count = arith.muli(b.ceil_div(arith.subi(e, s), bm), n_tiles)
        end = arith.addi(start, count)
        hit = arith.andi(b.cmp("sge", tile, start), b.cmp("slt", tile, end))
        scf.YieldOp([end, arith.select(hit, g, sel_g), arith.select(hit, arith.subi(tile, start), sel_local),
                     arith.select(hit, s, sel_s), arith.select(hit, e, sel_e)])
    return loop.results


def _swizzle(b, local, m_tiles, n_tiles, group_m):
    """(m-tile, n-tile) of a group-local tile index: bands of group_m m-tiles, n-major inside a band."""
    per_band = arith.muli(group_m, n_tiles)
    first_m = arith.muli(arith.divui(local, per_band), group_m)
    size = arith.minui(arith.subi(m_tiles, first_m), group_m)
    r = arith.remui(local, per_band)
    return arith.addi(first_m, arith.remui(r, size)), arith.divui(r, size)


def _body(cfg, layout, a, a_scale, bp, b_scale, group_offs, out, G, M, N, K, group_m, nwg, lds):
    b = _Ir()
    bm, bn, _, out_t, _ = cfg
    ka, kb = K_MAJOR[layout]
    A = _Operand(b, bm, ka, 0)
    B = _Operand(b, bn, kb, A.lds_bytes)
    ops = (A, B)
    scale = arith.mulf(llvm.load(b.f32, a_scale), llvm.load(b.f32, b_scale))
    group_m = arith.maxui(group_m, b.c(1))
    n_tiles = b.ceil_div(N, bn)
    bid = fx.block_idx.x.ir_value()
    if layout == "TN":
        m_tiles = b.ceil_div(M, bm)
        total = arith.muli(G, arith.muli(m_tiles, n_tiles))
    else:
        # rows from group_offs[G] to M (an over-allocated a's tail) are written as zeros: tiles
        # after the groups' with no contraction
        tail_s = _offset(b, group_offs, G)
        tail_tiles = arith.muli(b.ceil_div(arith.maxsi(arith.subi(M, tail_s), b.c(0)), bm), n_tiles)
        total = arith.addi(_group_scan(b, group_offs, G, bm, n_tiles, bid)[0], tail_tiles)
    iters = arith.divui(arith.addi(arith.subi(arith.maxsi(total, bid), bid), arith.subi(nwg, b.c(1))), nwg)
    loop, body = b.for_range(iters)
    with ir.InsertionPoint(body):
        tile = arith.addi(bid, arith.muli(arith.index_cast(b.i32, loop.induction_variable), nwg))
        esize = b.c(OUT_BYTES[out_t], b.i64)
        if layout == "TN":
            g = arith.remui(tile, G)
            mt, nt = _swizzle(b, arith.divui(tile, G), m_tiles, n_tiles, group_m)
            s, e = _group_bounds(b, group_offs, g)
            i0, j0 = arith.muli(mt, b.c(bm)), arith.muli(nt, b.c(bn))
            a_base = b.gep(a, arith.addi(arith.muli(b.u64(s), b.u64(M)), b.u64(i0)))
            b_base = b.gep(bp, arith.addi(arith.muli(b.u64(s), b.u64(N)), b.u64(j0)))
            out_row = arith.addi(arith.muli(b.u64(g), b.u64(M)), b.u64(i0))
            out_base = b.gep(out, arith.muli(arith.addi(arith.muli(out_row, b.u64(N)), b.u64(j0)), esize))
            _tile(b, cfg, ops, lds, a_base, M, arith.subi(M, i0), b_base, N, arith.subi(N, j0), arith.subi(e, s),
                  out_base, N, scale)
        else:
            grouped, g, local, s, e = _group_scan(b, group_offs, G, bm, n_tiles, tile)
            tail = b.cmp("sge", tile, grouped)
            g, local = arith.select(tail, b.c(0), g), arith.select(tail, arith.subi(tile, grouped), local)
            s, e = arith.select(tail, tail_s, s), arith.select(tail, M, e)
            c_len = arith.select(tail, b.c(0), K)
            mt, nt = _swizzle(b, local, b.ceil_div(arith.subi(e, s), bm), n_tiles, group_m)
            row0 = arith.addi(s, arith.muli(mt, b.c(bm)))
            j0 = arith.muli(nt, b.c(bn))
            a_base = b.gep(a, arith.muli(b.u64(row0), b.u64(K)))
            b_group = arith.muli(b.u64(g), arith.muli(b.u64(N), b.u64(K)))
            if layout == "NT":
                b_base, b_ld = b.gep(bp, arith.addi(b_group, arith.muli(b.u64(j0), b.u64(K)))), K
            else:
                b_base, b_ld = b.gep(bp, arith.addi(b_group, b.u64(j0))), N
            out_base = b.gep(out, arith.muli(arith.addi(arith.muli(b.u64(row0), b.u64(N)), b.u64(j0)), esize))
            _tile(b, cfg, ops, lds, a_base, K, arith.subi(e, row0), b_base, b_ld, arith.subi(N, j0), c_len,
                  out_base, N, scale)
        scf.YieldOp([])


def build(symbol: str, layout="NT", fmt="e4m3", fmt_b="e4m3", out="bf16", bm=64, bn=64, accum=0):
    """The ``@flyc.jit`` launcher of kernel ``symbol`` for one variant (compile-only use; see compile_for_build)."""
    if layout not in LAYOUTS or fmt not in FMT_CODE or fmt_b not in FMT_CODE or out not in OUT_BYTES \
            or bm not in (64, 128, 256) or bn not in (64, 128, 256) or accum not in (0, 1):
        raise ValueError(f"variant LAYOUT={layout} FMT={fmt} FMT_B={fmt_b} OUT={out} BM={bm} BN={bn} ACCUM={accum}: "
                         f"LAYOUT in {LAYOUTS}, FMT and FMT_B in {tuple(FMT_CODE)}, OUT in {tuple(OUT_BYTES)}, BM and "
                         f"BN in (64, 128, 256), ACCUM in (0, 1)")
    ka, kb = K_MAJOR[layout]
    lds_bytes = 2 * sum((n if k else BK) * ((BK if k else n) + PAD) for n, k in ((bm, ka), (bn, kb)))
    cfg = (bm, bn, (fmt, fmt_b), out, accum)

    @fx.struct
    class SharedStorage:
        buf: fx.Array[fx.Int8, lds_bytes, 16]

    @flyc.kernel(name=symbol)
    def grouped_gemm_fp8_kernel(a: fx.Pointer, a_scale: fx.Pointer, b: fx.Pointer, b_scale: fx.Pointer,
                                group_offs: fx.Pointer, out: fx.Pointer, G: fx.Int32, M: fx.Int32, N: fx.Int32,
                                K: fx.Int32, group_m: fx.Int32, grid: fx.Int32):
        lds = fx.SharedAllocator().allocate(SharedStorage).peek()
        _body(cfg, layout, *[fx.to_llvm_ptr(p) for p in (a, a_scale, b, b_scale, group_offs, out)],
              *[v.ir_value() for v in (G, M, N, K, group_m, grid)], fx.to_llvm_ptr(lds.buf.ptr))

    @flyc.jit
    def grouped_gemm_fp8(a: fx.Pointer, a_scale: fx.Pointer, b: fx.Pointer, b_scale: fx.Pointer,
                         group_offs: fx.Pointer, out: fx.Pointer, G: fx.Int32, M: fx.Int32, N: fx.Int32,
                         K: fx.Int32, group_m: fx.Int32, grid: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        grouped_gemm_fp8_kernel(a, a_scale, b, b_scale, group_offs, out, G, M, N, K, group_m, grid).launch(
            grid=(grid, 1, 1), block=(THREADS, 1, 1), stream=stream)

    return grouped_gemm_fp8


def compile_for_build(arch: str, symbol: str, LAYOUT="NT", FMT="e4m3", FMT_B="e4m3", OUT="bf16", BM=64,
                      BN=64, ACCUM=0):
    """Trace + compile once (arch from FLYDSL_GPU_ARCH, set by the build); returns the jit fn.
    Null pointers and Python ints are compile placeholders: nothing touches a device."""
    fn = build(symbol, LAYOUT, FMT, FMT_B, OUT, BM, BN, ACCUM)
    p = lambda t: flyc.from_c_void_p(t, 0)  # noqa: E731
    flyc.compile(fn, p(fx.Uint8), p(fx.Float32), p(fx.Uint8), p(fx.Float32), p(fx.Int64),
                 p({"bf16": fx.BFloat16, "f16": fx.Float16, "f32": fx.Float32}[OUT]), 1, 64, 64, 128, 1, 1)
    return fn
