"""Peer kernels for the emulator: FlyDSL's own kernels (tests/emu/peer_flydsl/, vendored from the
FlyDSL repository, Apache-2.0: its five examples, the softmax and layernorm of kernels/norm and the
8-wave fp8 GEMM of kernels/gemm) compiled for gfx950 by the pinned FlyDSL wheel and run on
mxgemm.emu against torch. FlyDSL emits code mxgemm's kernels never do (its ``fx.Tensor`` memref
ABI, predicated 128-bit copies, buffer-tensor copies with soffset, swizzled dynamic LDS, gathers
and scatters through offset tensors, permlane / swizzle reductions, a ping-pong 8-wave GEMM on
LDS DMA).

This module is also the compile adapter: ``mxgemm.flydsl_build.compile_flydsl`` loads it in its
subprocess and calls ``compile_for_build``, which imports a vendored example and compiles one
of its ``@flyc.jit`` launchers with CPU tensors of the case's dtypes and shapes (a
layout-dynamic memref per tensor, as FlyDSL's launcher makes from a torch tensor).
Artefacts are cached under ``toolchain.cache_dir()`` by the content of the example, the
argument spec and the FlyDSL version.

Kernel ABI (docs/toolchain.md §5): each ``fx.Tensor`` argument is a global pointer followed by
a by-value struct of its dynamic layout: every dimension's size as i32, then every stride
other than the unit one as i64 (int32 with ``use_32bit_stride``), packed without padding."""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

PEER = Path(__file__).resolve().parent / "peer_flydsl"


