"""Instruction decoding, errors and handler tables.

Every mnemonic is implemented by a *builder*: a function called once per instruction
when a program is loaded, which reads the decoded operands and returns the closure that
executes the instruction on a wave (``run(w) -> None``). Builders register in a
``HandlerTable`` with ``@handler("mnemonic", ...)`` (the gfx9 table ``GFX9``); see the package
docstring for the full contract.
"""
from __future__ import annotations

import re
import struct

import numpy as np

u32, i32, f32, u64, i64, f64, f16, u16, i16 = (np.uint32, np.int32, np.float32, np.uint64, np.int64,
                                               np.float64, np.float16, np.uint16, np.int16)

# ---------------------------------------------------------------------------- errors


class EmulatorError(RuntimeError):
    pass


class UnsupportedInstruction(EmulatorError):
    pass


class EmulatorFault(EmulatorError):
    pass


class RaceError(EmulatorError):
    pass


class Split(Exception):
    """Raised, before any side effect, by an instruction a lockstep unit of waves must run
    wave by wave (see wave.py)."""


class PerWave:
    """An SGPR (or SCC) value that differs between the waves of a lockstep unit (e.g. the
    workgroup id in a unit spanning workgroups): v, one Python int per wave. Getters that
    know it broadcast it to lanes; any other use (arithmetic, int(), truth, formatting)
    raises Split, so an instruction that does not know it runs wave by wave; compare values
    with PerWave.same."""
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = tuple(v)

    @staticmethod
    def of(vals):
        """vals, one per wave: a PerWave, or the int when every wave agrees."""
        v0 = vals[0]
        return v0 if vals.count(v0) == len(vals) else PerWave(vals)

    def __eq__(self, other):
        if other.__class__ is not PerWave:
            raise Split()
        return other.v == self.v

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    @staticmethod
    def at(x, i):
        """Scalar value x (an int or PerWave) as wave i of the unit sees it."""
        return x.v[i] if x.__class__ is PerWave else x

    @staticmethod
    def same(x, y):
        """Whether scalar values x and y (ints or PerWave) are the same, without raising."""
        return x.__class__ is y.__class__ and x == y

    def _split(self, *args):
        raise Split()

    for _m in ("int index bool float format array add radd sub rsub mul rmul floordiv rfloordiv mod rmod "
               "and rand or ror xor rxor lshift rlshift rshift rrshift neg pos invert abs lt le gt ge").split():
        locals()[f"__{_m}__"] = _split
    del _m


# ---------------------------------------------------------------------------- registry

class HandlerTable(dict):
    """mnemonic -> builder of one instruction set."""

    def register(self, *mnemonics, per_wave=False, scalar=False):
        """Decorator registering a builder for one or more mnemonics (encoding suffixes
        _e32/_e64/_sdwa/_dpp are stripped before lookup, so register the bare name).
        per_wave: the instructions never run in lockstep across waves (e.g. atomics, whose
        order between waves is observable). scalar: they read and write only SGPRs and SCC
        (a lockstep unit whose waves hold different SGPR values runs them once per wave)."""
        def deco(fn):
            def b(ins):
                ins.per_wave, ins.scalar = per_wave, scalar
                return fn(ins)
            for m in mnemonics:
                self[m] = b if per_wave or scalar else fn
            return fn
        return deco

    def builder(self, ins):
        return self.get(ins.base) or self.get(ins.mnemonic)


GFX9 = HandlerTable()      # gfx9-family instructions (gfx950)
handler = GFX9.register
GFX12 = HandlerTable()     # gfx12-only instructions (gfx1250); gfx1250.py maps the rest onto GFX9


def base_mnemonic(m: str) -> str:
    for suf in ("_e32", "_e64", "_sdwa", "_dpp"):
        if m.endswith(suf):
            return m[: -len(suf)]
    return m


# ---------------------------------------------------------------------------- operands

SHARED_BASE = 1 << 48          # flat aperture of LDS (src_shared_base); private not modelled
_SRC_CONST = {"src_shared_base": SHARED_BASE >> 32, "src_shared_limit": (SHARED_BASE >> 32) | 0xFFFFFFFF,
              "src_private_base": 0, "src_private_limit": 0, "src_pops_exiting_wave_id": 0,
              "src_vccz": None, "src_execz": None, "src_scc": None}
