"""MXFP8 dequantise: out[M, K] f32 = decode_e4m3(x[M, K]) * 2^(scale[M, K/32] - 127).

Scale byte 0xFF (e8m0 NaN) gives NaN. The e4m3fn decode uses the hardware
``v_cvt_f32_fp8`` (OCP e4m3 on gfx950 and gfx1250) and the scaling ``v_ldexp_f32``, so the
only rounding is ldexp's single round-to-nearest-even into f32 (denormal results are
kept: the kernel runs with f32 denormals enabled); 448 * 2^127 overflows to inf.

Launch (same call as the HIP twin ``csrc/kernels/mxfp8_dequant.hip``):
  block = (THREADS, 1, 1), grid = (ceil(M*K / (THREADS*VEC)), 1, 1); defaults 256 x 4,
  i.e. grid = ceil(M*K / 1024). Thread t of block b handles flat elements
  b*THREADS*VEC + j*THREADS + t for j < VEC (coalesced), each guarded by ``< M*K``.
  ``scale`` is row-major with row stride ceil(K/32) (== K/32 for MX tensors); any K works
  (the HIP twin needs K % 32 == 0). Variant keys: THREADS, VEC.

Kernel argument ABI, as in the .s ``.amdgpu_metadata`` (``.args``); no hidden args,
``.kernarg_segment_size: 32``, ``.reqd_workgroup_size: [THREADS, 1, 1]``::

  offset size value_kind     arg
  0      8    global_buffer  x      const uint8_t*  (float8_e4m3fn bytes)
  8      8    global_buffer  scale  const uint8_t*  (e8m0 bytes)
  16     8    global_buffer  out    float*
  24     4    by_value       M      int32
  28     4    by_value       K      int32

``fx.Pointer`` parameters lower to plain 64-bit global pointers and ``fx.Int32`` to i32
by value, so a launcher passes (x, scale, out, M, K) exactly as for a HIP kernel.
(``fx.Tensor`` parameters would instead add a memref layout struct; avoided on purpose.)
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl

THREADS = 256
VEC = 4
BLOCK_K = 32  # MX block size: one e8m0 scale per 32 elements of a row


def build(symbol: str, threads: int = THREADS, vec: int = VEC):
    """The ``@flyc.jit`` launcher ``fn(x, scale, out, M, K, stream)`` of kernel ``symbol`` for one variant."""
    per_block = threads * vec

    @flyc.kernel(name=symbol)
    def mxfp8_dequant_kernel(x: fx.Pointer, scale: fx.Pointer, out: fx.Pointer, M: fx.Int32, K: fx.Int32):
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        tid = fx.thread_idx.x
        bid = fx.block_idx.x
        total = M * K
        k = K.ir_value()
        c = lambda v: arith.constant(i32, v)  # noqa: E731
        # Unsigned index math: Int32 `//` is floor division and costs sign fix-ups.
        ks = arith.shrui(arith.addi(k, c(BLOCK_K - 1)), c(5))  # scale row stride ceil(K/32)
        for j in fx.range_constexpr(vec):
            i = bid * per_block + j * threads + tid
            if i < total:
                iv = i.ir_value()
                row = arith.divui(iv, k)
                col = arith.subi(iv, arith.muli(row, k))
                sidx = fx.Int32(arith.addi(arith.muli(row, ks), arith.shrui(col, c(5))))
                # Pointer loads of uint8 come back as signless i8: zero-extend explicitly.
                code = arith.extui(i32, x[i].ir_value())
                s = arith.extui(i32, scale[sidx].ir_value())
                v = rocdl.cvt_f32_fp8(f32, code, 0)
                y = llvm.call_intrinsic(f32, "llvm.ldexp.f32.i32", [v, arith.subi(s, c(127))], [], [])
                is_nan_scale = arith.cmpi(arith.CmpIPredicate.eq, s, c(255))
                y = arith.select(is_nan_scale, arith.constant(f32, float("nan")), y)
                out[i] = fx.Float32(y)

    @flyc.jit
    def mxfp8_dequant(x: fx.Pointer, scale: fx.Pointer, out: fx.Pointer, M: fx.Int32, K: fx.Int32,
                      stream: fx.Stream = fx.Stream(None)):
        grid = (M * K + (per_block - 1)) // per_block
        mxfp8_dequant_kernel(x, scale, out, M, K).launch(grid=(grid, 1, 1), block=(threads, 1, 1), stream=stream)

    return mxfp8_dequant


def compile_for_build(arch: str, symbol: str, THREADS: int = THREADS, VEC: int = VEC):
    """Trace + compile once (arch comes from FLYDSL_GPU_ARCH set by the build); returns the jit fn.

    Null pointers and Python ints are compile placeholders: nothing touches a device.
    """
    fn = build(symbol, THREADS, VEC)
    u8 = lambda: flyc.from_c_void_p(fx.Uint8, 0)  # noqa: E731
    flyc.compile(fn, u8(), u8(), flyc.from_c_void_p(fx.Float32, 0), 1, BLOCK_K)
    return fn
