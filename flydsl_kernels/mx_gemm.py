"""MX GEMM for prefill: out[m, n] = sum_k A[m, k] B[n, k] with 1x32 e8m0 K-block scales (MXFP8,
MXFP4, A8W4), one body for every target.

Operands: a [M, K] (fp8 bytes, or e2m1 packed two per byte: [M, K/2], even k in the low
nibble), b [N, K] likewise, a_scale [M, K/32] and b_scale [N, K/32] e8m0 bytes; out [M, N]
bf16 / f16 / f32. A_FMT, B_FMT in {e4m3, e5m2, e2m1}.

The seam. The body (`_body`) owns everything that does not depend on the target: the tiling
(a BM x BN output tile per workgroup, 4 waves as 2 x 2, each wave (BM/2) x (BN/2) in 16 x 16
tiles), the split of the K steps over grid z, 64-bit tile rebasing, the LDS ring of
NUM_BUFFERS stages, the K loop (wait for stage kt, read its fragments, issue stage kt+1, MMA)
and the epilogue (masked stores, or fp32 atomics for split-K). A target object supplies the
rest, chosen by `compile_for_build(arch, ...)` from TARGETS:
  wave                     lanes per wave
  stage_loads(...)         global -> LDS of one operand's K step (and its scale bytes)
  stage_wait()             the wait + workgroup barrier that makes a stage visible
  fragment(op, buf, r0)    LDS -> the MMA operand registers of rows r0 .. r0+15
  scale_voffsets / mma     the scaled 16x16x128 MMA atom and where its scale bytes come from
  acc_coords(lane)         (row, first column) of a lane's accumulator elements (consecutive)
gfx950 (`Gfx950`): wave64, 16-byte buffer -> LDS DMA (LDS chunk c of row r holds memory chunk
c ^ (r % chunks_per_row)), scale bytes by buffer loads into VGPRs one step ahead,
v_mfma_scale_f32_16x16x128_f8f6f4 with src0 = B rows and src1 = A rows, so lane l accumulates
out[m = l % 16][n = 4 (l / 16) + i], i < 4.

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
Launch: grid = (ceil(N / BN), ceil(M / BM), splits), block = (4 * wave, 1, 1).
Variant keys: A_FMT, B_FMT, BM, BN (64, 128, 256), OUT (bf16, f16, f32), SPLITK (0, 1; 1 needs
OUT=f32), NUM_BUFFERS (2).
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl, scf

from ir_builder import BUFFER_FLAGS, INVALID_OFFSET, WAIT_LGKMCNT0, Builder, loads_done_barrier

BK = 128                           # K per step = the MMA's K
SCALE_BLOCK = 32
FMT_CODE = {"e4m3": 0, "e5m2": 1, "e2m1": 4}   # MMA cbsz / blgp
TILES = (64, 128, 256)
OUTS = ("bf16", "f16", "f32")
NUM_RECORDS = 0x7FFFFFFF           # rebased resources: every valid voffset is below 2^31
WAVES = 4                          # 2 x 2 per workgroup


class Operand:
    """One operand tile in LDS: `rows` rows (BM for A, BN for B) of one K step each."""

    def __init__(self, rows, fmt, lds_off):
        self.rows, self.fmt, self.lds_off = rows, fmt, lds_off
        self.step_bytes = BK // 2 if fmt == "e2m1" else BK       # bytes of one row per K step
        self.chunks = self.step_bytes // 16                       # 16-byte chunks per row
        self.lds_bytes = rows * self.step_bytes


class Gfx950:
    """gfx950: wave64, buffer -> LDS DMA, v_mfma_scale_f32_16x16x128_f8f6f4."""
    wave = 64

    def __init__(self, b):
        self.b = b

    def threads(self):
        return WAVES * self.wave

    def dma_plan(self, op, tid, rows_left, row_bytes):
        """Per DMA issue j: (LDS byte of this wave's 1 KiB slice, voffset of this lane's chunk).
        Slot s = 4096 j + 16 tid: row s / row_step, LDS chunk c holds memory chunk c ^ (row % chunks)."""
        b, t = self.b, self.threads()
        plan = []
        for j in range(op.lds_bytes // (16 * t)):
            s = b.add(b.c(j * t), tid)
            row = arith.divui(s, b.c(op.chunks))
            chunk = arith.xori(arith.remui(s, b.c(op.chunks)), arith.remui(row, b.c(op.chunks)))
            voff = b.sel(b.cmp("slt", row, rows_left), b.add(b.mul(row, row_bytes), b.mul(chunk, b.c(16))),
                         b.c(INVALID_OFFSET))
            wave = rocdl.readfirstlane(b.i32, arith.divui(tid, b.c(self.wave)))
            plan.append((b.add(b.c(op.lds_off + j * t * 16), b.mul(wave, b.c(16 * self.wave))), voff))
        return plan

    def stage_loads(self, rsrc, plan, buf, kt, op):
        b = self.b
        for dst, voff in plan:
            rocdl.raw_ptr_buffer_load_lds(rsrc, b.gep(buf, dst), b.c(16), voff, b.mul(kt, b.c(op.step_bytes)),
                                          b.c(0), aux=b.c_attr(0))

    def stage_wait(self):
        loads_done_barrier()

    def fragment(self, op, buf, row):
        """v8i32 MMA operand of LDS row `row` (this lane's): fp8 chunks g and g + 4 (bytes
        16g.. and 64 + 16g..), fp4 chunk g (nibbles 32g..) in the low half, zeros above."""
        b = self.b
        lane = arith.remui(fx.thread_idx.x.ir_value(), b.c(self.wave))
        g = arith.divui(lane, b.c(16))
        base = b.add(b.c(op.lds_off), b.mul(row, b.c(op.step_bytes)))
        halves = range(2) if op.chunks == 8 else range(1)
        parts = [llvm.load(b.v4i32, b.gep(buf, b.add(base, b.mul(
            arith.xori(b.add(g, b.c(4 * h)), arith.remui(row, b.c(op.chunks))), b.c(16)))), alignment=16)
            for h in halves]
        if len(parts) == 1:
            parts.append(arith.constant(b.v4i32, ir.DenseElementsAttr.get_splat(b.v4i32, ir.IntegerAttr.get(b.i32, 0))))
        return llvm.shufflevector(b.v8i32, parts[0], parts[1], list(range(8)))

    def lane_rows(self):
        """(row of the 16-row tile this lane feeds, K block of the 128-wide step whose scale it holds)."""
        b = self.b
        lane = arith.remui(fx.thread_idx.x.ir_value(), b.c(self.wave))
        return arith.remui(lane, b.c(16)), arith.divui(lane, b.c(16))

    def mma(self, acc, a_frag, a_scale, a_fmt, b_frag, b_scale, b_fmt):
        return fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(
            self.b.v4f32, [b_frag, a_frag, acc, FMT_CODE[b_fmt], FMT_CODE[a_fmt], 0, b_scale, 0, a_scale])

    def acc_coords(self):
        """(row in the 16 x 16 tile, first of the 4 consecutive columns) of this lane's accumulator."""
        b = self.b
        lane = arith.remui(fx.thread_idx.x.ir_value(), b.c(self.wave))
        return arith.remui(lane, b.c(16)), b.mul(arith.divui(lane, b.c(16)), b.c(4))


