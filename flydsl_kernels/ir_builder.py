"""IR building blocks shared by the FlyDSL kernels written against FlyDSL's MLIR builders.

Kernel modules import it by name: the build loads kernels with their own directory on
sys.path, and every file here is part of each FlyDSL kernel's build-cache key.
"""
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl, scf

INVALID_OFFSET = 0x80000000       # raw-buffer voffset out of range -> loads 0, stores dropped
BUFFER_FLAGS = 0x00027000         # dword3 of a raw gfx9 buffer V#
WAIT_VMCNT0 = 0x0F70              # s_waitcnt vmcnt(0), expcnt/lgkmcnt untouched
WAIT_LGKMCNT0 = 0xC07F            # s_waitcnt lgkmcnt(0), vmcnt/expcnt untouched
REBASED_RECORDS = 0x7FFFFFFF      # a resource rebased to its tile: every valid voffset is below 2^31
XCDS = 8                          # MI355X: workgroups are dealt to its 8 XCDs (each with its own L2) in turn


class Int(ir.Value):
    """An integer SSA value with Python operators for index math: + - * // % & | ^ << >> (// % >>
    unsigned, as offsets and counts are); a Python int operand becomes a constant of the value's
    type. Comparisons stay explicit (Builder.cmp): signedness matters there."""

    def _v(self, o):
        return o if isinstance(o, ir.Value) else arith.constant(self.type, o)

    def __add__(self, o):
        return Int(arith.addi(self, self._v(o)))

    def __radd__(self, o):
        return Int(arith.addi(self._v(o), self))

    def __sub__(self, o):
        return Int(arith.subi(self, self._v(o)))

    def __mul__(self, o):
        return Int(arith.muli(self, self._v(o)))

    def __rmul__(self, o):
        return Int(arith.muli(self._v(o), self))

    def __floordiv__(self, o):
        return Int(arith.divui(self, self._v(o)))

    def __mod__(self, o):
        return Int(arith.remui(self, self._v(o)))

    def __and__(self, o):
        return Int(arith.andi(self, self._v(o)))

    def __or__(self, o):
        return Int(arith.ori(self, self._v(o)))

    def __xor__(self, o):
        return Int(arith.xori(self, self._v(o)))

    def __rshift__(self, o):
        return Int(arith.shrui(self, self._v(o)))

    def __lshift__(self, o):
        return Int(arith.shli(self, self._v(o)))


def workgroup_barrier():
    """A workgroup barrier with release/acquire fences (as HIP's __syncthreads)."""
    llvm.fence(llvm.AtomicOrdering.release, syncscope="workgroup")
    rocdl.s_barrier()
    llvm.fence(llvm.AtomicOrdering.acquire, syncscope="workgroup")


def loads_done_barrier(in_flight=0):
    """Wait for this wave's buffer loads (incl. buffer->LDS DMA) but the last ``in_flight``, then a
    workgroup barrier: every wave's DMA data up to there is visible after it. With loads left in
    flight the barrier has no release fence: the compiler makes that fence wait for every LDS DMA
    (vmcnt(0)), and what it would order, this wave's earlier LDS reads and the DMA just waited
    for, is complete already (the K steps wait for their LDS reads)."""
    rocdl.s_waitcnt(wait_vmcnt(in_flight))
    if in_flight:
        rocdl.s_barrier()
        llvm.fence(llvm.AtomicOrdering.acquire, syncscope="workgroup")
    else:
        workgroup_barrier()


def lds_alias_scopes(buffers: int, description: str) -> list:
    """Per LDS ring buffer, the alias-scope attributes (keyword arguments of its DMA and of its reads)
    that tell the compiler the buffers do not alias: its wait before a buffer's reads then covers
    that buffer's DMA only, not the later steps' DMA into the other buffers (without them it waits
    for every LDS DMA: vmcnt(0)). The slot must be known at trace time."""
    domain = f'#llvm.alias_scope_domain<id = distinct[0]<>, description = "{description}">'
    scopes = list(ir.ArrayAttr(ir.Attribute.parse("[" + ", ".join(
        f"#llvm.alias_scope<id = distinct[{i + 1}]<>, domain = {domain}>" for i in range(buffers)) + "]")))
    return [dict(alias_scopes=ir.ArrayAttr.get([x]), noalias_scopes=ir.ArrayAttr.get(scopes[:i] + scopes[i + 1:]))
            for i, x in enumerate(scopes)]


