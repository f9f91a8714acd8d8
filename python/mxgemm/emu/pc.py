"""Code addresses of a kernel's instructions, for the instructions that read or write the PC
(s_getpc_b64 / s_get_pc_i64, s_setpc_b64, s_swappc_b64, s_rfe_i64, s_add_pc_i64;
docs/gfx1250_emulator.md §6).

The emulator runs assembly text, not code bytes. A kernel that only passes code addresses from
s_getpc_b64 to s_setpc_b64 (a call and its return) cannot tell real addresses from any other
numbering, so its instruction i sits at ``CODE_BASE + 4 i``. s_add_pc_i64 adds a byte
displacement, so a kernel holding it gets the addresses its encodings give: each instruction's
size as the project's assembler encodes it, and the padding of its ``.p2align`` directives."""
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
_DATA = re.compile(r"^\s*\.(byte|short|long|quad|[248]byte|fill|space|zero|skip|align|balign)\b")


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
    n = len(code.instrs)
    if not any(ins.base in BYTE_EXACT for ins in code.instrs):
        return CodeAddresses([4 * i for i in range(n + 1)])
    sizes = _encoded(text, arch, code.name)
    lines = list(dict.fromkeys(ins.line for ins in code.instrs))
    if sizes is None or len(sizes[0]) != len(lines):
        raise UnsupportedInstruction(f"kernel {code.name!r}: the assembler's encodings do not match its "
                                     f"{len(lines)} instruction lines, so its byte addresses are unknown")
    at = dict(zip(lines, sizes[0]))
    return CodeAddresses([at[ins.line] for ins in code.instrs] + [sizes[1]])


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
        elif not inside:
            continue
        elif (e := _ENCODING.search(ln)) is not None:
            offs.append(off)
            off += len(e.group(1).split(","))
        elif (a := _ALIGN.match(ln)) is not None:
            pad = -off % (1 << int(a.group(1)))
            off += pad if a.group(3) is None or pad <= int(a.group(3), 0) else 0
        elif _DATA.match(ln) or ln.lstrip().startswith(".section"):
            break
    return (offs, off) if inside else None
