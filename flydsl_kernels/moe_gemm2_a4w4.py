"""a4w4 MXFP4 MoE gemm2 (down-projection): the FlyDSL port of csrc/kernels/moe_gemm2_a4w4.hip.

The port is 1:1 and must stay bit-identical to the HIP kernel: same tiles (BM sorted rows x
256 columns per workgroup of 4 waves, 4 MFMA n-tiles per wave), same K mapping (lane group
g = lane/16 holds the 32-wide K blocks 2g and 2g+1 of each 256-wide K step, scale bytes
picked by op_sel), same loads (W and scales by raw buffer loads one step ahead into two
alternating register sets, activations by 16-byte buffer->LDS DMA rounds into two buffers
with the chunk ^ (row & 7) swizzle), same fences (s_waitcnt vmcnt(0) + workgroup release/acquire around s_barrier
per K step,
lgkmcnt(0) before the MFMAs, a sched_barrier after them), same MFMA order (k-step, m-tile,
n-tile) and the same epilog (f32 multiply by the top-k weight, RNE to bf16, two
global_atomic_pk_add_bf16 per (m-tile, n-tile) in the same order, or with ROUTE_ROWS one 8-byte
store into the route's row). The HIP file's header
comment documents the layouts; this file only names where the port differs in spelling, and in
one load's place: at BM 16 (WEIGHTS_FIRST) the port reads each row's top-k weight in the
prologue, with its sorted id, where HIP reads it in the epilog after the K loop, so that its
latency does not follow the K loop's (Kimi-K2.5 gemm2 T 1 on the timing model: 4.81 -> 4.60 us;
docs/peers/moe_a4w4.md).

It is written against FlyDSL's MLIR builders (llvm / rocdl / scf dialects) rather than its
layout algebra, so every IR operation has its one counterpart in the HIP source. All helpers
live at module level: FlyDSL's AST rewriter only rewrites the @flyc.kernel function body, and
the scf loops/ifs here are built explicitly.

Kernel argument ABI (same order and types as the HIP kernel; no hidden arguments)::

  a, a_scale, w, w_scale        global pointers (uint8)
  sorted_token_ids, sorted_expert_ids, num_valid_ids   global pointers (int32)
  sorted_weights                global pointer (f32)
  out                           global pointer (bf16)
  tokens, topk, experts, n, k   int32
  blocks                        int32: the grid's y size (the routing's block count)

Launch: grid = (n / 256, num_blocks, 1), block = (256, 1, 1). Variant keys: BM (16, 32, 64, 128), NT (0, 1),
ROUTE_ROWS (0: out [T, N] by atomics; 1: out [T*topk, N], one row per route).
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl, scf
from ir_builder import INVALID_OFFSET, XCDS, k_loop, pipelined_step
from ir_builder import Builder as _B

THREADS = 256
BLOCK_N = 256
BLOCK_K = 256
ROW_BYTES = BLOCK_K // 2          # packed fp4 bytes of one row per K step
WAVE_N = BLOCK_N // 4             # columns per wave
N_TILES = WAVE_N // 16            # MFMA n-tiles per wave
ROUND_BYTES = 4 * 64 * 16         # one 16-byte-per-lane DMA by every wave
BLOCK_MS = (16, 32, 64, 128)
# Block sizes whose top-k weights are read in the prologue (decode: the load's latency would
# follow the K loop's); larger blocks read them in the epilog, as HIP, whose wait for each
# m-tile's weight spaces the atomics out (docs/peers/moe_a4w4.md).
WEIGHTS_FIRST = (16,)


def dma_rounds(bm):
    """DMAs per wave per K step; an LDS buffer holds this many rounds (at least one)."""
    return max(1, bm * ROW_BYTES // ROUND_BYTES)


def buffer_bytes(bm):
    """One of the two A buffers in LDS: every DMA slot of a K step."""
    return dma_rounds(bm) * ROUND_BYTES


def _sorted_row(b, sorted_token_ids, idx, num_valid, tokens, topk):
    """(expanded activation row, token, row index safe to load at), row = -1 for padding.

    Reads sorted_token_ids at idx when idx < num_valid, else at 0 (any live index): the
    kernel only runs when num_valid > 0, so every load is in bounds with no branch."""
    live = b.cmp("slt", idx, num_valid)
    safe = b.sel(live, idx, b.c(0))
    sid = b.gload(b.i32, sorted_token_ids, b.mul(safe, b.c(4)), 4)
    token = arith.andi(sid, b.c(0xFFFFFF))
    slot = arith.shrui(sid, b.c(24))
    ok = arith.andi(live, arith.andi(b.cmp("slt", token, tokens), b.cmp("slt", slot, topk)))
    arow = b.sel(ok, b.add(b.mul(token, topk), slot), b.c(-1))
    return arow, token, safe


def _xcd_tile(b, x, y, columns, grid_rows):
    """(column block, row block) of grid workgroup (x, y): the HIP kernel's xcd_tile (each XCD a
    contiguous column-major run of every chunk of 8 row blocks)."""
    first = arith.subi(y, arith.remui(y, b.c(XCDS)))
    left = arith.subi(grid_rows, first)
    rows = b.sel(b.cmp("slt", left, b.c(XCDS)), left, b.c(XCDS))
    count = b.mul(rows, columns)
    dealt = arith.subi(count, arith.remui(count, b.c(XCDS)))
    w = b.add(b.mul(arith.subi(y, first), columns), x)
    q = b.sel(b.cmp("slt", w, dealt),
              b.add(b.mul(arith.remui(w, b.c(XCDS)), arith.divui(dealt, b.c(XCDS))), arith.divui(w, b.c(XCDS))), w)
    return arith.divui(q, rows), b.add(first, arith.remui(q, rows))


def _body(bm, nt, route_rows, a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
          sorted_weights, out, tokens, topk, experts, n, k, blocks, lds_base):
    b = _B()
    m_tiles = bm // 16
    dma_waves = bm * ROW_BYTES // (dma_rounds(bm) * 64 * 16)
    aux_w = 2 if nt else 0
    column, block_m = fx.block_idx.x.ir_value(), fx.block_idx.y.ir_value()
    if route_rows and bm > 16:    # the HIP kernel's kXcdOrder
        column, block_m = _xcd_tile(b, column, block_m, arith.divui(n, b.c(BLOCK_N)), blocks)
    m0 = b.mul(block_m, b.c(bm))
    num_valid = b.gload(b.i32, num_valid_ids, b.c(0), 4)
    expert = b.gload(b.i32, sorted_expert_ids, b.mul(block_m, b.c(4)), 4)
    run = arith.andi(b.cmp("slt", m0, num_valid),
                     arith.andi(b.cmp("sge", expert, b.c(0)), b.cmp("slt", expert, experts)))
    if_run = scf.IfOp(run, [], has_else=False)
    with ir.InsertionPoint(if_run.then_block):
        _workgroup(b, bm, m_tiles, dma_waves, aux_w, route_rows, a, a_scale, w, w_scale, sorted_token_ids,
                   sorted_weights, out, tokens, topk, n, k, lds_base, column, m0, num_valid, expert)
        scf.YieldOp([])


def _workgroup(b, bm, m_tiles, dma_waves, aux_w, route_rows, a, a_scale, w, w_scale, sorted_token_ids,
               sorted_weights, out, tokens, topk, n, k, lds_base, column, m0, num_valid, expert):
    v4bf16 = ir.VectorType.get([4], b.bf16)
    tid = fx.thread_idx.x.ir_value()
    lane = arith.remui(tid, b.c(64))
    wave = rocdl.readfirstlane(b.i32, arith.divui(tid, b.c(64)))  # uniform: scalar selects
    g = arith.divui(lane, b.c(16))
    r16 = arith.remui(lane, b.c(16))
    n_wave = b.add(b.mul(column, b.c(BLOCK_N)), b.mul(wave, b.c(WAVE_N)))
    k_bytes = arith.divui(k, b.c(2))
    k_scales = arith.divui(k, b.c(32))
    k_steps = arith.divsi(k, b.c(BLOCK_K))

    # Buffer resources: A over all expanded rows, W rebased to this expert.
    a_rows = b.mul(tokens, topk)
    a_rsrc = b.rsrc(a, b.mul(a_rows, k_bytes))
    as_rsrc = b.rsrc(a_scale, b.mul(a_rows, k_scales))
    w_expert_bytes = b.mul(n, k_bytes)
    ws_expert_bytes = b.mul(n, k_scales)
    w_base = b.gep(w, arith.muli(b.u64(expert), b.u64(w_expert_bytes)))
    ws_base = b.gep(w_scale, arith.muli(b.u64(expert), b.u64(ws_expert_bytes)))
    w_rsrc = b.rsrc(w_base, w_expert_bytes)
    ws_rsrc = b.rsrc(ws_base, ws_expert_bytes)
    null_rsrc = b.rsrc(llvm.mlir_zero(b.gptr), b.c(0))

    # This lane's share of the A DMA: in round r, slot t = r*256 + wave*64 + lane holds row
    # t/8, LDS chunk t%8, i.e. memory chunk (t%8) ^ (row & 7).
    rounds, buf_bytes = dma_rounds(bm), buffer_bytes(bm)
    dma_wave = b.cmp("ult", wave, b.c(dma_waves))
    dma_voff = []
    for r in range(rounds):
        t = b.add(b.c(r * 256), b.add(b.mul(wave, b.c(64)), lane))
        row = arith.divui(t, b.c(8))
        chunk = arith.xori(arith.remui(t, b.c(8)), arith.andi(row, b.c(7)))
        arow, _, _ = _sorted_row(b, sorted_token_ids, b.add(m0, row), num_valid, tokens, topk)
        dma_ok = arith.andi(dma_wave, b.cmp("sge", arow, b.c(0)))
        dma_voff.append(b.sel(dma_ok, b.add(b.mul(arow, k_bytes), b.mul(chunk, b.c(16))), b.c(INVALID_OFFSET)))
    dma_lds = [[b.gep(lds_base, b.add(b.c(i * buf_bytes + r * ROUND_BYTES), b.mul(wave, b.c(1024))))
                for r in range(rounds)] for i in range(2)]

    # The rows this lane feeds to the MFMA (src1) and later accumulates into out, and (WEIGHTS_FIRST)
    # their top-k weights; otherwise the epilog loads each weight at the row's safe index.
    def topk_weight(safe):
        return b.gload(b.f32, sorted_weights, b.mul(safe, b.c(4)), 4)

    weights_first = bm in WEIGHTS_FIRST
    rows, prologue_weights, as_voff = [], [], []
    for mt in range(m_tiles):
        ar, tok, safe = _sorted_row(b, sorted_token_ids, b.add(m0, b.add(b.c(mt * 16), r16)), num_valid, tokens,
                                    topk)
        rows.append((ar, tok, safe))
        if weights_first:
            prologue_weights.append(topk_weight(safe))
        as_voff.append(b.sel(b.cmp("sge", ar, b.c(0)), b.add(b.mul(ar, k_scales), b.mul(b.c(2), g)),
                             b.c(INVALID_OFFSET)))
    w_voff, ws_voff = [], []
    for ntile in range(N_TILES):
        nrow = b.add(n_wave, b.add(b.c(ntile * 16), r16))
        w_voff.append(b.add(b.mul(nrow, k_bytes), b.mul(b.c(32), g)))
        ws_voff.append(b.add(b.mul(nrow, k_scales), b.mul(b.c(2), g)))
    a_lds_off = []
    for mt in range(m_tiles):
        r = b.add(b.c(mt * 16), r16)
        a_lds_off.append([b.add(b.mul(r, b.c(ROW_BYTES)),
                                b.mul(arith.xori(b.add(b.mul(b.c(2), g), b.c(s)), arith.andi(r, b.c(7))), b.c(16)))
                          for s in range(2)])

    def load_step(kt, live):
        """W data [n-tile][k-step], W scales [n-tile], A scales [m-tile] of K step kt; `live`
        false swaps in the empty resource (loads return zeros without touching memory)."""
        wr, wsr, asr = (llvm.select(live, x, null_rsrc) for x in (w_rsrc, ws_rsrc, as_rsrc))
        soff_data, soff_scale = b.mul(kt, b.c(ROW_BYTES)), b.mul(kt, b.c(BLOCK_K // 32))
        aux = ir.IntegerAttr.get(b.i32, aux_w)
        wf = [[rocdl.raw_ptr_buffer_load(b.v4i32, wr, b.add(w_voff[ntile], b.c(16 * s)), soff_data, aux=aux)
               for s in range(2)] for ntile in range(N_TILES)]
        ws = [arith.extui(b.i32, rocdl.raw_ptr_buffer_load(b.i16, wsr, ws_voff[ntile], soff_scale, aux=aux))
              for ntile in range(N_TILES)]
        as_ = [arith.extui(b.i32, rocdl.raw_ptr_buffer_load(b.i16, asr, as_voff[mt], soff_scale,
                                                              aux=ir.IntegerAttr.get(b.i32, 0)))
               for mt in range(m_tiles)]
        return wf, ws, as_

    def dma_step(kt, live):
        """A(kt) -> LDS buffer kt&1. Waves without A rows, and the DMA after the last step,
        write zeros (empty resource) into LDS nobody reads."""
        rs = llvm.select(arith.andi(live, dma_wave), a_rsrc, null_rsrc)
        even = b.cmp("eq", arith.andi(kt, b.c(1)), b.c(0))
        for r in range(rounds):
            lds = llvm.select(even, dma_lds[0][r], dma_lds[1][r])
            rocdl.raw_ptr_buffer_load_lds(rs, lds, b.c(16), dma_voff[r], b.mul(kt, b.c(ROW_BYTES)), b.c(0),
                                          aux=ir.IntegerAttr.get(b.i32, 0))

    zero4 = arith.constant(b.v4i32, ir.DenseElementsAttr.get_splat(b.v4i32, ir.IntegerAttr.get(b.i32, 0)))

    def widen(v4):
        # e2m1 uses the low 4 of the 8 operand registers (as the HIP {x0..x3, 0, 0, 0, 0}).
        return llvm.shufflevector(b.v8i32, v4, zero4, list(range(8)))

    def read_tile(kt):
        tile = b.gep(lds_base, b.mul(arith.andi(kt, b.c(1)), b.c(buf_bytes)))
        return [[llvm.load(b.v4i32, b.gep(tile, a_lds_off[mt][s]), alignment=16) for s in range(2)]
                for mt in range(m_tiles)]

    def run_step(kt, acc, cur, slot):
        """One K step: MFMAs on `cur` (loaded one step earlier) while step kt+1 is prefetched.
        Returns (acc, prefetched registers). slot (kt & 1): k_loop's; the buffers follow kt."""
        af, nxt = pipelined_step(b, kt, k_steps, read_tile, load_step, dma_step)
        wf, ws, as_ = cur
        acc = [list(x) for x in acc]
        for s in range(2):
            for mt in range(m_tiles):
                for ntile in range(N_TILES):
                    acc[ntile][mt] = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(
                        b.v4f32, [widen(wf[ntile][s]), widen(af[mt][s]), acc[ntile][mt], 4, 4, s, ws[ntile], s,
                                  as_[mt]])
        fx.rocdl.sched_barrier(0)
        return acc, nxt

    zero_acc = arith.constant(b.v4f32, ir.DenseElementsAttr.get_splat(b.v4f32, ir.FloatAttr.get(b.f32, 0.0)))
    acc = [[zero_acc] * m_tiles for _ in range(N_TILES)]
    true = b.c(1, b.i1)
    regs0 = load_step(b.c(0), true)
    dma_step(b.c(0), true)

    acc = k_loop(k_steps, acc, regs0, run_step)

    # Epilog: lane holds D^T[n = 4g + i][m = r16] for i < 4, i.e. out[token, 4 consecutive
    # columns]. Scale by the top-k weight in f32, round to bf16 (RNE); two packed atomics into the
    # token's row, or (route_rows) one store into the route's row.
    for mt in range(m_tiles):
        ar, tok, safe = rows[mt]
        live = scf.IfOp(b.cmp("sge", ar, b.c(0)), [], has_else=False)
        with ir.InsertionPoint(live.then_block):
            topk_w = prologue_weights[mt] if weights_first else topk_weight(safe)
            col = b.add(n_wave, b.mul(b.c(4), g))
            out_row = ar if route_rows else tok
            orow = b.gep(out, arith.muli(b.add(arith.muli(b.u64(out_row), b.u64(n)), b.u64(col)), b.c(2, b.i64)))
            undef = llvm.mlir_undef(b.v4f32)
            wsplat = llvm.shufflevector(b.v4f32, llvm.insertelement(undef, topk_w, b.c(0)), undef, [0, 0, 0, 0])
            for ntile in range(N_TILES):
                v = arith.mulf(acc[ntile][mt], wsplat)
                if route_rows:
                    llvm.store(arith.truncf(v4bf16, v), b.gep(orow, b.c(2 * ntile * 16, b.i64)), alignment=8)
                    continue
                for p in range(2):
                    pair = llvm.shufflevector(b.v2f32, v, v, [2 * p, 2 * p + 1])
                    pk = arith.truncf(b.v2bf16, pair)
                    dst = b.gep(orow, b.c(2 * (ntile * 16 + 2 * p), b.i64))
                    op = llvm.AtomicRMWOp(llvm.AtomicBinOp.fadd, dst, pk, llvm.AtomicOrdering.monotonic,
                                          syncscope="agent", alignment=4)
                    # = clang's !amdgpu.no.fine.grained.memory: a native packed bf16 atomic
                    op.attributes["rocdl.no_fine_grained_memory"] = ir.UnitAttr.get()
            scf.YieldOp([])