def wait_vmcnt(n: int) -> int:
    """s_waitcnt operand: vmcnt(n) alone (n <= 63; expcnt and lgkmcnt at their no-wait maxima)."""
    return WAIT_VMCNT0 | (n & 0xF) | (n >> 4) << 14


def flatten(tree) -> list:
    """The values of nested lists / tuples in order: an scf.for's loop-carried operands."""
    return [v for t in tree for v in flatten(t)] if isinstance(tree, (list, tuple)) else [tree]


def unflatten(values, like):
    """``values`` (a loop's iter args or results) back into the nesting of ``like``."""
    values = iter(list(values))

    def take(t):
        return type(t)(take(x) for x in t) if isinstance(t, (list, tuple)) else next(values)
    return take(like)


def pipelined_step(b, kt, k_steps, read_tile, load_step, dma_step, depth=1, in_flight=0):
    """The K-step skeleton of the multi-buffered kernels: barrier (step kt's data has landed: at
    most ``in_flight`` vector-memory ops, the later steps' loads, still pending), read step kt's
    LDS tile, issue step kt+depth's loads (empty resources past the end), wait for the LDS
    reads. Returns (tile registers, step kt+depth's prefetched registers)."""
    loads_done_barrier(in_flight)
    tile = read_tile(kt)
    kn = b.add(kt, b.c(depth))
    live = b.cmp("slt", kn, k_steps)
    nxt = load_step(kn, live)
    dma_step(kn, live)
    rocdl.s_waitcnt(WAIT_LGKMCNT0)
    return tile, nxt


def k_loop(k_steps, acc, regs, run_step, unroll=2, tail_step=None):
    """The K loop of the kernels whose prefetched operands go from registers straight to the
    MFMAs: ``unroll`` steps per iteration, at least one per register set (each step's prefetch
    lands in a set no step in flight reads; more where a step's place in the iteration decides
    its loads), then the last k_steps % unroll steps. With one step per
    iteration (unroll 1) the loop copies the prefetched registers at its back edge, and the copy
    waits for the loads, so they overlap only other workgroups' work; each extra register set
    costs VGPRs. run_step(kt, acc, cur, slot) -> (acc, the registers of the steps after kt); acc, regs:
    nested lists of values; slot: kt % unroll, known at trace time (the step's buffer). tail_step
    (default run_step): the same for the last steps, whose prefetches are past the end (their
    register loads are dead code the compiler removes). Returns acc (k_steps >= 0, i32)."""
    i32, idx = ir.IntegerType.get_signless(32), ir.IndexType.get()
    u = arith.constant(i32, unroll)
    iterations = k_steps if unroll == 1 else arith.divsi(k_steps, u)
    carried = (acc, regs)
    loop = scf.ForOp(arith.constant(idx, 0), arith.index_cast(idx, iterations), arith.constant(idx, 1),
                     flatten(carried))
    with ir.InsertionPoint(loop.body):
        kt = Int(arith.index_cast(i32, loop.induction_variable))
        kt = kt if unroll == 1 else Int(arith.muli(kt, u))
        acc, regs = unflatten(loop.inner_iter_args, carried)
        for j in range(unroll):
            acc, regs = run_step(kt + j if j else kt, acc, regs, j)
        scf.YieldOp(flatten((acc, regs)))
    acc, regs = unflatten(loop.results, carried)
    if unroll == 1:
        return acc
    return _k_tail(Int(arith.muli(arith.divsi(k_steps, u), u)), 0, k_steps, acc, regs, tail_step or run_step,
                   unroll - 1)


def _k_tail(kt, slot, k_steps, acc, regs, run_step, left):
    """k_loop's last steps: step kt (in ``slot``) if kt < k_steps, then (nested) up to left - 1 more."""
    flat = flatten(acc)
    tail = scf.IfOp(arith.cmpi(arith.CmpIPredicate.slt, kt, k_steps), [x.type for x in flat], has_else=True)
    with ir.InsertionPoint(tail.then_block):
        acc_t, regs_t = run_step(kt, acc, regs, slot)
        if left > 1:
            acc_t = _k_tail(kt + 1, slot + 1, k_steps, acc_t, regs_t, run_step, left - 1)
        scf.YieldOp(flatten(acc_t))
    with ir.InsertionPoint(tail.else_block):
        scf.YieldOp(flat)
    return unflatten(tail.results, acc)


