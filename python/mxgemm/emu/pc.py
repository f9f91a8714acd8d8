"""Code addresses of a kernel's instructions, for the instructions that read or write the PC
(s_getpc_b64 / s_get_pc_i64, s_setpc_b64, s_swappc_b64, s_rfe_i64, s_add_pc_i64;
docs/gfx1250_emulator.md §6).

The emulator runs assembly text, not code bytes. A kernel that only passes code addresses from
s_getpc_b64 to s_setpc_b64 (a call and its return) cannot tell real addresses from any other
numbering, so its instruction i sits at ``CODE_BASE + 4 i``. s_add_pc_i64 adds a byte
displacement, and an operand computed from labels (LLVM's long branch: ``(.LBB0_3-.Lpost_getpc0)
&4294967295`` on gfx950, ``s_add_pc_i64 .LBB0_9-.Lpost_addpc0`` on gfx1250, or a ``.set`` symbol
defined so) holds byte distances, so a kernel holding either gets the addresses its encodings
give: each instruction's size as the project's assembler encodes it, the padding of its
``.p2align`` directives and the bytes of data directives in its code. Label operands are then
evaluated as the assembler does (``evaluate``) and become constants."""
from __future__ import annotations

import functools
import re
import subprocess

from .isa import EmulatorFault, UnsupportedInstruction

CODE_BASE = 1 << 40
BYTE_EXACT = frozenset({"s_add_pc_i64"})     # instructions that need the encoded sizes
_ENCODING = re.compile(r";\s*encoding:\s*\[([^\]]*)\]")
_ALIGN = re.compile(r"^\s*\.p2align\s+(\d+)(?:\s*,\s*(\w*)\s*(?:,\s*(\w+))?)?")
_LABEL = re.compile(r"^([.\w$]+):")
_DIRECTIVE = re.compile(r"^\s*\.(\w+)\b\s*(.*)")
_DATA_BYTES = {"byte": 1, "short": 2, "long": 4, "quad": 8}    # one value a line, as -show-encoding prints
# directives that emit no bytes (the assembler prints .no_dead_strip after a .set in code)
_NO_BYTES = {"set", "equ", "no_dead_strip", "type", "size", "globl", "local", "weak", "loc", "file"}
_SET = re.compile(r"^\s*\.set\s+([.\w$]+)\s*,\s*(.+?)\s*$", re.M)
_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)|([.A-Za-z_$][\w.$]*)|(<<|>>|[-+*/%&|^~!()]))")
# binary operators by precedence, LLVM's AsmParser for GNU targets (checked against the project's
# assembler: 8>>1+1 is 5, 1|2-1 is 2, 6^3+1 is 6); >> is a logical shift of the 64-bit value
# (-8>>1 assembles to 0x7ffffffffffffffc). docs/gfx1250_emulator.md §6
_BINARY = {"+": 4, "-": 4, "|": 5, "^": 5, "&": 5, "*": 6, "/": 6, "%": 6, "<<": 6, ">>": 6}
MASK64 = (1 << 64) - 1


class CodeAddresses:
    """Byte offset of each instruction of a kernel (and of its end) from the kernel's start."""

    def __init__(self, offsets):
        self.offsets = offsets
        self._index = {}
        for i, o in enumerate(offsets[:-1]):
            self._index.setdefault(o, i)      # the two halves of a dual issue share one address

    def of(self, i: int) -> int:
        return CODE_BASE + self.offsets[i]

    def index(self, addr: int, kernel: str) -> int:
        i = self._index.get(addr - CODE_BASE)
        if i is None:
            raise EmulatorFault(f"jump to {addr:#x}, which is not an instruction of kernel {kernel!r}")
        return i


def code_addresses(text: str, code, arch: str) -> CodeAddresses:
    """The kernel's code addresses; operands computed from its labels become constants."""
    n = len(code.instrs)
    sets = dict(_SET.findall(text)) if ".set" in text else {}
    exprs = [op for ins in code.instrs for op in ins.ops
             if op.kind in ("label", "sym") and _label_expr(op.text, code.labels, sets)]
    if not exprs and not any(ins.base in BYTE_EXACT for ins in code.instrs):
        return CodeAddresses([4 * i for i in range(n + 1)])
    sizes = _encoded(text, arch, code.name)
    lines = list(dict.fromkeys(ins.line for ins in code.instrs))
    if sizes is None or len(sizes[0]) != len(lines):
        raise UnsupportedInstruction(f"kernel {code.name!r}: the assembler's encodings do not match its "
                                     f"{len(lines)} instruction lines, so its byte addresses are unknown")
    at = dict(zip(lines, sizes[0]))
    addrs = CodeAddresses([at[ins.line] for ins in code.instrs] + [sizes[1]])
    values = {k: addrs.of(i) for k, i in code.labels.items()}
    for op in exprs:
        op.kind, op.value = "const", evaluate(op.text, values, sets)
    return addrs


