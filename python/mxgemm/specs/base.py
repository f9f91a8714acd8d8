"""What an op spec is made of: calls, inputs, work, cases and contracts."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from .. import registry


@dataclass
class Call:
    """One call of a public op, inputs made: ``call()`` runs it and returns its output (the
    ``out`` it wrote, for an op that returns nothing); ``plan()`` is what ``mxgemm.explain``
    says it runs."""
    op: str
    args: tuple
    kw: dict = field(default_factory=dict)
    out: torch.Tensor | None = None

    def __call__(self):
        import mxgemm
        got = getattr(mxgemm, self.op)(*self.args, **self.kw)
        return self.out if got is None else got

    def plan(self):
        import mxgemm
        return mxgemm.explain(self.op, *self.args, **self.kw)

    def expect(self, kernel: str, variant: dict) -> Call:
        """This call, after checking that the op picks ``kernel`` ``variant`` for it."""
        p = self.plan()
        if (p.kernel, p.variant) != (kernel, variant):
            raise ValueError(f"{self.op} picks {p.kernel} {p.variant} for this call, expected {kernel} {variant}")
        return self


FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OUT_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
MX_BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}
# "bytes" fill: the largest finite non-negative byte of each payload format, and e8m0 scales near 1
_FINITE_MAX = {"e4m3": 0x7F, "e5m2": 0x7C, "e2m3": 0x100, "e3m2": 0x100, "e2m1": 0x100}
_SCALE_BYTES = (120, 134)


class Inputs:
    """Operand maker for one call. ``fill``: "data" (quantised Gaussians: results worth comparing
    with the reference), "bytes" (random finite bytes: the values do not change which
    instructions run or how long they take, and 100s of MB fill fast) or "empty" (torch.empty:
    planning and dispatch only). Tensors are made on the CPU from one seeded generator, then moved
    to ``device``."""

    def __init__(self, fill: str = "data", device="cpu", seed: int = 0):
        if fill not in ("data", "bytes", "empty"):
            raise ValueError(f"fill must be data|bytes|empty, got {fill!r}")
        self.fill, self.device, self.gen = fill, device, torch.Generator().manual_seed(seed)

    def _bytes(self, shape, dtype, lo, hi):
        if self.fill == "empty":
            return torch.empty(shape, dtype=torch.uint8).view(dtype)
        return torch.randint(lo, hi, shape, dtype=torch.uint8, generator=self.gen).to(self.device).view(dtype)

    def mx(self, *shape, fmt: str = "e4m3"):
        """(payload, e8m0 scales) of an MX operand of logical shape [..., K]; e2m1 packs two a byte,
        e2m3 / e3m2 four in three bytes."""
        *rows, k = shape
        if self.fill == "data":
            from ..quant import quantize_mx
            x, s = quantize_mx(torch.randn(*shape, generator=self.gen), fmt)
            return x.to(self.device), s.to(self.device)
        dtype = FP8.get(fmt, torch.uint8)
        x = self._bytes((*rows, k * MX_BITS[fmt] // 8), dtype, 0, _FINITE_MAX[fmt])
        return x, self.scale(*rows, k // 32)

    def fp8(self, *shape, fmt: str = "e4m3"):
        """A tensorwise FP8 operand (payload only)."""
        if self.fill == "data":
            return torch.randn(*shape, generator=self.gen).to(FP8[fmt]).to(self.device)
        return self._bytes(shape, FP8[fmt], 0, _FINITE_MAX[fmt])

    def scale(self, *shape):
        """e8m0 scale bytes near 1.0 (2^-7 .. 2^6)."""
        return self._bytes(shape, torch.uint8, *_SCALE_BYTES)

    def fp32_scale(self, *shape):
        """fp32 block scales in [0.5, 1.5)."""
        if self.fill == "empty":
            return torch.empty(shape)
        return (torch.rand(*shape, generator=self.gen) + 0.5).to(self.device)

    def zeros(self, *shape, dtype=torch.bfloat16):
        return torch.zeros(*shape, dtype=dtype, device=self.device)

    def routing(self, tokens: int, topk: int, experts: int, block_m: int):
        """Seeded uniform routing, distinct experts per token -> (moe_sorting's layout, the top-k
        weights [tokens, topk] on the CPU, the number of active experts)."""
        from ..routing import moe_sorting
        ids = torch.stack([torch.randperm(experts, generator=self.gen)[:topk] for _ in range(tokens)])
        weights = torch.rand(tokens, topk, generator=self.gen)
        return moe_sorting(ids, weights, experts, block_m=block_m), weights, int(ids.unique().numel())


def sorted_ids(srt, device):
    return tuple(t.to(device) for t in (srt.sorted_token_ids, srt.sorted_expert_ids, srt.num_valid_ids))


@dataclass
class Work:
    """What one (kernel, variant, shape) does: counted by the model, cross-checked on the emulator."""
    flops: float
    bytes: float                     # compulsory: inputs once, output once (atomics: read + write)
    rate: str                        # LIMITS peak_tflops key of the roofline
    grid: tuple                      # launch grid
    live_wgs: int                    # workgroups that do work (the rest exit at once)
    wave_iterations: int             # hot-loop iterations summed over every wave of the launch
    serial_iterations: int           # hot-loop iterations one workgroup runs one after another


def mx_bytes(rows, k, bits):         # payload + e8m0 scales (one per 32)
    return rows * k * bits // 8 + rows * (k // 32)


def waves(kernel: str, variant: dict, arch: str = "gfx950") -> int:
    from .. import asm_facts
    return -(-registry.get(kernel).threads_for(arch, variant) // asm_facts.LIMITS[arch]["wave_size"])


@lru_cache(maxsize=None)
def _k_per_iteration(kernel: str, variant_items: tuple, tile_m: int, tile_n: int) -> int:
    import math

    from .. import asm_facts
    from ..build import artifact
    from ..emu.isa import base_mnemonic
    from ..emu.stats import classify
    art = artifact(kernel, dict(variant_items))
    lines = asm_facts.loop_profile(art.asm, art.symbol).lines
    mfmas = [l for l in lines if classify(base_mnemonic(l.split()[0]))[0] == "mfma"]
    mnk = sum(math.prod(map(int, asm_facts.MFMA_SHAPE.search(l.split()[0]).groups())) for l in mfmas)
    return mnk * waves(kernel, dict(variant_items)) // (tile_m * tile_n)


def k_per_iteration(kernel: str, variant: dict, tile_m: int, tile_n: int) -> int:
    """K one hot-loop iteration of one wave covers in an MFMA tile kernel, read from its assembly:
    the loop's MFMAs (sum of m x n x k) over the wave's share of the tile_m x tile_n output."""
    return _k_per_iteration(kernel, tuple(sorted(variant.items())), tile_m, tile_n)


def grid(kernel: str, variant: dict, **dims) -> tuple:
    return registry.get(kernel).launch_grid(variant, **dims)


@dataclass
class Case:
    """A (kernel, variant, shape) of a named shape set, with the peer's published number."""
    kernel: str
    variant: dict
    shape: dict                      # keyword arguments of the spec's work and call
    label: str
    published: str = "not found"     # the peer's published number, with its unit
    source: str = "not found"        # where it was published


