"""Static facts of a compiled kernel, read from its gfx assembly (.s).

No disassembler here understands gfx950, but clang's ``-S`` output carries everything: the
``.amdhsa_kernel`` directives, the ``.amdgpu_metadata`` YAML (args, register and spill
counts) and the instruction text.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import yaml

from .emu.isa import base_mnemonic
from .emu.stats import classify
from .hardware import ARCH_LIMITS, LIMITS

MFMA_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)")
_F8F6F4_RATE = {0: "fp8", 1: "fp8", 2: "mxfp6", 3: "mxfp6", 4: "mxfp4"}   # cbsz / blgp codes (gfx950_isa.md §1.2)
_RATE_ORDER = ("bf16", "fp8", "mxfp6", "mxfp4")


def mfma_rate(line: str) -> str:
    """Peak-rate class of one MFMA instruction line: the slower of its two operand formats."""
    base = base_mnemonic(line.split()[0])
    if "f8f6f4" in base:
        mods = dict(re.findall(r"\b(cbsz|blgp):(\d+)", line))
        rates = [_F8F6F4_RATE[int(mods.get(k, 0))] for k in ("cbsz", "blgp")]
        return min(rates, key=_RATE_ORDER.index)
    if re.search(r"_(fp8|bf8)_(fp8|bf8)$", base):
        return "fp8_legacy"    # the gfx940 FP8 forms run at half the f8f6f4 FP8 rate on gfx950 (§2)
    if re.search(r"_i8$", base):
        return "fp8"
    return "bf16"


def mfma_cycles(line: str, arch: str = "gfx950") -> float:
    """Cycles one MFMA occupies its SIMD's matrix unit: its FLOPs over the per-SIMD peak rate
    (peak / (CUs x SIMDs x clock)), docs/perf_model.md §2."""
    lim = LIMITS[arch]
    m, n, k = map(int, MFMA_SHAPE.search(line.split()[0]).groups())
    per_simd_clock = lim["peak_tflops"][mfma_rate(line)] * 1e12 / (lim["cus"] * lim["simds_per_cu"]
                                                                   * lim["clock_ghz"] * 1e9)
    return 2 * m * n * k / per_simd_clock


@dataclass
class KernelInfo:
    name: str
    arch: str
    vgprs: int            # architectural VGPRs (metadata .vgpr_count)
    agprs: int
    sgprs: int
    vgpr_spills: int
    sgpr_spills: int
    scratch_bytes: int    # private segment size
    lds_bytes: int        # group segment (static LDS)
    wave_size: int
    kernarg_size: int
    accum_offset: int
    args: list = field(default_factory=list)            # metadata .args dicts
    histogram: Counter = field(default_factory=Counter)  # mnemonic -> count
    compiler_occupancy: int | None = None                 # clang's own "; Occupancy:" comment
    workgroup_size: int | None = None                     # metadata .reqd_workgroup_size x, if given

    @property
    def spills(self) -> int:
        return self.vgpr_spills + self.sgpr_spills

    @property
    def total_vgprs(self) -> int:
        """Registers allocated per lane: AGPRs start at accum_offset in gfx90a+'s unified file."""
        return self.accum_offset + self.agprs if self.agprs else self.vgprs

    def occupancy(self, block_threads: int | None = None) -> int:
        """Waves per SIMD for workgroups of ``block_threads`` threads (default: the kernel's
        required workgroup size, else 256)."""
        block_threads = block_threads or self.workgroup_size or 256
        lim = ARCH_LIMITS[self.arch]
        g = lim["vgpr_granule"]
        waves = lim["max_waves"]
        waves = min(waves, lim["vgprs"] // max(g, -(-self.total_vgprs // g) * g))
        if lim["sgprs"]:
            sg = lim["sgpr_granule"]
            waves = min(waves, lim["sgprs"] // max(sg, -(-self.sgprs // sg) * sg))
        if self.lds_bytes:
            waves_per_wg = -(-block_threads // self.wave_size)
            wgs_per_cu = lim["lds_bytes"] // self.lds_bytes
            waves = min(waves, wgs_per_cu * waves_per_wg // lim["simds_per_cu"])
        return waves

    def count(self, prefix: str) -> int:
        """Number of instructions whose mnemonic starts with ``prefix``."""
        return sum(n for m, n in self.histogram.items() if m.startswith(prefix))

    def summary(self, block_threads: int | None = None) -> str:
        return (f"{self.name} [{self.arch}] vgpr={self.vgprs} agpr={self.agprs} sgpr={self.sgprs} "
                f"spills={self.spills} scratch={self.scratch_bytes}B lds={self.lds_bytes}B "
                f"wave{self.wave_size} occupancy={self.occupancy(block_threads)} waves/SIMD "
                f"insts={sum(self.histogram.values())}")


_DIRECTIVE = re.compile(r"^\s*\.amdhsa_(\w+)\s+(\S.*?)\s*(?:;.*)?$")
_KERNEL_DESCRIPTOR = re.compile(r"^\s*\.amdhsa_kernel\s+(\S+)\s*\n(.*?)^\s*\.end_amdhsa_kernel", re.S | re.M)


def metadata(asm: str) -> dict:
    """The ``.amdgpu_metadata`` YAML as a dict ({} when the assembly has none)."""
    m = re.search(r"\.amdgpu_metadata\s*\n(.*?)\n\s*\.end_amdgpu_metadata", asm, re.S)
    return (yaml.safe_load(m.group(1)) or {}) if m else {}


def directives(asm: str) -> dict:
    """kernel name -> {directive without ``.amdhsa_``: value} of every kernel descriptor;
    integer values as int, anything else (e.g. an expression) as its text."""
    out = {}
    for name, block in _KERNEL_DESCRIPTOR.findall(asm):
        d = out[name] = {}
        for k, v in (m.groups() for m in map(_DIRECTIVE.match, block.splitlines()) if m):
            try:
                d[k] = int(v, 0)
            except ValueError:
                d[k] = v
    return out


def _metadata(asm: str) -> dict:
    meta = metadata(asm)
    if not meta:
        raise ValueError("no .amdgpu_metadata block in assembly")
    return meta


def body(asm: str, name: str) -> list[str]:
    """Instruction lines of function ``name`` (from its label to the end of function)."""
    lines = asm.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.split(";")[0].strip() == f"{name}:")
    except StopIteration:
        raise ValueError(f"kernel {name} not found in assembly") from None
    out = []
    for l in lines[start + 1:]:
        s = l.split(";")[0].strip()
        if s.startswith(".Lfunc_end") or s.startswith(".size") or s.startswith(".end_amdhsa"):
            break
        if s and not s.startswith(".") and not s.endswith(":"):
            out.append(s)
    return out


def histogram(asm: str, name: str) -> Counter:
    return Counter(l.split()[0] for l in body(asm, name))


def kernel_names(asm: str) -> list[str]:
    return [k[".name"] for k in _metadata(asm)["amdhsa.kernels"]]


def kernel_info(asm: str, name: str | None = None) -> KernelInfo:
    meta = _metadata(asm)
    kernels = {k[".name"]: k for k in meta["amdhsa.kernels"]}
    if name is None:
        if len(kernels) != 1:
            raise ValueError(f"assembly holds {sorted(kernels)}; name one")
        name = next(iter(kernels))
    if name not in kernels:
        raise ValueError(f"kernel {name!r} not in assembly (has {sorted(kernels)})")
    k = kernels[name]
    d = directives(asm).get(name)
    if d is None:
        raise ValueError(f"no .amdhsa_kernel {name} in assembly")
    target = meta.get("amdhsa.target", "")
    arch = re.search(r"gfx\w+", target).group(0)
    occ = re.search(rf"{re.escape(name)}.*?; Occupancy: (\d+)", asm, re.S)
    return KernelInfo(
        name=name, arch=arch,
        vgprs=k.get(".vgpr_count", 0), agprs=k.get(".agpr_count", 0), sgprs=k.get(".sgpr_count", 0),
        vgpr_spills=k.get(".vgpr_spill_count", 0), sgpr_spills=k.get(".sgpr_spill_count", 0),
        scratch_bytes=k.get(".private_segment_fixed_size", 0),
        lds_bytes=k.get(".group_segment_fixed_size", 0),
        wave_size=k.get(".wavefront_size") or ARCH_LIMITS[arch]["wave_size"],
        kernarg_size=k.get(".kernarg_segment_size", 0),
        accum_offset=d.get("accum_offset", 0), args=list(k.get(".args", [])),
        histogram=histogram(asm, name),
        compiler_occupancy=int(occ.group(1)) if occ else None,
        workgroup_size=(k.get(".reqd_workgroup_size") or [None])[0],
    )


def loops(asm: str, name: str) -> list[range]:
    """Line ranges (indices into asm.splitlines()) of every loop of kernel ``name``: from a label
    to a later branch back to it (nested loops appear both on their own and inside their parent)."""
    lines = [x.split(";")[0].strip() for x in asm.splitlines()]
    start = lines.index(f"{name}:")
    labels, found = {}, []
    for i, l in enumerate(lines[start + 1:], start + 1):
        if l.startswith(".Lfunc_end"):
            break
        if l.endswith(":"):
            labels[l[:-1]] = i
            continue
        parts = l.split()
        if parts and parts[0].startswith(("s_branch", "s_cbranch")) and parts[-1] in labels:
            found.append(range(labels[parts[-1]] + 1, i + 1))
    return found


def loop_bodies(asm: str, name: str) -> list[list[str]]:
    """Instruction lines of every loop of kernel ``name`` (see ``loops``)."""
    lines = [x.split(";")[0].strip() for x in asm.splitlines()]
    return [[lines[i] for i in r if lines[i] and not lines[i].endswith(":") and not lines[i].startswith(".")]
            for r in loops(asm, name)]


def hot_loop(asm: str, name: str, marker: tuple = ("v_mfma", "v_wmma")) -> list[str]:
    """Instruction lines of the kernel's main loop: the widest loop holding a matrix instruction
    (a loop whose body branches has one back-edge per path; the widest range spans them all)."""
    bodies = [l for l in loop_bodies(asm, name) if any(x.split()[0].startswith(marker) for x in l)]
    if not bodies:
        raise ValueError(f"{name}: no loop with a {'/'.join(marker)} instruction")
    return max(bodies, key=len)


# ---- one iteration of the hot loop, counted for the performance model ----
VALU_CYCLES = 4        # a wave64 vector instruction on a 16-lane SIMD (docs/perf_model.md §2)
OTHER_ISSUE_CYCLES = 1  # scalar, branch, wait and memory-issue instructions (their data: bytes, latency)


@dataclass
class LoopProfile:
    """One iteration of the hot loop, for one wave (bytes at a full 64-lane EXEC)."""
    counts: Counter                  # emulator class -> instructions (mxgemm.emu.stats.classify)
    bytes: Counter                   # memory class -> bytes
    mfma_cycles: float
    issue_cycles: float              # every instruction but MFMA
    waits: int                       # s_waitcnt
    drains_vm: bool                  # an s_waitcnt vmcnt(0): the loop waits for its own loads
    in_loop: bool = True             # False: the kernel has no loop, the profile is its whole body
    lines: list = field(default_factory=list)

    @property
    def global_bytes(self) -> int:
        return sum(v for c, v in self.bytes.items() if c.startswith("vmem_"))

    @property
    def lds_bytes(self) -> int:
        return sum(v for c, v in self.bytes.items() if c.startswith("lds_") or c == "vmem_load_lds")


def _innermost(ranges):
    return [r for r in ranges if not any(o != r and o.start >= r.start and o.stop <= r.stop for o in ranges)]


def loop_profile(asm: str, symbol: str, arch: str = "gfx950") -> LoopProfile:
    """The innermost loop with the most MFMAs (then memory instructions, then length); a kernel
    without a loop is profiled whole, as one iteration."""
    lines = [x.split(";")[0].strip() for x in asm.splitlines()]
    keep = lambda s: s and not s.endswith(":") and not s.startswith(".")  # noqa: E731
    bodies = [[lines[i] for i in r if keep(lines[i])] for r in _innermost(loops(asm, symbol))]

    def rank(lines):
        cls = [classify(base_mnemonic(l.split()[0]))[0] for l in lines]
        return (cls.count("mfma"), sum(c.startswith(("vmem", "lds")) for c in cls), len(lines))
    hot = max(bodies, key=rank) if bodies else body(asm, symbol)
    counts, nbytes, mfma, issue = Counter(), Counter(), 0.0, 0.0
    wave = LIMITS[arch]["wave_size"]
    for l in hot:
        base = base_mnemonic(l.split()[0])
        cls, per_lane = classify(base, bool(re.search(r"\slds\b", l)) and base.startswith("buffer_load"))
        counts[cls] += 1
        if per_lane:
            nbytes[cls] += per_lane * wave
        if cls == "mfma":
            mfma += mfma_cycles(l, arch)
        else:
            issue += VALU_CYCLES if cls == "valu" else OTHER_ISSUE_CYCLES
    return LoopProfile(counts, nbytes, mfma, issue, counts["waitcnt"],
                       any(l.startswith("s_waitcnt") and "vmcnt(0)" in l for l in hot), bool(bodies), hot)


def mnemonics(asm: str, name: str) -> list[str]:
    """Sorted distinct mnemonics of kernel ``name``, both halves of a dual-issue (VOPD) line
    ``v_dual_x ... :: v_dual_y ...`` included."""
    return sorted({half.split()[0] for l in body(asm, name) for half in l.split("::")})


# ---- loop structure (HIP vs FlyDSL parity report of moe_gemm2_a4w4) ----
STEPS_PER_LOOP_ITERATION = 2  # both kernels run K steps in pairs (two alternating register sets)
_COUNTED = (("scaled MFMA", ("v_mfma_scale_f32_16x16x128_f8f6f4",)),
            ("buffer loads (all)", ("buffer_load_",)),
            ("  of which direct-to-LDS", ("buffer_load_dwordx4/lds",)),
            ("barriers", ("s_barrier",)),
            ("ds_read_b128", ("ds_read_b128",)))


def k_step_profile(asm: str, symbol: str = "moe_gemm2_a4w4") -> dict:
    """Instruction counts per K step of the main loop (the body between the loop header and
    its back-edge, divided by the steps it runs) of one kernel's assembly."""
    lines = [l for l in (x.split(";")[0].strip() for x in asm.splitlines()) if l]
    start = lines.index(f"{symbol}:")
    labels = {}
    for i, l in enumerate(lines[start:], start):
        if l.endswith(":") and l.startswith(".LBB"):
            labels[l[:-1]] = i
    loop = None
    for i, l in enumerate(lines[start:], start):
        parts = l.split()
        if parts[0].startswith("s_cbranch") and len(parts) > 1 and labels.get(parts[1], i) < i:
            loop = lines[labels[parts[1]] + 1:i + 1]
            break
    if loop is None:
        raise ValueError(f"{symbol}: no loop back-edge found")
    keyed = [(l.split()[0] + ("/lds" if l.split()[0].startswith("buffer_load") and " lds" in f" {l} " else ""))
             for l in loop if not l.endswith(":") and not l.startswith(".")]
    out = {}
    for name, prefixes in _COUNTED:
        n = sum(1 for m in keyed if any(m.startswith(p) for p in prefixes))
        out[name] = n / STEPS_PER_LOOP_ITERATION
    return out