# Inline float constants as printed by LLVM; 0.15915494 is 1/(2*pi) [ISA §4.6.2].
_INLINE_F = {"0.5": 0.5, "-0.5": -0.5, "1.0": 1.0, "-1.0": -1.0, "2.0": 2.0, "-2.0": -2.0,
             "4.0": 4.0, "-4.0": -4.0, "0.15915494": 0.15915494309189535}
_INV2PI_BITS = {"f16": 0x3118, "bf16": 0x3E22, "f32": 0x3E22F983, "f64": 0x3FC45F306DC9C882}
_REG = re.compile(r"^([vsa])(?:(\d+)|\[(\d+):(\d+)\])$")


class Operand:
    """One decoded operand. kind: 'v' | 'a' | 's' (register ranges; a is mapped onto the
    unified VGPR file at load time), 'scc', 'const' (inline or literal integer bits in
    .value), 'fconst' (inline float constant, encoding depends on the operand type),
    'off', 'label', 'sym' (anything else, text kept)."""
    __slots__ = ("kind", "index", "count", "value", "neg", "abs", "sext", "text")

    def __init__(self, kind, index=0, count=1, value=0, text=""):
        self.kind, self.index, self.count, self.value, self.text = kind, index, count, value, text
        self.neg = self.abs = self.sext = False

    @property
    def is_reg(self):
        return self.kind in "vas" and len(self.kind) == 1

    def __repr__(self):
        return f"Operand({self.text!r})"


def parse_operand(t: str, sgprs: dict) -> Operand:
    """sgprs: the target's named scalar registers, name -> (number, count)."""
    text = t
    neg = absm = sext = False
    if t.startswith("-") and (t[1:2] in ("|", "v", "s", "a") or t[1:].startswith(("neg", "abs", "vcc", "exec", "m0"))):
        neg, t = True, t[1:]
    if t.startswith("neg(") and t.endswith(")"):
        neg, t = True, t[4:-1]
    if t.startswith("|") and t.endswith("|"):
        absm, t = True, t[1:-1]
    if t.startswith("abs(") and t.endswith(")"):
        absm, t = True, t[4:-1]
    if t.startswith("sext(") and t.endswith(")"):
        sext, t = True, t[5:-1]
    m = _REG.match(t)
    if m:
        lo = int(m.group(2) if m.group(2) is not None else m.group(3))
        hi = lo if m.group(2) is not None else int(m.group(4))
        op = Operand(m.group(1), lo, hi - lo + 1, text=text)
    elif t in sgprs:
        i, n = sgprs[t]
        op = Operand("s", i, n, text=text)
    elif t == "scc" or t == "src_scc":
        op = Operand("scc", text=text)
    elif t in _SRC_CONST and _SRC_CONST[t] is not None:
        op = Operand("const", value=_SRC_CONST[t], text=text)
    elif t == "off":
        op = Operand("off", text=text)
    elif t in _INLINE_F:
        op = Operand("fconst", value=t, text=text)
    else:
        try:
            v = int(t, 0)
            op = Operand("const", value=v, text=text)
        except ValueError:
            op = Operand("label" if t.startswith(".") else "sym", text=text)
    op.neg, op.abs, op.sext = neg, absm, sext
    return op


def const_bits(op: Operand, ty: str) -> int:
    """Bit pattern of an inline/literal constant for an operand of type ty
    ('b32','f32','f16','bf16','b64','f64','b16'). Integers are sign-extended to the
    operand width (inline constants -16..64 are; a 32-bit literal in an f64 operand
    is the high half [ISA §4.6.2]); float inline constants take the operand's format."""
    if op.kind == "fconst":
        if op.value == "0.15915494" or op.value == "-0.15915494":
            return _INV2PI_BITS[ty if ty in _INV2PI_BITS else "f32"]
        x = _INLINE_F[op.value]
        if ty == "f16" or ty == "b16":
            return int(np.array(x, f16).view(u16))
        if ty == "bf16":
            return int(np.array(x, f32).view(u32)) >> 16
        if ty in ("f64", "b64"):
            return struct.unpack("<Q", struct.pack("<d", x))[0]
        return int(np.array(x, f32).view(u32))
    v = op.value
    if ty in ("f64",):
        if -16 <= v <= 64:
            return v & 0xFFFFFFFFFFFFFFFF
        return (v & 0xFFFFFFFF) << 32
    if ty in ("b64",):
        return v & 0xFFFFFFFFFFFFFFFF if v < 0 else v
    if ty in ("f16", "b16", "bf16") and -16 <= v <= 64:
        return v & 0xFFFF
    return v & 0xFFFFFFFF