def _example(file: str, overrides: dict):
    if str(PEER) not in sys.path:     # the kernels/ examples import their helpers as `kernels.common...`
        sys.path.insert(0, str(PEER))
    spec = importlib.util.spec_from_file_location(f"flydsl_peer_{Path(file).stem.replace('-', '_')}", PEER / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for k, v in overrides.items():     # module constants the kernel reads at trace time (04's M, N, K)
        setattr(mod, k, v)
    return mod


def _jit_arg(spec):
    """A compile-time argument as FlyDSL's launcher sees it: ["tensor", dtype, shape, wrap] a CPU
    tensor (layout-dynamic; wrap "static": from_torch_tensor's static layout, as fp8_gemm_8wave's
    test passes its weights and scales; wrap d: from_dlpack with the leading dimension marked and
    stride divisibility d, as 04's driver does), ["ptr", fx type] a null fx.Pointer, ["int", value]
    an Int32, ["stream"] the default stream."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    if spec[0] == "ptr":
        return flyc.from_c_void_p(getattr(fx, spec[1]), 0)
    if spec[0] == "int":
        return spec[1]
    if spec[0] == "stream":
        return fx.Stream(None)
    _, dtype, shape, wrap = spec
    t = torch.zeros(*shape, dtype=getattr(torch, dtype))
    if wrap == "static":
        return flyc.from_torch_tensor(t)
    return t if wrap is None else flyc.from_dlpack(t).mark_layout_dynamic(leading_dim=len(shape) - 1, divisibility=wrap)


def compile_for_build(arch: str, symbol: str, FILE: str, FN: str, BUILD, ARGS: list, GLOBALS: dict):
    """flydsl_build's entry: compile the @flyc.jit ``FN`` of the vendored ``FILE`` (or, with
    ``BUILD`` keyword arguments, the one its builder ``FN(**BUILD)`` returns) for ``ARGS``
    (_jit_arg specs) with module constants ``GLOBALS``; returns the jit function."""
    import flydsl.compiler as flyc
    fn = getattr(_example(FILE, GLOBALS), FN)
    if BUILD is not None:
        fn = fn(**BUILD)
    flyc.compile(fn, *(_jit_arg(a) for a in ARGS))
    return fn


@dataclass
class Ptr:
    """A tensor passed as an ``fx.Pointer`` (a bare global pointer) rather than an ``fx.Tensor``."""
    t: torch.Tensor


@dataclass
class Case:
    file: str                   # vendored example
    fn: str                     # its @flyc.jit launcher, or the builder returning it
    kernel: str                 # the kernel symbol FlyDSL emits (the @flyc.kernel's name, suffix _0)
    args: list                  # the launcher's arguments: tensors (fx.Tensor), Ptr, ints (fx.Int32)
    grid: tuple                 # as the launcher computes it
    want: dict                  # index into args -> expected tensor after the launch
    build: dict | None = None   # the builder's keyword arguments
    launch: tuple | None = None  # indices into args of the kernel's tensors (default: every tensor, in order)
    dynamic_lds: int = 0        # the launcher's smem=
    wrap: dict = field(default_factory=dict)   # index -> _jit_arg's wrap ("static" or a stride divisibility)
    stream: bool = False        # the launcher takes a stream argument with no default (passed last)
    static: tuple = ()          # indices of tensors the launcher gives a static layout (a view of constants)
    overrides: dict = field(default_factory=dict)       # module constants set before tracing
    atol: float = 0.0
    rtol: float = 0.0
    race: str | None = None     # a race in the peer itself: the RaceError (regex) race mode must raise; ``want``
                                # is then checked on a second run without race checking

    def variant(self) -> dict:
        def spec(i, a):
            if isinstance(a, Ptr):
                return ["ptr", _FX[a.t.dtype]]
            if isinstance(a, int):
                return ["int", a]
            return ["tensor", str(a.dtype).removeprefix("torch."), list(a.shape), self.wrap.get(i)]
        args = [spec(i, a) for i, a in enumerate(self.args)] + [["stream"]] * self.stream
        return {"FILE": self.file, "FN": self.fn, "BUILD": self.build, "ARGS": args, "GLOBALS": self.overrides}

    def kernel_params(self) -> list:
        """(argument, has a layout slot) per kernel parameter."""
        return [(self.args[i], isinstance(self.args[i], torch.Tensor) and i not in self.static
                 and self.wrap.get(i) != "static")
                for i in (self.launch if self.launch is not None else range(len(self.args)))]

    def output(self, i) -> torch.Tensor:
        return self.args[i].t if isinstance(self.args[i], Ptr) else self.args[i]


_FX = {torch.float32: "Float32", torch.float16: "Float16", torch.bfloat16: "BFloat16", torch.int32: "Int32"}


def layout_struct(t: torch.Tensor) -> int:
    """The by-value layout slot of a layout-dynamic tensor argument, as one little-endian int
    (what mxgemm.kernarg packs into a by-value slot): sizes i32, then non-unit strides i64."""
    lead = t.stride().index(1)
    fields = list(t.shape) + [s for i, s in enumerate(t.stride()) if i != lead]
    raw = struct.pack("<" + "i" * t.dim() + "q" * (t.dim() - 1), *fields)
    return int.from_bytes(raw, "little")


def kernel_args(params: list, info) -> list:
    """Launch arguments for ``params`` ((argument, has a layout slot) per kernel parameter: tensors
    of fx.Tensor parameters, Ptr of fx.Pointer ones, ints of fx.Int32 ones), checked against the
    kernel's metadata: a pointer slot per tensor or Ptr, then a tensor's layout slot of its rank's
    size; a 4-byte by-value slot per int."""
    slots = [a for a in info.args if not a[".value_kind"].startswith("hidden_")]
    want = []
    for p, layout in params:
        if isinstance(p, int):
            want.append((p, "by_value", 4))
            continue
        t = p.t if isinstance(p, Ptr) else p
        want.append((t, "global_buffer", 8))
        if layout:
            want.append((layout_struct(t), "by_value", 4 * t.dim() + 8 * (t.dim() - 1)))
    got = [(a[".value_kind"], a[".size"]) for a in slots]
    if got != [(k, n) for _, k, n in want]:
        raise ValueError(f"{info.name}: kernarg slots {got}, parameters need {[(k, n) for _, k, n in want]}")
    return [v for v, _, _ in want]


def artefact(case: Case) -> tuple:
    """(assembly, compile seconds or None when cached) of ``case``'s kernel for gfx950."""
    import flydsl

    from mxgemm.flydsl_build import compile_flydsl
    from mxgemm.toolchain import cache_dir
    variant = case.variant()
    h = hashlib.sha256(json.dumps([variant, flydsl.__version__, case.kernel, inspect.getsource(compile_for_build),
                                   inspect.getsource(_jit_arg)]).encode())
    for f in sorted(PEER.rglob("*.py")):     # the example and every helper it may import
        h.update(f.read_bytes())
    key = h.hexdigest()[:20]
    out_s = Path(cache_dir()) / "flydsl_corpus" / f"{case.kernel}-{key}.s"
    if out_s.exists():
        return out_s.read_text(), None
    t0 = time.perf_counter()
    compile_flydsl(Path(__file__), "gfx950", variant, out_s, out_s.with_suffix(".hsaco"), case.kernel)
    return out_s.read_text(), time.perf_counter() - t0


