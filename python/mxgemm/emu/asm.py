"""Parse AMDGPU assembly text: kernels, their instructions and labels, .amdhsa_* directives
and the .amdgpu_metadata YAML."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import asm_facts
from .isa import Instr, UnsupportedInstruction, parse_mods, parse_operand, split_operands

_LABEL = re.compile(r"^([.\w$]+):")
_FUNCTION = re.compile(r"^\s*\.type\s+([.\w$]+)\s*,\s*@function", re.M)
_MNEMONIC = re.compile(r"^([a-z][a-z0-9_]*)\s*(.*)$")
# gfx1250 encodes VGPRs 256-1023 via s_set_vgpr_msb; the assembler comments each operand with the
# register it really names, `v13 /*v269*/`: take that one
_REAL_VGPR = re.compile(r"[va](?:\d+|\[\d+:\d+\])\s*/\*\s*([va](?:\d+|\[\d+:\d+\]))\s*\*/")


@dataclass
class KernelArg:
    offset: int
    size: int
    value_kind: str
    address_space: str | None = None
    name: str | None = None


@dataclass
class KernelMeta:
    name: str
    args: list
    kernarg_size: int
    group_segment_fixed_size: int
    vgpr_count: int
    agpr_count: int
    sgpr_count: int
    wavefront_size: int
    directives: dict = field(default_factory=dict)
    max_flat_workgroup_size: int = 1024
    reqd_workgroup_size: tuple | None = None     # (x, y, z) the kernel was compiled for, if it says
    cluster_dims: tuple | None = None            # (x, y, z) workgroups per cluster of a cluster launch

    def d(self, key, default=0):
        return self.directives.get(key, default)

    @property
    def accum_offset(self):
        return self.d("accum_offset", self.vgpr_count)


@dataclass
class KernelCode:
    name: str
    instrs: list          # list[Instr]
    labels: dict          # label -> instruction index


def _strip_comment(line: str) -> str:
    i = line.find(";")
    if i >= 0:
        line = line[:i]
    i = line.find("//")
    if i >= 0:
        line = line[:i]
    return _REAL_VGPR.sub(r"\1", line).strip() if "/*" in line else line.strip()


def parse(text: str, sgprs: dict):
    """-> (codes: dict name -> KernelCode, metas: dict name -> KernelMeta); sgprs: the target's
    named scalar registers."""
    lines = text.splitlines()
    md, directives = asm_facts.metadata(text), asm_facts.directives(text)
    funcs = set(_FUNCTION.findall(text))
    metas = {}
    for k in md.get("amdhsa.kernels", []):
        name = k[".name"]
        args = [KernelArg(a[".offset"], a[".size"], a[".value_kind"], a.get(".address_space"), a.get(".name"))
                for a in k.get(".args", [])]
        dv = directives.get(name, {})
        metas[name] = KernelMeta(
            name, args, k.get(".kernarg_segment_size", dv.get("kernarg_size", 0)),
            k.get(".group_segment_fixed_size", dv.get("group_segment_fixed_size", 0)),
            k.get(".vgpr_count", 0), k.get(".agpr_count", 0), k.get(".sgpr_count", 0),
            k.get(".wavefront_size", 64), dv, k.get(".max_flat_workgroup_size", 1024),
            tuple(k[".reqd_workgroup_size"]) if k.get(".reqd_workgroup_size") else None,
            tuple(k[".cluster_dims"]) if k.get(".cluster_dims") else None)
    for name, dv in directives.items():   # kernel descriptor without metadata
        if name not in metas:
            metas[name] = KernelMeta(name, [], dv.get("kernarg_size", 0), dv.get("group_segment_fixed_size", 0),
                                     dv.get("next_free_vgpr", 0), 0, dv.get("next_free_sgpr", 0), 64, dv)
    codes = _parse_code(lines, set(metas) | funcs, sgprs)
    return codes, metas


_LOCAL_REF = re.compile(r"^(\d+)([fb])$")


def _resolve_local_labels(code: KernelCode, defs: dict) -> None:
    """GNU numeric local labels: ``Nb`` is the last ``N:`` at or before the referring line, ``Nf``
    the first after it (a number may be defined many times). Each reference becomes a label
    of its own, named after the number, the direction and the line."""
    for ins in code.instrs:
        for op in ins.ops:
            m = _LOCAL_REF.match(op.text) if op.kind == "sym" else None
            if m is None:
                continue
            lines = defs.get(m.group(1), [])
            found = [i for no, i in lines if no <= ins.line] if m.group(2) == "b" else \
                [i for no, i in lines if no > ins.line]
            if not found:
                side = "before" if m.group(2) == "b" else "after"
                raise UnsupportedInstruction(f"local label {op.text} has no definition {side} it: {ins.where()}")
            op.kind, op.text = "label", f"{op.text}@{ins.line}"
            code.labels[op.text] = found[-1] if m.group(2) == "b" else found[0]


def _parse_code(lines, names, sgprs):
    codes, cur, local = {}, None, {}
    for no, ln in enumerate(lines, 1):
        s = _strip_comment(ln)
        if not s:
            continue
        m = _LABEL.match(s)
        if m:
            lab = m.group(1)
            if lab in names:
                cur = KernelCode(lab, [], {})
                codes[lab], local[lab] = cur, {}
            elif lab.startswith(".Lfunc_end"):
                cur = None
            elif cur is not None and lab.isdigit():
                local[cur.name].setdefault(lab, []).append((no, len(cur.instrs)))
            elif cur is not None:
                cur.labels[lab] = len(cur.instrs)
            s = s[m.end():].strip()
            if not s:
                continue
        if cur is None:
            continue
        if s.startswith("."):
            if s.startswith((".section", ".amdhsa_kernel", ".end_amdgpu")):
                cur = None
            continue
        parts = [_instr(p, no, ln, cur.name, sgprs) for p in s.split("::")]
        cur.instrs.extend(p for p in (_dual_order(*parts) if len(parts) == 2 else parts) if p is not None)
    for name, code in codes.items():
        _resolve_local_labels(code, local[name])
    return codes


def _instr(s, no, ln, kernel, sgprs):
    m = _MNEMONIC.match(s.strip())
    if not m:
        return None
    ops, mods = split_operands(m.group(2))
    return Instr(m.group(1), [parse_operand(o, sgprs) for o in ops], parse_mods(mods), no, ln, kernel)


def _regs(ops):
    return {(o.kind, o.index + j) for o in ops if o.is_reg for j in range(o.count)}


def _dual_order(x, y):
    """A dual-issue (VOPD, 'X :: Y') pair as two instructions: both read their sources before
    either writes, so Y goes first when X writes a register Y reads."""
    if not _regs(x.ops[:1]) & _regs(y.ops[1:]):
        return x, y
    if _regs(y.ops[:1]) & _regs(x.ops[1:]):
        raise UnsupportedInstruction(f"dual-issue pair with crossed operands: {x.where()}")
    return y, x