def _label_expr(text: str, labels: dict, sets: dict) -> bool:
    """Whether an operand is an assembler expression over the kernel's labels and .set symbols
    (a plain label is a branch target, not a value)."""
    if text in labels:
        return False
    try:
        names = [t[1] for t in _tokens(text) if t[1]]
    except ValueError:
        return False
    return bool(names) and all(x in labels or x in sets for x in names)


def _tokens(text: str):
    out, i = [], 0
    while i < len(text.rstrip()):
        m = _TOKEN.match(text, i)
        if m is None:
            raise ValueError(f"cannot read {text[i:]!r} in {text!r}")
        out.append(m.groups(""))
        i = m.end()
    return out


def _apply(op, v, w, text):
    if op in "/%" and w == 0:
        raise UnsupportedInstruction(f"division by zero in {text!r}")
    if op in ("<<", ">>") and not 0 <= w < 64:
        raise UnsupportedInstruction(f"shift by {w} in {text!r}")
    r = {"+": int.__add__, "-": int.__sub__, "|": int.__or__, "^": int.__xor__, "&": int.__and__,
         "*": int.__mul__, "/": lambda a, b: abs(a) // abs(b) * (-1 if (a < 0) != (b < 0) else 1),
         "%": lambda a, b: a - b * (abs(a) // abs(b) * (-1 if (a < 0) != (b < 0) else 1)),
         "<<": int.__lshift__, ">>": lambda a, b: (a & MASK64) >> b}[op](v, w)
    return (r & MASK64) - ((r >> 63 & 1) << 64)


def evaluate(text: str, labels: dict, sets: dict, _seen=()) -> int:
    """The value of an assembler expression: labels (name -> address), .set symbols (name -> their
    expression text), integers, unary - ~ ! + and the binary operators of ``_BINARY``, as a signed
    64-bit integer."""
    toks, pos = _tokens(text), 0

    def atom():
        nonlocal pos
        num, name, op = toks[pos]
        pos += 1
        if num:
            return int(num, 0)
        if name in labels:
            return labels[name]
        if name in sets:
            if name in _seen:
                raise UnsupportedInstruction(f".set symbol {name} is defined through itself")
            return evaluate(sets[name], labels, sets, (*_seen, name))
        if name:
            raise UnsupportedInstruction(f"symbol {name} in {text!r} is not a label of the kernel nor a .set symbol")
        if op == "(":
            v = binary(0)
            if pos >= len(toks) or toks[pos][2] != ")":
                raise UnsupportedInstruction(f"unbalanced parentheses in {text!r}")
            pos += 1
            return v
        v = atom()
        return {"-": -v, "+": v, "~": ~v, "!": int(not v)}[op]

    def binary(floor):
        nonlocal pos
        v = atom()
        while pos < len(toks) and _BINARY.get(toks[pos][2], 0) > floor:
            op = toks[pos][2]
            pos += 1
            w = binary(_BINARY[op])
            v = _apply(op, v, w, text)
        return v

    v = binary(0)
    if pos != len(toks):
        raise UnsupportedInstruction(f"cannot evaluate {text!r}")
    return v


@functools.lru_cache(maxsize=16)
def _encoded(text: str, arch: str, kernel: str):
    """(byte offset of each instruction line, end offset) of the kernel, from the assembler's
    encodings (clang -cc1as -show-encoding) of the whole program text; None if it has no code."""
    from ..toolchain import find_compiler
    argv = [*find_compiler(arch).clang, "-cc1as", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", arch,
            "-show-encoding", "-filetype", "asm", "-", "-o", "-"]
    p = subprocess.run(argv, input=text, capture_output=True, text=True)
    if p.returncode:
        raise UnsupportedInstruction(f"the assembler rejects the program, so its byte addresses are unknown: "
                                     f"{p.stderr.strip()[:300]}")
    offs, inside, off = [], False, 0
    for ln in p.stdout.splitlines():
        m = _LABEL.match(ln)
        if m and (m.group(1) == kernel or inside and m.group(1).startswith(".Lfunc_end")):
            if inside:
                break
            inside = True
        elif not inside or m:
            continue
        elif (e := _ENCODING.search(ln)) is not None:
            offs.append(off)
            off += len(e.group(1).split(","))
        elif (a := _ALIGN.match(ln)) is not None:
            pad = -off % (1 << int(a.group(1)))
            off += pad if a.group(3) is None or pad <= int(a.group(3), 0) else 0
        elif (d := _DIRECTIVE.match(ln)) is None or d.group(1) in _NO_BYTES:
            continue
        elif d.group(1) in (*_DATA_BYTES, "zero", "fill"):
            args = [int(x, 0) for x in d.group(2).split(",")] if d.group(1) in ("zero", "fill") else [1]
            off += _DATA_BYTES.get(d.group(1), 1) * args[0] * (args[1] if d.group(1) == "fill" and len(args) > 1 else 1)
        elif d.group(1) == "section":
            break
        else:
            raise UnsupportedInstruction(f"kernel {kernel!r}: the data directive {ln.strip()!r} in its code has no "
                                         f"size the emulator reads, so its byte addresses are unknown")
    return (offs, off) if inside else None
