"""Peer kernels for the emulator: FlyDSL's own example kernels (tests/emu/peer_flydsl/, vendored
from the FlyDSL repository, Apache-2.0) compiled for gfx950 by the pinned FlyDSL wheel and run on
mxgemm.emu against torch. FlyDSL's layout algebra emits code mxgemm's kernels never do (its
``fx.Tensor`` memref ABI, predicated 128-bit copies, buffer-tensor copies with soffset,
swizzled dynamic LDS, gathers and scatters through offset tensors).

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
    """A compile-time argument as FlyDSL's launcher sees it: ["tensor", dtype, shape, divisibility]
    a CPU tensor (layout-dynamic; with a divisibility: from_dlpack with the leading dimension
    marked, as 04's driver does), ["ptr", fx type] a null fx.Pointer, ["int", value] an Int32."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    if spec[0] == "ptr":
        return flyc.from_c_void_p(getattr(fx, spec[1]), 0)
    if spec[0] == "int":
        return spec[1]
    _, dtype, shape, div = spec
    t = torch.zeros(*shape, dtype=getattr(torch, dtype))
    return t if div is None else flyc.from_dlpack(t).mark_layout_dynamic(leading_dim=len(shape) - 1, divisibility=div)


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
    divisibility: dict = field(default_factory=dict)   # index -> stride divisibility (from_dlpack args)
    overrides: dict = field(default_factory=dict)       # module constants set before tracing
    atol: float = 0.0
    rtol: float = 0.0
    race: str | None = None     # a race in the peer itself: the RaceError message (regex) race mode must raise

    def variant(self) -> dict:
        def spec(i, a):
            if isinstance(a, Ptr):
                return ["ptr", _FX[a.t.dtype]]
            if isinstance(a, int):
                return ["int", a]
            return ["tensor", str(a.dtype).removeprefix("torch."), list(a.shape), self.divisibility.get(i)]
        return {"FILE": self.file, "FN": self.fn, "BUILD": self.build, "ARGS": [spec(i, a) for i, a in enumerate(self.args)],
                "GLOBALS": self.overrides}

    def kernel_tensors(self) -> list:
        picked = self.launch if self.launch is not None else \
            [i for i, a in enumerate(self.args) if not isinstance(a, int)]
        return [self.args[i] for i in picked]

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
    """Launch arguments read off the kernel's metadata for ``params`` (tensors of fx.Tensor
    parameters, Ptr of fx.Pointer ones): each one's pointer slot, then for a tensor its layout
    slot when the next slot is by-value (a tensor with a static layout has none), the slot's
    size checked against the tensor's rank."""
    slots = [a for a in info.args if not a[".value_kind"].startswith("hidden_")]
    out, i = [], 0
    for p in params:
        if i >= len(slots) or slots[i][".value_kind"] != "global_buffer":
            raise ValueError(f"{info.name}: slot {i} is not parameter {len(out)}'s pointer: {slots[i:i + 1]}")
        t = p.t if isinstance(p, Ptr) else p
        out.append(t)
        i += 1
        if not isinstance(p, Ptr) and i < len(slots) and slots[i][".value_kind"] == "by_value":
            if slots[i][".size"] != 4 * t.dim() + 8 * (t.dim() - 1):
                raise ValueError(f"{info.name}: layout slot {i} of {slots[i]['.size']} bytes for a rank-{t.dim()} tensor")
            out.append(layout_struct(t))
            i += 1
    if i != len(slots):
        raise ValueError(f"{info.name}: {len(slots)} kernarg slots, {i} used by {len(params)} parameters")
    return out


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
               args=kernel_args(case.kernel_tensors(), info), dynamic_lds=case.dynamic_lds)
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
                                divisibility={0: 16, 2: 16}, overrides={"M": M, "N": N, "K": K}),
        "gather": Case("05-gather_scatter.py", "gather_jit", "gather_kernel_0", [src, torch.zeros(16, 64), rows],
                       (16 // 8, 64 // 32, 1), {1: src[rows.long()]}),
        "scatter": Case("05-gather_scatter.py", "scatter_jit", "scatter_kernel_0", [src2, torch.zeros(40, 64), rows2],
                        (16 // 8, 64 // 32, 1), {1: scattered}),
        # kernels/norm: one 256-thread block per row; N = 1024 takes the 128-bit buffer-load path,
        # N = 300 the masked scalar path
        "softmax_f32": Case("kernels/norm/softmax_kernel.py", "build_softmax_module", "softmax_kernel_0",
                            [sm_f32, torch.zeros(3, 1024), 3], (3, 1, 1), {}, build={"M": 3, "N": 1024, "dtype_str": "f32"},
                            launch=(0, 1, 1, 1), race=SOFTMAX_RACE),
        "softmax_bf16": Case("kernels/norm/softmax_kernel.py", "build_softmax_module", "softmax_kernel_0",
                             [sm_bf16, torch.zeros(3, 300, dtype=torch.bfloat16), 3], (3, 1, 1), {},
                             build={"M": 3, "N": 300, "dtype_str": "bf16"}, launch=(0, 1, 1, 1), race=SOFTMAX_RACE),
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