class Builder:
    """Small IR builder: typed constants and the integer ops the kernel uses (all i32 unless named)."""

    def __init__(self):
        self.i1 = ir.IntegerType.get_signless(1)
        self.i8 = ir.IntegerType.get_signless(8)
        self.i16 = ir.IntegerType.get_signless(16)
        self.i32 = ir.IntegerType.get_signless(32)
        self.i64 = ir.IntegerType.get_signless(64)
        self.f32 = ir.F32Type.get()
        self.bf16 = ir.BF16Type.get()
        self.v4i32 = ir.VectorType.get([4], self.i32)
        self.v8i32 = ir.VectorType.get([8], self.i32)
        self.v4f32 = ir.VectorType.get([4], self.f32)
        self.v2f32 = ir.VectorType.get([2], self.f32)
        self.v2bf16 = ir.VectorType.get([2], self.bf16)
        self.gptr = ir.Type.parse("!llvm.ptr<1>")
        self.lptr = ir.Type.parse("!llvm.ptr<3>")
        self.rsrc_t = ir.Type.parse("!llvm.ptr<8>")

    def c(self, v, t=None):
        return Int(arith.constant(t or self.i32, v))

    def c_attr(self, v):
        """i32 attribute (e.g. a buffer op's aux cache bits)."""
        return ir.IntegerAttr.get(self.i32, v)

    def splat(self, vtype, v: float):
        """Constant float vector with every element v."""
        return arith.constant(vtype, ir.DenseElementsAttr.get_splat(vtype, ir.FloatAttr.get(vtype.element_type, v)))

    def splat_value(self, vtype, x):
        """Vector with every element the (runtime) scalar x."""
        undef = llvm.mlir_undef(vtype)
        return llvm.shufflevector(vtype, llvm.insertelement(undef, x, self.c(0)), undef, [0] * vtype.shape[0])

    def add(self, a, b):
        return Int(arith.addi(a, b))

    def mul(self, a, b):
        return Int(arith.muli(a, b))

    def cmp(self, pred, a, b):
        return arith.cmpi(getattr(arith.CmpIPredicate, pred), a, b)

    def sel(self, cond, a, b):
        return arith.select(cond, a, b)

    def small_divmod(self, q, d):
        """(q // d, q % d) of unsigned q < 2**21 and 1 <= d < 2**24 in a few float ops, where the
        compiler's exact 32-bit division takes some 25: (2q + 1) / (2d) lies at least 1 / (2d) from
        an integer, farther than the error of its float product at these sizes (v_rcp_f32: 1 ulp,
        the product: half an ulp; < 1.5 * 2**-23 relative), so truncating it gives q // d."""
        half_rcp = arith.mulf(rocdl.rcp(self.f32, arith.uitofp(self.f32, d)), arith.constant(self.f32, 0.5))
        k = Int(arith.fptoui(self.i32, arith.mulf(arith.uitofp(self.f32, Int(q) * 2 + 1), half_rcp)))
        return k, Int(q) - k * d

    def u64(self, a):
        return arith.extui(self.i64, a)

    def gep(self, base, byte_offset):
        """Byte GEP on an !llvm.ptr (any address space)."""
        return llvm.getelementptr(base.type, base, [byte_offset], [-2147483648], ir.IntegerType.get_signless(8), 0)

    def gload(self, t, base, byte_offset, align):
        return llvm.load(t, self.gep(base, byte_offset), alignment=align)

    def rsrc(self, base, nbytes):
        """Raw buffer resource (stride 0) over nbytes (i32) from an !llvm.ptr<1>."""
        return rocdl.make_buffer_rsrc(self.rsrc_t, base, self.c(0, self.i16), self.u64(nbytes), self.c(BUFFER_FLAGS))

    def rsrc_rebased(self, base, flags=BUFFER_FLAGS):
        """Raw buffer resource from ``base``, a tile's first byte, to 2^31 (range checks by offset)."""
        return rocdl.make_buffer_rsrc(self.rsrc_t, base, self.c(0, self.i16), self.c(REBASED_RECORDS, self.i64),
                                      self.c(flags))
