"""What the emulator runs, measured against LLVM's own AMDGPU assembler tests.

    python -m mxgemm.emu coverage --arch gfx950|gfx1250 [-v]

The instruction forms come from ``data/mc_forms_<arch>.txt`` (LLVM's llvm/test/MC/AMDGPU lines the
project's assembler accepts for the arch, one example line per form; ``mxgemm.tools.mc_forms``
regenerates it). A form is a mnemonic with its encoding suffix stripped (``isa.base_mnemonic``).
Each form gets one status:

  checked      executes (below), and the tests execute and check it: its mnemonic is in the
               assembly of a registry kernel (every artefact ``mxgemm.build`` builds for the arch;
               the kernel tests run them on the emulator against the reference) or of an emulator
               test corpus kernel (tests/emu/emu_corpus.py, emu1250_corpus.py: each checked against
               numpy). A proxy: it does not see the tests' inline-assembly snippets
  executes     has a handler, and its example runs on one synthetic wave without an exception
  unsupported  parses, but has no handler, or its handler raises on the synthetic wave
  unparsed     the emulator's assembly parser rejects the example

The synthetic wave: a one-instruction kernel (the example, then s_endpgm), every register the
example names first set to ``FILL`` by v_mov / v_accvgpr_write / s_mov, so that a register pair
is the address ``FILL << 32 | FILL`` inside a sparse buffer placed there, a 32-bit register an
LDS / scratch offset inside the kernel's LDS and private segment; branch targets become the next
line, a barrier wait is preceded by its signal. Forms whose FILL operands cannot be valid get a
valid context instead (``kernel_text``): a PC jump's pair holds an instruction's address, an
s_add_pc_i64 displacement is 0, a cluster barrier runs in a launch of one two-workgroup
cluster, an addtid access with no base finds a buffer at address 0. Race checking is off: one
instruction has nothing to race with.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import asm as _asm
from .isa import base_mnemonic, parse_operand, split_operands
from .launch import TARGETS, Emulator
from .memory import SparseBuffer

ARCHS = ("gfx950", "gfx1250")
CLASSES = ("SALU", "SMEM", "VALU", "VOP3P", "DS", "VMEM buffer", "VMEM global", "VMEM scratch", "VMEM flat",
           "MFMA/WMMA", "TDM", "other")
STATUSES = ("checked", "executes", "unsupported", "unparsed")
DATA = Path(__file__).resolve().parent / "data"
TESTS = Path(__file__).resolve().parents[3] / "tests" / "emu"   # the emulator tests, in a source checkout
FILL = 0x2000
SPARSE_BYTES = 1 << 33                       # every FILL << 32 | 32-bit offset
PRIVATE_BYTES = 4 * FILL + (1 << 16)         # vaddr + saddr + offset of a scratch access
_SMEM = ("s_load_", "s_buffer_load_", "s_store_", "s_buffer_store_", "s_dcache_", "s_scratch_", "s_atc_probe",
         "s_memtime", "s_memrealtime", "s_prefetch_", "s_atomic_", "s_buffer_atomic_")
_VOP3P = ("v_pk_", "v_dot", "v_fma_mix", "v_mad_mix")
_MATRIX = ("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")
_VMEM = {"buffer_": "VMEM buffer", "global_": "VMEM global", "cluster_": "VMEM global", "scratch_": "VMEM scratch",
         "flat_": "VMEM flat"}
_BRANCH = ("s_branch", "s_cbranch_", "s_call_")
# instructions that jump to the address in an SGPR pair, and that pair's operand index
_PC_JUMPS = {"s_setpc_b64": 0, "s_set_pc_i64": 0, "s_rfe_i64": 0, "s_swap_pc_i64": 1, "s_swappc_b64": 1}
_PC_TARGET = "s[104:105]"      # the pair a jump reads when its example names no SGPR pair
# a jump's context: its pair holds the address of the instruction after s_getpc_b64, which leaves
# on the second arrival (SCC set just before the jump), so the jump lands on an instruction
_JUMP_BACK = ["s_cmp_eq_u32 0, 1", "s_getpc_b64 {pair}", "s_cbranch_scc1 .Lcov_next", "s_cmp_eq_u32 0, 0"]
_CLUSTER = (2, 1, 1)           # a cluster barrier's launch: one cluster of two one-wave workgroups
_LOW_BYTES = 1 << 16           # the buffer at address 0 of an access with no base (addtid ... off)
_MARK = "   ; the example"
_SREG = re.compile(r"^s(?:\d+|\[\d+:\d+\])$")
_CODE_MNEMONIC = re.compile(r"^([a-z][a-z0-9_]*)(?:\s|$)")


@dataclass
class Form:
    name: str
    example: str
    source: str      # the LLVM test file it came from
    cls: str
    status: str = ""
    note: str = ""   # why not executes: the exception, or the missing handler


def load_forms(arch: str) -> list[Form]:
    rows = [line.split("\t") for line in (DATA / f"mc_forms_{arch}.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    return [Form(name, example, src, klass(name)) for name, example, src in rows]


def source_header(arch: str) -> list[str]:
    return [line[2:] for line in (DATA / f"mc_forms_{arch}.txt").read_text().splitlines() if line.startswith("#")]


def klass(form: str) -> str:
    if form.startswith("tensor_"):
        return "TDM"
    if form.startswith(_MATRIX):
        return "MFMA/WMMA"
    if form.startswith(_SMEM):
        return "SMEM"
    if form.startswith("s_"):
        return "SALU"
    if form.startswith("ds_"):
        return "DS"
    for prefix, cls in _VMEM.items():
        if form.startswith(prefix):
            return cls
    if form.startswith(_VOP3P):
        return "VOP3P"
    return "VALU" if form.startswith("v_") else "other"


def examples_of(asm_texts) -> dict:
    """Base mnemonic -> its first line in the assembly texts (dual-issue lines left out)."""
    out = {}
    for text in asm_texts:
        for line in text.splitlines():
            s = _asm._strip_comment(line)
            m = _CODE_MNEMONIC.match(s)
            if m and "::" not in s:
                out.setdefault(base_mnemonic(m.group(1)), s)
    return out


def mnemonics_of(asm_text: str) -> set:
    """Base mnemonics of the instruction lines of an assembly text (both halves of a dual issue)."""
    out = set()
    for line in asm_text.splitlines():
        s = _asm._strip_comment(line)
        for part in s.split("::"):
            m = _CODE_MNEMONIC.match(part.strip())
            if m:
                out.add(base_mnemonic(m.group(1)))
    return out


def corpus_asm(arch: str) -> list[str]:
    """The assembly the tests run and check on the emulator: every registry artefact for the arch,
    and the emulator test corpora when the tests are beside the package (a source checkout)."""
    from .. import build
    texts = [a.asm for a in build.build(archs=(arch,), progress=False)]
    if (TESTS / "emu_corpus.py").exists():
        if str(TESTS) not in sys.path:
            sys.path.insert(0, str(TESTS))
        import emu_corpus
        cases = __import__("emu1250_corpus").CASES if arch == "gfx1250" else emu_corpus.CASES
        texts += [emu_corpus.asm_of(name, arch) for name in sorted(cases)]
    return texts


def _prelude(ops) -> list[str]:
    """Instructions setting every register an operand names to FILL (EXEC and trap registers kept)."""
    out = []
    for o in ops:
        if o.kind == "v":
            out += [f"v_mov_b32 v{i}, {FILL:#x}" for i in range(o.index, o.index + o.count)]
        elif o.kind == "a":
            out += [f"v_accvgpr_write_b32 a{i}, {FILL:#x}" for i in range(o.index, o.index + o.count)]
        elif o.kind == "s" and _SREG.match(o.text.lstrip("-|").rstrip("|")):
            out += [f"s_mov_b32 s{i}, {FILL:#x}" for i in range(o.index, o.index + o.count)]
        elif o.kind == "s" and o.text in ("m0", "vcc_lo", "vcc_hi", "vcc"):
            out += [f"s_mov_b32 {r}, {FILL:#x}" for r in (("vcc_lo", "vcc_hi") if o.text == "vcc" else (o.text,))]
    return out


def _cluster_barrier(mnemonic, ops) -> bool:
    return mnemonic in ("s_barrier_signal", "s_barrier_wait") and ops[:1] == ["-3"]


def kernel_text(arch: str, example: str) -> str:
    """The synthetic one-instruction kernel ``cov`` of an example line (raises if it does not parse).
    Operand context beyond FILL: a barrier wait is preceded by its signal, a cluster barrier
    signal followed by its wait (the kernel then runs as a cluster, ``_CLUSTER``), a PC jump
    lands on an instruction of the kernel (``_JUMP_BACK``), s_add_pc_i64 adds 0."""
    T = TARGETS[arch]
    mnemonic, _, rest = example.partition(" ")
    ops, mods = split_operands(rest)
    if mnemonic in _PC_JUMPS and not _SREG.match(ops[_PC_JUMPS[mnemonic]]):
        ops[_PC_JUMPS[mnemonic]] = _PC_TARGET
        example = f"{mnemonic} {', '.join(ops)} {' '.join(mods)}".strip()
    parsed = [parse_operand(o, T.sgprs) for o in ops]
    if mnemonic.startswith(_BRANCH) and ops:
        example = f"{mnemonic} {', '.join(ops[:-1] + ['.Lcov_next'])} {' '.join(mods)}".strip()
    agprs = "    .amdhsa_accum_offset 256\n" if arch == "gfx950" else ""
    before, after = [], []
    if mnemonic == "s_barrier_wait":         # a wave waits only on a barrier it signalled
        before = [f"s_barrier_signal {ops[0]}"]
    elif _cluster_barrier(mnemonic, ops):    # a cluster waits for every signal: the launch ends at a wait
        after = [f"s_barrier_wait {ops[0]}"]
    if mnemonic in _PC_JUMPS:
        before = [line.format(pair=ops[_PC_JUMPS[mnemonic]]) for line in _JUMP_BACK]
    elif mnemonic == "s_add_pc_i64" and _SREG.match(ops[0]):
        i = parse_operand(ops[0], T.sgprs).index
        before = [f"s_mov_b32 s{i}, 0", f"s_mov_b32 s{i + 1}, 0"]
    body = "\n".join(f"  {s}" for s in _prelude(parsed) + before + [example + _MARK] + after)
    meta = ""
    if _cluster_barrier(mnemonic, ops):
        meta = ("  .amdgpu_metadata\n---\namdhsa.kernels:\n  - .name: cov\n    .wavefront_size: "
                f"{T.wave}\n    .cluster_dims: [{', '.join(map(str, _CLUSTER))}]\n...\n  .end_amdgpu_metadata\n")
    return (f"  .text\n  .globl cov\n  .p2align 8\n  .type cov,@function\ncov:\n{body}\n.Lcov_next:\n  s_endpgm\n"
            f".Lfunc_end0:\n  .rodata\n  .amdhsa_kernel cov\n    .amdhsa_next_free_vgpr 512\n"
            f"    .amdhsa_next_free_sgpr 106\n{agprs}    .amdhsa_group_segment_fixed_size {T.lds_bytes}\n"
            f"    .amdhsa_private_segment_fixed_size {PRIVATE_BYTES}\n  .end_amdhsa_kernel\n{meta}")


def run_form(arch: str, form: Form) -> None:
    """Set form.status (executes / unsupported / unparsed) and form.note from one synthetic run."""
    T = TARGETS[arch]
    try:
        text = kernel_text(arch, form.example)
        codes, metas = _asm.parse(text, T.sgprs)
        ins = next(i for i in codes["cov"].instrs if i.text.endswith(_MARK))
    except Exception as e:     # the parser's own failure is what this status reports
        form.status, form.note = "unparsed", f"{type(e).__name__}: {e}"
        return
    if T.handlers.builder(ins) is None:
        form.status, form.note = "unsupported", "no handler"
        return
    emu = Emulator(arch=arch, race_check=False)
    buffers = [SparseBuffer(SPARSE_BYTES, FILL << 32)]
    if "addtid" in ins.base and ins.ops[1].kind == "off":     # the address is the offset alone
        buffers.append(SparseBuffer(_LOW_BYTES, 0))
    try:
        emu.launch_kernarg(emu.load(text), "cov", metas["cov"].cluster_dims or (1, 1, 1), (T.wave, 1, 1), b"",
                           buffers)
    except Exception as e:     # any failure of the handler is the finding
        form.status, form.note = "unsupported", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return
    form.status = "executes"


def report(arch: str, forms: list[Form] | None = None, checked: set | None = None) -> list[Form]:
    """Every form (default: all of the arch's data file) with its status; ``checked``: the base
    mnemonics the tests run and check (default: those of ``corpus_asm``)."""
    forms = load_forms(arch) if forms is None else forms
    if checked is None:
        checked = set().union(*map(mnemonics_of, corpus_asm(arch)))
    for f in forms:
        run_form(arch, f)
        if f.name in checked and f.status == "executes":
            f.status = "checked"
    return forms


def table(rows: list[Form]) -> dict:
    """class -> Counter of statuses (and 'total'), classes in CLASSES order, plus 'all'."""
    out = {}
    for cls in CLASSES + ("all",):
        sel = [f for f in rows if cls in ("all", f.cls)]
        if sel:
            out[cls] = Counter(f.status for f in sel)
            out[cls]["total"] = len(sel)
    return out


def format_report(arch: str, rows: list[Form], verbose: bool = False) -> str:
    t = table(rows)
    lines = [f"emulator coverage, {arch}: {len(rows)} instruction forms of LLVM's AMDGPU assembler tests",
             *(f"  {h}" for h in source_header(arch) if h.startswith(("Source:", "Assembler:", "Files"))), "",
             f"{'class':<14}{'forms':>6}" + "".join(f"{s:>18}" for s in STATUSES)]
    for cls, c in t.items():
        cells = "".join(f"{c[s]:>8} ({100 * c[s] / c['total']:5.1f}%)" for s in STATUSES)
        lines.append(f"{cls:<14}{c['total']:>6}{cells}")
    if verbose:
        for status in STATUSES:
            sel = [f for f in rows if f.status == status]
            lines += ["", f"{status} ({len(sel)}):"]
            lines += [f"  {f.cls:<13} {f.name:<40} {f.example}" + (f"   [{f.note}]" if f.note else "") for f in sel]
    return "\n".join(lines)


def main(argv) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m mxgemm.emu coverage", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=ARCHS, default="gfx950")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the forms of each status")
    a = ap.parse_args(argv)
    print(format_report(a.arch, report(a.arch), a.verbose))
    return 0