# ---------------------------------------------------------------------------- instruction

_MOD_KV = re.compile(r"^(\w+):(.*)$")


class Instr:
    """A decoded instruction. Builders read:
    mnemonic (as written), base (encoding suffix stripped), enc ('e32','e64','sdwa','dpp' or
    ''), ops (list[Operand]), mods (dict: flag -> True, key:value -> int or list of ints,
    e.g. offset, op_sel, op_sel_hi, neg_lo, neg_hi, cbsz, abid, blgp, clamp, sc0, lds),
    line (1-based line in the .s text), text, kernel (name), and prog (the Program,
    e.g. prog.accum_offset)."""
    __slots__ = ("mnemonic", "base", "enc", "ops", "mods", "line", "text", "kernel", "prog", "index",
                 "target", "per_wave", "scalar")

    def __init__(self, mnemonic, ops, mods, line, text, kernel):
        self.mnemonic, self.ops, self.mods, self.line, self.text, self.kernel = (
            mnemonic, ops, mods, line, text, kernel)
        self.base = base_mnemonic(mnemonic)
        self.enc = mnemonic[len(self.base) + 1:] if self.base != mnemonic else ""
        self.prog = None
        self.index = 0
        self.target = None
        self.per_wave = False     # set by a builder whose closure needs single waves (wave.py)
        self.scalar = False       # set by a builder of a scalar-only instruction (wave.scalar_per_wave)

    def where(self):
        return f"kernel {self.kernel!r}, line {self.line}: {self.text.strip()}"

    def __repr__(self):
        return f"<{self.text.strip()} @{self.line}>"


def _split_top(s, is_sep):
    """Split s at characters is_sep(ch) outside brackets/parentheses; drop empty parts."""
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += (ch in "[(") - (ch in "])")
        if is_sep(ch) and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def split_operands(s: str):
    """Split 'v1, v[2:3], off offset:16 sc0' into operand strings and modifier tokens.
    Operands are comma separated; after the last operand, space-separated modifiers
    follow (a modifier can contain commas inside brackets, e.g. op_sel:[0,1])."""
    parts = [p for p in _split_top(s, lambda ch: ch == ",")]
    parts = parts if any(parts) else []
    ops, mods = [], []
    for i, p in enumerate(parts):
        toks = [t for t in _split_top(p, str.isspace) if t]
        if i < len(parts) - 1 or not toks:
            ops.append(p)
            continue
        ops.append(toks[0]) if not _is_mod(toks[0]) else mods.append(toks[0])
        mods.extend(toks[1:])
    return [o for o in ops if o], mods


def _is_mod(tok):
    return bool(_MOD_KV.match(tok)) or tok in MOD_FLAGS


MOD_FLAGS = {"glc", "slc", "nt", "sc0", "sc1", "offen", "idxen", "lds", "clamp", "gds", "tfe", "lwe",
             "addr64", "d16", "dlc", "bound_ctrl:0", "row_mirror", "row_half_mirror", "wave_shl:1",
             "wave_shr:1", "wave_rol:1", "wave_ror:1", "row_bcast:15", "row_bcast:31"}


def parse_mods(tokens):
    mods = {}
    for t in tokens:
        m = _MOD_KV.match(t)
        if not m:
            mods[t] = True
            continue
        k, v = m.group(1), m.group(2)
        if v.startswith("["):
            mods[k] = [int(x, 0) for x in v.strip("[]").split(",")]
        else:
            try:
                mods[k] = int(v, 0)
            except ValueError:
                mods[k] = v
    return mods