def build(symbol: str, bm: int = 32, nt: int = 0, route_rows: int = 0):
    """The ``@flyc.jit`` launcher for one variant (compile-only use; see compile_for_build)."""
    if bm not in BLOCK_MS or nt not in (0, 1) or route_rows not in (0, 1):
        raise ValueError(f"variant BM={bm} NT={nt} ROUTE_ROWS={route_rows}: BM must be one of {BLOCK_MS}, "
                         "NT and ROUTE_ROWS 0 or 1")

    @fx.struct
    class SharedStorage:
        buf: fx.Array[fx.Int8, 2 * buffer_bytes(bm), 16]

    @flyc.kernel(name=symbol)
    def moe_gemm2_a4w4_kernel(a: fx.Pointer, a_scale: fx.Pointer, w: fx.Pointer, w_scale: fx.Pointer,
                              sorted_token_ids: fx.Pointer, sorted_expert_ids: fx.Pointer,
                              num_valid_ids: fx.Pointer, sorted_weights: fx.Pointer, out: fx.Pointer,
                              tokens: fx.Int32, topk: fx.Int32, experts: fx.Int32, n: fx.Int32, k: fx.Int32,
                              blocks: fx.Int32):
        lds = fx.SharedAllocator().allocate(SharedStorage).peek()
        _body(bm, nt, route_rows,
              *[fx.to_llvm_ptr(p) for p in (a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                                            num_valid_ids, sorted_weights, out)],
              *[v.ir_value() for v in (tokens, topk, experts, n, k, blocks)], fx.to_llvm_ptr(lds.buf.ptr))

    @flyc.jit
    def moe_gemm2_a4w4(a: fx.Pointer, a_scale: fx.Pointer, w: fx.Pointer, w_scale: fx.Pointer,
                       sorted_token_ids: fx.Pointer, sorted_expert_ids: fx.Pointer, num_valid_ids: fx.Pointer,
                       sorted_weights: fx.Pointer, out: fx.Pointer, tokens: fx.Int32, topk: fx.Int32,
                       experts: fx.Int32, n: fx.Int32, k: fx.Int32, num_blocks: fx.Int32,
                       stream: fx.Stream = fx.Stream(None)):
        moe_gemm2_a4w4_kernel(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                              sorted_weights, out, tokens, topk, experts, n, k, num_blocks).launch(
            grid=(n // BLOCK_N, num_blocks, 1), block=(THREADS, 1, 1), stream=stream)

    return moe_gemm2_a4w4


def compile_for_build(arch: str, symbol: str, BM: int = 32, NT: int = 0, ROUTE_ROWS: int = 0):
    """Trace + compile once (arch from FLYDSL_GPU_ARCH, set by the build); returns the jit fn.

    Null pointers and Python ints are compile placeholders: nothing touches a device.
    """
    fn = build(symbol, BM, NT, ROUTE_ROWS)
    p = lambda t: flyc.from_c_void_p(t, 0)  # noqa: E731
    u8 = fx.Uint8
    flyc.compile(fn, p(u8), p(u8), p(u8), p(u8), p(fx.Int32), p(fx.Int32), p(fx.Int32), p(fx.Float32),
                 p(fx.BFloat16), 1, 1, 1, BLOCK_N, BLOCK_K, 1)
    return fn