TARGETS = {"gfx950": Gfx950}


def _check(a_fmt, b_fmt, bm, bn, out, splitk, num_buffers):
    ok = (a_fmt in FMT_CODE and b_fmt in FMT_CODE and bm in TILES and bn in TILES and out in OUTS
          and splitk in (0, 1) and (not splitk or out == "f32") and num_buffers == 2)
    if not ok:
        raise ValueError(f"variant A_FMT={a_fmt} B_FMT={b_fmt} BM={bm} BN={bn} OUT={out} SPLITK={splitk} "
                         f"NUM_BUFFERS={num_buffers}: formats in {tuple(FMT_CODE)}, BM and BN in {TILES}, OUT in "
                         f"{OUTS}, SPLITK 0 or 1 (1 needs OUT=f32), NUM_BUFFERS 2")


def _rsrc(b, base):
    return rocdl.make_buffer_rsrc(b.rsrc_t, base, b.c(0, b.i16), b.c(NUM_RECORDS, b.i64), b.c(BUFFER_FLAGS))


def _body(target, cfg, a, a_scale, bp, b_scale, out, M, N, K, splits, lds):
    a_fmt, b_fmt, bm, bn, out_t, splitk, num_buffers = cfg
    b = target.b
    A = Operand(bm, a_fmt, 0)
    B = Operand(bn, b_fmt, A.lds_bytes)
    stage_bytes = A.lds_bytes + B.lds_bytes
    tid = fx.thread_idx.x.ir_value()
    wave = rocdl.readfirstlane(b.i32, arith.divui(tid, b.c(target.wave)))
    wm, wn = arith.shrui(wave, b.c(1)), arith.andi(wave, b.c(1))
    n0 = b.mul(fx.block_idx.x.ir_value(), b.c(bn))
    m0 = b.mul(fx.block_idx.y.ir_value(), b.c(bm))
    steps = arith.divui(K, b.c(BK))
    per_split = arith.divui(b.add(steps, b.add(splits, b.c(-1))), splits)
    k_lo = arith.minui(b.mul(fx.block_idx.z.ir_value(), per_split), steps)
    nsteps = arith.subi(arith.minui(b.add(k_lo, per_split), steps), k_lo)
    kblocks = arith.divui(K, b.c(SCALE_BLOCK))

    # Tile-rebased resources: row r of the tile at voffset r * row_bytes, K step kt at soffset.
    def base(ptr, row0, row_bytes, k_off):
        return b.gep(ptr, arith.addi(arith.muli(b.u64(row0), b.u64(row_bytes)), b.u64(k_off)))

    a_row = b.mul(arith.divui(K, b.c(BK)), b.c(A.step_bytes))
    b_row = b.mul(arith.divui(K, b.c(BK)), b.c(B.step_bytes))
    rs = {"a": _rsrc(b, base(a, m0, a_row, b.mul(k_lo, b.c(A.step_bytes)))),
          "b": _rsrc(b, base(bp, n0, b_row, b.mul(k_lo, b.c(B.step_bytes)))),
          "sa": _rsrc(b, base(a_scale, m0, kblocks, b.mul(k_lo, b.c(BK // SCALE_BLOCK)))),
          "sb": _rsrc(b, base(b_scale, n0, kblocks, b.mul(k_lo, b.c(BK // SCALE_BLOCK))))}
    null = rocdl.make_buffer_rsrc(b.rsrc_t, llvm.mlir_zero(b.gptr), b.c(0, b.i16), b.c(0, b.i64),
                                  b.c(BUFFER_FLAGS))
    m_left, n_left = arith.subi(M, m0), arith.subi(N, n0)
    a_dma = target.dma_plan(A, tid, m_left, a_row)
    b_dma = target.dma_plan(B, tid, n_left, b_row)

    # This lane's fragment rows and scale offsets per 16-row tile.
    r16, kb = target.lane_rows()
    a_rows = [b.add(b.mul(wm, b.c(bm // 2)), b.add(b.c(16 * i), r16)) for i in range(bm // 32)]
    b_rows = [b.add(b.mul(wn, b.c(bn // 2)), b.add(b.c(16 * j), r16)) for j in range(bn // 32)]

    def scale_voff(r, left):
        return b.sel(b.cmp("slt", r, left), b.add(b.mul(r, kblocks), kb), b.c(INVALID_OFFSET))

    sa_voff = [scale_voff(r, m_left) for r in a_rows]
    sb_voff = [scale_voff(r, n_left) for r in b_rows]

    def buffer(kt):
        slot = arith.remui(kt, b.c(num_buffers))
        return b.gep(lds, b.mul(slot, b.c(stage_bytes)))

    def issue(kt, live):
        """Stage kt's operand tiles -> LDS and its scale bytes -> VGPRs (empty resources past the end)."""
        sel = {k: llvm.select(live, v, null) for k, v in rs.items()}
        buf = buffer(kt)
        target.stage_loads(sel["a"], a_dma, buf, kt, A)
        target.stage_loads(sel["b"], b_dma, buf, kt, B)
        soff = b.mul(kt, b.c(BK // SCALE_BLOCK))
        return ([arith.extui(b.i32, rocdl.raw_ptr_buffer_load(b.i8, sel["sa"], v, soff, aux=b.c_attr(0)))
                 for v in sa_voff] +
                [arith.extui(b.i32, rocdl.raw_ptr_buffer_load(b.i8, sel["sb"], v, soff, aux=b.c_attr(0)))
                 for v in sb_voff])

    mi, nj = len(a_rows), len(b_rows)
    zero = b.splat(b.v4f32, 0.0)
    scales = issue(b.c(0), b.cmp("sgt", nsteps, b.c(0)))   # a split past the last step loads nothing
    idx = ir.IndexType.get()
    loop = scf.ForOp(arith.constant(idx, 0), arith.index_cast(idx, nsteps), arith.constant(idx, 1),
                     [zero] * (mi * nj) + scales)
    with ir.InsertionPoint(loop.body):
        kt = arith.index_cast(b.i32, loop.induction_variable)
        carried = list(loop.inner_iter_args)
        acc, scales = carried[:mi * nj], carried[mi * nj:]
        target.stage_wait()
        buf = buffer(kt)
        a_frag = [target.fragment(A, buf, r) for r in a_rows]
        b_frag = [target.fragment(B, buf, r) for r in b_rows]
        kn = b.add(kt, b.c(1))
        nxt = issue(kn, b.cmp("slt", kn, nsteps))
        rocdl.s_waitcnt(WAIT_LGKMCNT0)
        for i in range(mi):
            for j in range(nj):
                acc[i * nj + j] = target.mma(acc[i * nj + j], a_frag[i], scales[i], a_fmt, b_frag[j],
                                             scales[mi + j], b_fmt)
        fx.rocdl.sched_barrier(0)
        scf.YieldOp(acc + nxt)
    acc = list(loop.results)[:mi * nj]

    # Epilogue: each lane holds 4 consecutive columns of one row per 16 x 16 tile.
    esz = 4 if out_t == "f32" else 2
    out_rs = _rsrc(b, b.gep(out, arith.muli(arith.addi(arith.muli(b.u64(m0), b.u64(N)), b.u64(n0)),
                                            b.c(esz, b.i64))))
    row_l, col_l = target.acc_coords()
    half = {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get()}.get(out_t)
    v2i32 = ir.VectorType.get([2], b.i32)
    for i in range(mi):
        row = b.add(b.mul(wm, b.c(bm // 2)), b.add(b.c(16 * i), row_l))
        for j in range(nj):
            col = b.add(b.mul(wn, b.c(bn // 2)), b.add(b.c(16 * j), col_l))
            ok = arith.andi(b.cmp("slt", row, m_left), b.cmp("slt", col, n_left))
            voff = b.sel(ok, b.mul(b.add(b.mul(row, N), col), b.c(esz)), b.c(INVALID_OFFSET))
            v = acc[i * nj + j]
            if splitk:
                for e in range(4):
                    x = llvm.extractelement(v, b.c(e))
                    rocdl.raw_ptr_buffer_atomic_fadd(b.f32, x, out_rs, b.add(voff, b.c(4 * e)), b.c(0), aux=b.c_attr(0))
            elif half is None:
                rocdl.raw_ptr_buffer_store(v, out_rs, voff, b.c(0), aux=b.c_attr(0))
            else:
                packed = llvm.bitcast(v2i32, arith.truncf(ir.VectorType.get([4], half), v))
                rocdl.raw_ptr_buffer_store(packed, out_rs, voff, b.c(0), aux=b.c_attr(0))


def lds_bytes(a_fmt, b_fmt, bm, bn, num_buffers):
    return num_buffers * sum(Operand(r, f, 0).lds_bytes for r, f in ((bm, a_fmt), (bn, b_fmt)))


def build(symbol, arch, a_fmt="e4m3", b_fmt="e4m3", bm=128, bn=128, out="bf16", splitk=0, num_buffers=2):
    """The ``@flyc.jit`` launcher for one variant on ``arch`` (compile-only use; see compile_for_build)."""
    _check(a_fmt, b_fmt, bm, bn, out, splitk, num_buffers)
    target_cls = TARGETS[arch]
    cfg = (a_fmt, b_fmt, bm, bn, out, splitk, num_buffers)
    threads = WAVES * target_cls.wave

    @fx.struct
    class SharedStorage:
        buf: fx.Array[fx.Int8, lds_bytes(a_fmt, b_fmt, bm, bn, num_buffers), 16]

    @flyc.kernel(name=symbol)
    def mx_gemm_kernel(a: fx.Pointer, a_scale: fx.Pointer, b: fx.Pointer, b_scale: fx.Pointer, out: fx.Pointer,
                       M: fx.Int32, N: fx.Int32, K: fx.Int32, splits: fx.Int32):
        lds = fx.SharedAllocator().allocate(SharedStorage).peek()
        _body(target_cls(Builder()), cfg, *[fx.to_llvm_ptr(p) for p in (a, a_scale, b, b_scale, out)],
              *[v.ir_value() for v in (M, N, K, splits)], fx.to_llvm_ptr(lds.buf.ptr))

    @flyc.jit
    def mx_gemm(a: fx.Pointer, a_scale: fx.Pointer, b: fx.Pointer, b_scale: fx.Pointer, out: fx.Pointer,
                M: fx.Int32, N: fx.Int32, K: fx.Int32, splits: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        mx_gemm_kernel(a, a_scale, b, b_scale, out, M, N, K, splits).launch(
            grid=((N + bn - 1) // bn, (M + bm - 1) // bm, splits), block=(threads, 1, 1), stream=stream)

    return mx_gemm


def compile_for_build(arch: str, symbol: str, A_FMT="e4m3", B_FMT="e4m3", BM=128, BN=128, OUT="bf16",  # noqa: N803
                      SPLITK=0, NUM_BUFFERS=2):
    """Trace + compile once for ``arch`` (also FLYDSL_GPU_ARCH, set by the build); returns the jit fn.
    Null pointers and Python ints are compile placeholders: nothing touches a device."""
    fn = build(symbol, arch, A_FMT, B_FMT, BM, BN, OUT, SPLITK, NUM_BUFFERS)
    p = lambda t: flyc.from_c_void_p(t, 0)  # noqa: E731
    out_t = {"bf16": fx.BFloat16, "f16": fx.Float16, "f32": fx.Float32}[OUT]
    flyc.compile(fn, p(fx.Uint8), p(fx.Uint8), p(fx.Uint8), p(fx.Uint8), p(out_t), BM, BN, BK, 1)
    return fn