def run(case: Case, emu) -> tuple:
    """Compile (or fetch) ``case`` and launch it on ``emu``; (info, compile seconds or None)."""
    from mxgemm import asm_facts
    asm, compile_s = artefact(case)
    info = asm_facts.kernel_info(asm, case.kernel)
    emu.launch(emu.load(asm), case.kernel, grid=case.grid, block=(info.workgroup_size, 1, 1),
               args=kernel_args(case.kernel_params(), info), dynamic_lds=case.dynamic_lds)
    return info, compile_s


def preshuffle(b: torch.Tensor) -> torch.Tensor:
    """04's B operand: element (n, k) of b [N, K] at the offset its launcher's layout
    ((16, N/16), (8, 4, K/32)) : ((8, 16K), (1, 128, 512)) gives, with FlyDSL's (CuTe's)
    colexicographic coordinates n = n0 + 16 n1, k = k0 + 8 k1 + 32 k2."""
    N, K = b.shape
    n, k = torch.arange(N)[:, None], torch.arange(K)[None, :]
    off = (n % 16) * 8 + (n // 16) * 16 * K + (k % 8) + (k // 8 % 4) * 128 + (k // 32) * 512
    out = torch.empty(N * K, dtype=b.dtype)
    out[off.flatten()] = b.flatten()
    return out.view(N, K)


def _ints(g, lo, hi, *shape, dtype=torch.float32):
    """Integer-valued floats: every product and sum of the GEMMs below is exact in fp32 (and the
    f16 result too), so the comparison is bit-exact whatever the MFMA's summation order."""
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


# FlyDSL's softmax reuses one LDS slot array for its max and its sum reductions; block_reduce ends
# with a barrier, then every wave reads the result from slot 0 and moves on, with no barrier before
# the next reduction's lane 0 of wave 0 stores its partial sum into slot 0. A wave still to read the
# max can read the partial sum instead (a write-after-read race on byte 0). One more barrier after
# the read makes it race-free and within 2e-6 of torch (checked by hand with the missing
# instruction modelled; not part of the test). Without race checking, the emulator's wave order
# makes it bite: outputs off by up to 100%.
SOFTMAX_RACE = r"LDS race at byte 0x0 \(workgroup \(0, 0, 0\), wave \d+\): read here while wave 0 accesses it"


# FlyDSL's fp8_gemm_8wave: the step before last reads the last K tile's B0 from LDS (b_next0) with
# no s_waitcnt vmcnt since the DMA writing it (buffer_load ... lds): the last wait before it,
# vmcnt(2 N_A + N_B) in the main loop (or the prologue's when K = 2 * 128), lets the newest
# 2 N_A + N_B loads stay in flight, which include b_next0's (all of them at the 256 x 256 default,
# the second of its two at 128 x 256). Race mode names the first read of that buffer (LDS byte
# 0x8000 in this allocation); the DMA being issued long before, a GPU would rarely see it.
FP8_GEMM_RACE = r"LDS race at byte 0x8000 .*: direct-to-LDS data not yet retired by its counter wait"


def cases() -> dict:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(20, 100, generator=g), torch.randn(20, 100, generator=g)
    wide = [torch.randn(20, 128, generator=g)[:, :100] for _ in range(2)] + [torch.zeros(20, 128)[:, :100]]
    copy_src = torch.arange(24 * 120, dtype=torch.float32).reshape(24, 120)
    ma, mb = _ints(g, -8, 9, 64, 8), _ints(g, -8, 9, 64, 8)
    M, N, K = 128, 128, 256
    pa, pb = _ints(g, -2, 3, M, K, dtype=torch.float16), _ints(g, -2, 3, N, K, dtype=torch.float16)
    src, rows = torch.randn(40, 64, generator=g), torch.randperm(40, generator=g)[:16].int()
    src2, rows2 = torch.randn(16, 64, generator=g), torch.randperm(40, generator=g)[:16].int()
    scattered = torch.zeros(40, 64)
    scattered[rows2.long()] = src2
    sm_f32, sm_bf16 = torch.randn(3, 1024, generator=g) * 4, (torch.randn(3, 300, generator=g) * 4).bfloat16()
    ln_x, ln_w, ln_b = torch.randn(3, 512, generator=g), torch.rand(512, generator=g), torch.rand(512, generator=g)
    ln_xh, ln_wh, ln_bh = (t.bfloat16() for t in (torch.randn(3, 200, generator=g), torch.rand(200, generator=g),
                                                  torch.rand(200, generator=g)))
    wa = torch.randn(32, generator=g)
    keep = (wa > 0).int()
    sa_ = torch.randint(-8, 8, (1024,), generator=g, dtype=torch.int32)
    compacted = torch.zeros(1024, dtype=torch.int32)
    compacted[:int((sa_ > 0).sum())] = sa_[sa_ > 0]
    fm, fn_, fk = 128, 256, 256
    fa, fb = _ints(g, -8, 9, fm, fk).to(torch.float8_e4m3fn), _ints(g, -8, 9, fn_, fk).to(torch.float8_e4m3fn)
    fsa, fsb = 2.0 ** torch.randint(-3, 4, (fm,), generator=g), 2.0 ** torch.randint(-3, 4, (fn_,), generator=g)
    return {
        # 8 x 64 tiles (threads 8 x 16, 4 floats each); 20 x 100 leaves partial tiles in both dims
        "vectorAdd": Case("01-vectorAdd.py", "vector_add", "vector_add_kernel_0", [a, b, torch.zeros(20, 100)],
                          (3, 2, 1), {2: a + b}),
        # the same kernel on row stride 128 views: the layout slot's stride is read, not assumed
        "vectorAdd_strided": Case("01-vectorAdd.py", "vector_add", "vector_add_kernel_0", wide, (3, 2, 1),
                                  {2: wide[0] + wide[1]}),
        "tiledCopy": Case("02-tiledCopy.py", "tiledCopy", "copy_kernel_0", [copy_src, torch.zeros(24, 120)],
                          (15, 1, 1), {1: copy_src}),
        "tiledMma": Case("03-tiledMma.py", "tiledMma", "gemm_kernel_0", [ma, mb, torch.zeros(64, 64)], (1, 1, 1),
                         {2: ma @ mb.T}),
        "preshuffle_gemm": Case("04-preshuffle_gemm.py", "preshuffle_gemm", "gemm_kernel_0",
                                [pa, preshuffle(pb), torch.zeros(M, N, dtype=torch.float16)], (M // 128, N // 128, 1),
                                {2: (pa.float() @ pb.float().T).half()}, dynamic_lds=32768,
                                wrap={0: 16, 2: 16}, static=(1,), overrides={"M": M, "N": N, "K": K}),
        "gather": Case("05-gather_scatter.py", "gather_jit", "gather_kernel_0", [src, torch.zeros(16, 64), rows],
                       (16 // 8, 64 // 32, 1), {1: src[rows.long()]}),
        "scatter": Case("05-gather_scatter.py", "scatter_jit", "scatter_kernel_0", [src2, torch.zeros(40, 64), rows2],
                        (16 // 8, 64 // 32, 1), {1: scattered}),
        # examples/extension/coop: a 32-lane block on wave64 (half the wave idle) scanning and
        # reducing through lanes, and a 256-thread block scan through LDS compacting 1024 ints
        "warp_collectives": Case("extension/coop/01-warp_collectives.py", "warp_compaction",
                                 "warp_compaction_index_0", [wa, torch.zeros(32, dtype=torch.int32),
                                                             torch.zeros(32, dtype=torch.int32)], (1, 1, 1),
                                 {1: keep.cumsum(0).int() - keep, 2: keep.sum().int().expand(32)}),
        "block_scan": Case("extension/coop/02-block_scan.py", "compact", "compact_positive_0",
                           [Ptr(sa_), torch.zeros(1024, dtype=torch.int32)], (1, 1, 1), {1: compacted}),
        # kernels/gemm: 8 waves, one 128 x 256 tile, LDS DMA (buffer_load ... lds) double-buffered, the
        # scaled 16x16x128 fp8 MFMA; flat operands as its test passes them (weights and scales with
        # static layouts). Integer-valued fp8 and power-of-two row scales: exact up to the one bf16
        # rounding, so bit-exact
        "fp8_gemm_8wave": Case("kernels/gemm/fp8_gemm_8wave.py", "compile_fp8_gemm_8w", "kernel_gemm_0",
                               [fa.view(torch.int8).flatten(), fb.view(torch.int8).flatten(),
                                torch.zeros(fm * fn_, dtype=torch.bfloat16), fsa, fsb, fm, fn_], (1, 1, 1),
                               {2: ((fa.float() * fsa[:, None]) @ (fb.float() * fsb[:, None]).T).bfloat16().flatten()},
                               build={"K": fk, "BLOCK_M": 128, "BLOCK_N": 256}, wrap={1: "static", 3: "static", 4: "static"},
                               stream=True, race=FP8_GEMM_RACE),
        # kernels/norm: one 256-thread block per row; N = 1024 takes the 128-bit buffer-load path,
        # N = 300 the masked scalar path
        "softmax_f32": Case("kernels/norm/softmax_kernel.py", "build_softmax_module", "softmax_kernel_0",
                            [sm_f32, torch.zeros(3, 1024), 3], (3, 1, 1), {}, build={"M": 3, "N": 1024, "dtype_str": "f32"},
                            launch=(0, 1, 1, 1), race=SOFTMAX_RACE),
        "softmax_bf16": Case("kernels/norm/softmax_kernel.py", "build_softmax_module", "softmax_kernel_0",
                             [sm_bf16, torch.zeros(3, 300, dtype=torch.bfloat16), 3], (3, 1, 1), {},
                             build={"M": 3, "N": 300, "dtype_str": "bf16"}, launch=(0, 1, 1, 1), race=SOFTMAX_RACE),
        # layernorm: not bit-exact, its statistics are summed in another order than torch's and
        # 1 / sqrt is v_rsq_f32 (1 ulp); observed |error| <= 5e-7 on outputs of order 1. bf16 out:
        # one RNE rounding, half a bf16 ulp (2^-8 relative)
        "layernorm_f32": Case("kernels/norm/layernorm_kernel.py", "build_layernorm_module", "layernorm_kernel_0",
                              [Ptr(ln_x), Ptr(ln_w), Ptr(ln_b), Ptr(torch.zeros(3, 512)), 3], (3, 1, 1),
                              {3: torch.nn.functional.layer_norm(ln_x, (512,), ln_w, ln_b, 1e-5)},
                              build={"N": 512, "dtype_str": "f32"}, launch=(0, 1, 2, 3, 1, 1), atol=1e-6, rtol=1e-5),
        "layernorm_bf16": Case("kernels/norm/layernorm_kernel.py", "build_layernorm_module", "layernorm_kernel_0",
                               [Ptr(ln_xh), Ptr(ln_wh), Ptr(ln_bh), Ptr(torch.zeros(3, 200, dtype=torch.bfloat16)), 3],
                               (3, 1, 1), {3: torch.nn.functional.layer_norm(ln_xh.float(), (200,), ln_wh.float(),
                                                                             ln_bh.float(), 1e-5)},
                               build={"N": 200, "dtype_str": "bf16"}, launch=(0, 1, 2, 3, 1, 1), atol=0, rtol=2 ** -8),
    }