@dataclass(frozen=True)
class Contract:
    """How an op's result must match its reference: ``ulp`` 0 is bitwise; else at least
    ``exact`` of the elements bit-exact and the rest within ``ulp`` bf16 ulp. ``snr_db``:
    a signal-to-noise floor instead (autograd paths quantising in between)."""
    ulp: int = 0
    exact: float = 1.0
    snr_db: float | None = None

    def check(self, got: torch.Tensor, ref: torch.Tensor) -> str:
        """'ok: ...' or 'MISMATCH: ...', with the measured distance."""
        from .. import metrics
        if self.snr_db is not None:
            snr = metrics.snr_db(got.detach().float().cpu(), ref.detach().float())
            return f"{'ok' if snr >= self.snr_db else 'MISMATCH'}: SNR {snr:.1f} dB (>= {self.snr_db})"
        got = got.cpu()
        if got.dtype == torch.float32:
            same = got.view(torch.int32) == ref.view(torch.int32)
            same |= got.isnan() & ref.isnan()
            bad = int((~same).sum())
            return f"{'ok' if bad == 0 else 'MISMATCH'}: {bad} of {same.numel()} fp32 elements differ bitwise"
        ulps = metrics.bf16_ulp_distance(got, ref)
        worst, exact = (int(ulps.max()), float((ulps == 0).float().mean())) if ulps.numel() else (0, 1.0)
        ok = worst <= self.ulp and exact >= self.exact
        return f"{'ok' if ok else 'MISMATCH'}: max {worst} ulp, {100 * exact:.2f}% bit-exact"


BITWISE = Contract()


@dataclass
class Smoke:
    """One check of the demo: ``run()`` -> output tensor(s) on the default backend, vs ``ref``
    (tensor or tuple of tensors, on the CPU) under ``contract`` (None: the spec's)."""
    label: str
    run: Callable
    ref: object
    contract: Contract | None = None

    def check(self, contract: Contract) -> str:
        got, ref = self.run(), self.ref
        got = tuple(t.cpu() for t in got) if isinstance(got, tuple) else got.cpu()
        pairs = zip(got, ref) if isinstance(ref, tuple) else [(got, ref)]
        return "; ".join((self.contract or contract).check(g, r) for g, r in pairs)


@dataclass(frozen=True)
class OpSpec:
    """Everything tools and tests need to know about one op file's ops.

    ``call(kernel, variant, shape, inputs)`` -> the Call that runs ``kernel`` ``variant`` on a
    case's shape through its public op (the variant forced where the op takes a config; checked
    by ``specs.op_call``); ``work(kernel, variant, **shape)`` -> Work; ``presets`` name -> () -> [Case];
    ``race(kernel, variant)`` -> fresh Calls reaching the variant's code paths (partial tiles,
    loop remainders, empty groups), for the race-deletion sweep and the GPU-path test;
    ``decode(inputs)`` -> {op: Call} at a decode-sized shape (dispatch and host benchmarks);
    ``smoke(device)`` -> [Smoke] checked under ``contract``; ``serves(kernel, variant)`` -> the
    public functions that run the variant, where they are more than the spec's ops. Every race
    call is checked to run its variant by ``specs.race_calls``."""
    name: str                        # the op file: mxgemm/ops/<name>.py
    ops: tuple                       # public ops (framework ops first)
    kernels: tuple                   # registry kernels they dispatch to
    tests: tuple                     # the kernel tests (the mutation harness runs them)
    reference: tuple                 # its functions in mxgemm.reference (none: the test decodes itself)
    hardware_script: str             # op_tests/ script: hardware check + benchmark vs peers
    contract: Contract
    call: Callable
    work: Callable
    race: Callable
    decode: Callable
    smoke: Callable
    presets: dict = field(default_factory=dict)
    small: Callable = lambda: []     # the CI preset's cases (quick to model and time)
    serves: Callable | None = None   # (kernel, variant) -> the public functions that run it

    def served_by(self, kernel: str, variant: dict) -> str:
        """The public functions that run ``kernel`` ``variant`` (``build -v`` prints it)."""
        return self.serves(kernel, variant) if self.serves else ", ".join(self.ops)
