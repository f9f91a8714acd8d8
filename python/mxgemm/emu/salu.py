"""Scalar ALU, program control and scalar memory. Scalar values are Python ints."""
from __future__ import annotations

import re

import numpy as np

from . import race
from . import regs as R
from .isa import EmulatorFault, PerWave, Split, UnsupportedInstruction, const_bits, handler, u32, u64
from .wave import scalar_views

MASK32, MASK64 = 0xFFFFFFFF, (1 << 64) - 1


def sget(ins, i, bits=32):
    """Getter w -> unsigned Python int of scalar operand i."""
    op = ins.ops[i]
    if op.kind == "s":
        r = op.index
        if bits == 64:
            get = lambda w: w.S[r] | (w.S[r + 1] << 32)  # noqa: E731
        else:
            get = lambda w: w.S[r]  # noqa: E731
    elif op.kind == "scc":
        get = lambda w: w.scc  # noqa: E731
    elif op.kind in ("const", "fconst"):
        c = const_bits(op, "b64" if bits == 64 else "b32")
        get = lambda w: c  # noqa: E731
    else:
        raise UnsupportedInstruction(f"scalar operand {op.text!r}")
    return R.read_checked(ins, i, get)


def sx(x, bits=32):
    """Signed value of an unsigned bits-wide int."""
    return x - (1 << bits) if x >> (bits - 1) & 1 else x


# (result, scc) functions of unsigned a, b (and scc for carries); scc None = unchanged.
def _nz(f, m=MASK32):
    return lambda a, b, c: ((r := f(a, b) & m), int(r != 0))


_BIN32 = {
    "s_add_u32": lambda a, b, c: ((a + b) & MASK32, (a + b) >> 32),
    "s_addc_u32": lambda a, b, c: ((a + b + c) & MASK32, (a + b + c) >> 32),
    "s_sub_u32": lambda a, b, c: ((a - b) & MASK32, int(b > a)),
    "s_subb_u32": lambda a, b, c: ((a - b - c) & MASK32, int(b + c > a)),
    "s_add_i32": lambda a, b, c: ((r := sx(a) + sx(b)) & MASK32, int(not -2**31 <= r < 2**31)),
    "s_sub_i32": lambda a, b, c: ((r := sx(a) - sx(b)) & MASK32, int(not -2**31 <= r < 2**31)),
    "s_mul_i32": lambda a, b, c: ((a * b) & MASK32, None),
    "s_mul_hi_u32": lambda a, b, c: ((a * b) >> 32, None),
    "s_mul_hi_i32": lambda a, b, c: (((sx(a) * sx(b)) >> 32) & MASK32, None),
    "s_lshl_b32": _nz(lambda a, b: a << (b & 31)),
    "s_lshr_b32": _nz(lambda a, b: a >> (b & 31)),
    "s_ashr_i32": _nz(lambda a, b: sx(a) >> (b & 31)),
    "s_and_b32": _nz(lambda a, b: a & b), "s_or_b32": _nz(lambda a, b: a | b),
    "s_xor_b32": _nz(lambda a, b: a ^ b), "s_andn2_b32": _nz(lambda a, b: a & ~b),
    "s_orn2_b32": _nz(lambda a, b: a | ~b), "s_nand_b32": _nz(lambda a, b: ~(a & b)),
    "s_nor_b32": _nz(lambda a, b: ~(a | b)), "s_xnor_b32": _nz(lambda a, b: ~(a ^ b)),
    "s_min_i32": lambda a, b, c: (a if sx(a) < sx(b) else b, int(sx(a) < sx(b))),
    "s_min_u32": lambda a, b, c: (min(a, b), int(a < b)),
    "s_max_i32": lambda a, b, c: (a if sx(a) > sx(b) else b, int(sx(a) > sx(b))),
    "s_max_u32": lambda a, b, c: (max(a, b), int(a > b)),
    "s_cselect_b32": lambda a, b, c: (a if c else b, None),
    "s_bfm_b32": lambda a, b, c: ((((1 << (a & 31)) - 1) << (b & 31)) & MASK32, None),
    "s_bfe_u32": _nz(lambda a, b: (a >> (b & 31)) & ((1 << ((b >> 16) & 0x7F)) - 1)),
    "s_bfe_i32": _nz(lambda a, b: _sbfe(a, b, 32)),
    "s_absdiff_i32": _nz(lambda a, b: abs(sx(a) - sx(b))),
    "s_pack_ll_b32_b16": lambda a, b, c: ((a & 0xFFFF) | ((b & 0xFFFF) << 16), None),
    "s_pack_lh_b32_b16": lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF0000), None),
    "s_pack_hh_b32_b16": lambda a, b, c: ((a >> 16) | (b & 0xFFFF0000), None),
    **{f"s_lshl{n}_add_u32": (lambda n: lambda a, b, c: (((a << n) + b) & MASK32, ((a << n) + b) >> 32))(n)
       for n in (1, 2, 3, 4)},
}
_BIN64 = {
    "s_and_b64": _nz(lambda a, b: a & b, MASK64), "s_or_b64": _nz(lambda a, b: a | b, MASK64),
    "s_xor_b64": _nz(lambda a, b: a ^ b, MASK64), "s_andn2_b64": _nz(lambda a, b: a & ~b, MASK64),
    "s_orn2_b64": _nz(lambda a, b: a | ~b, MASK64), "s_nand_b64": _nz(lambda a, b: ~(a & b), MASK64),
    "s_nor_b64": _nz(lambda a, b: ~(a | b), MASK64), "s_xnor_b64": _nz(lambda a, b: ~(a ^ b), MASK64),
    "s_cselect_b64": lambda a, b, c: (a if c else b, None),
    "s_bfm_b64": lambda a, b, c: ((((1 << (a & 63)) - 1) << (b & 63)) & MASK64, None),
    "s_mul_u64": lambda a, b, c: ((a * b) & MASK64, None),
}
# shifts and bfe with a 64-bit value and 32-bit amount
_SHIFT64 = {
    "s_lshl_b64": _nz(lambda a, b: a << (b & 63), MASK64),
    "s_lshr_b64": _nz(lambda a, b: a >> (b & 63), MASK64),
    "s_ashr_i64": _nz(lambda a, b: sx(a, 64) >> (b & 63), MASK64),
    "s_bfe_u64": _nz(lambda a, b: (a >> (b & 63)) & ((1 << ((b >> 16) & 0x7F)) - 1), MASK64),
    "s_bfe_i64": _nz(lambda a, b: _sbfe(a, b, 64), MASK64),
}


def _sbfe(a, b, bits):
    off, width = b & (bits - 1), (b >> 16) & 0x7F
    if width == 0:
        return 0
    return sx((a >> off) & ((1 << width) - 1), width)


def _ff1(x, bits):
    return (x & -x).bit_length() - 1 if x else MASK32


_UN = {  # name: (src bits, dst bits, f, sets scc on nonzero)
    "s_mov_b32": (32, 32, lambda a: a, False), "s_mov_b64": (64, 64, lambda a: a, False),
    "s_not_b32": (32, 32, lambda a: ~a & MASK32, True), "s_not_b64": (64, 64, lambda a: ~a & MASK64, True),
    "s_brev_b32": (32, 32, lambda a: int(f"{a:032b}"[::-1], 2), False),
    "s_brev_b64": (64, 64, lambda a: int(f"{a:064b}"[::-1], 2), False),
    "s_bcnt1_i32_b32": (32, 32, lambda a: bin(a).count("1"), True),
    "s_bcnt1_i32_b64": (64, 32, lambda a: bin(a).count("1"), True),
    "s_bcnt0_i32_b32": (32, 32, lambda a: 32 - bin(a).count("1"), True),
    "s_ff1_i32_b32": (32, 32, lambda a: _ff1(a, 32), False),
    "s_ff1_i32_b64": (64, 32, lambda a: _ff1(a, 64), False),
    "s_flbit_i32_b32": (32, 32, lambda a: 32 - a.bit_length() if a else MASK32, False),
    "s_flbit_i32_b64": (64, 32, lambda a: 64 - a.bit_length() if a else MASK32, False),
    "s_sext_i32_i8": (32, 32, lambda a: sx(a & 0xFF, 8) & MASK32, False),
    "s_sext_i32_i16": (32, 32, lambda a: sx(a & 0xFFFF, 16) & MASK32, False),
    "s_abs_i32": (32, 32, lambda a: abs(sx(a)) & MASK32, True),
}
# saveexec: new EXEC from (s0, exec); D = old EXEC (or new for *_wrexec)
_SAVEEXEC = {
    "and": lambda s, e: s & e, "or": lambda s, e: s | e, "xor": lambda s, e: s ^ e,
    "andn2": lambda s, e: s & ~e, "orn2": lambda s, e: s | ~e, "nand": lambda s, e: ~(s & e),
    "nor": lambda s, e: ~(s | e), "xnor": lambda s, e: ~(s ^ e), "andn1": lambda s, e: ~s & e,
    "orn1": lambda s, e: ~s | e,
}
_CMP = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def _binop(ins, f, bits_a, bits_b, bits_d, scc_in=False):
    a, b, d = sget(ins, 1, bits_a), sget(ins, 2, bits_b), R.sdst(ins, 0, bits_d)

    def run(w):
        r, c = f(a(w), b(w), w.scc)
        d(w, r)
        if c is not None:
            w.scc = c
    return run


for _n, _f in _BIN32.items():
    handler(_n, scalar=True)(lambda ins, f=_f: _binop(ins, f, 32, 32, 32))
for _n, _f in _BIN64.items():
    handler(_n, scalar=True)(lambda ins, f=_f: _binop(ins, f, 64, 64, 64))
for _n, _f in _SHIFT64.items():
    handler(_n, scalar=True)(lambda ins, f=_f: _binop(ins, f, 64, 32, 64))


def _unop(ins, bs, bd, f, nz):
    a, d = sget(ins, 1, bs), R.sdst(ins, 0, bd)

    def run(w):
        r = f(a(w))
        d(w, r)
        if nz:
            w.scc = int(r != 0)
    return run


for _n, (_bs, _bd, _f, _z) in _UN.items():
    handler(_n, scalar=True)(lambda ins, bs=_bs, bd=_bd, f=_f, z=_z: _unop(ins, bs, bd, f, z))


@handler("s_cmov_b32", "s_cmov_b64", scalar=True)
def _cmov(ins):
    bits = 64 if ins.base.endswith("64") else 32
    a, d = sget(ins, 1, bits), R.sdst(ins, 0, bits)

    def run(w):
        if w.scc:
            d(w, a(w))
    return run


def _saveexec(ins, f, wrexec):
    bits = 32 if ins.mnemonic.endswith("_b32") else 64    # _b32: the wave32 forms
    a, d = sget(ins, 1, bits), R.sdst(ins, 0, bits)

    def run(w):
        old = w.exec
        new = f(a(w), old) & w.T.full
        w.set_exec(new)
        d(w, new if wrexec else old)
        w.scc = int(new != 0)
    return run


for _k, _f in _SAVEEXEC.items():
    handler(f"s_{_k}_saveexec_b64", scalar=True)(lambda ins, f=_f: _saveexec(ins, f, False))
handler("s_andn1_wrexec_b64", scalar=True)(lambda ins: _saveexec(ins, _SAVEEXEC["andn1"], True))
handler("s_andn2_wrexec_b64", scalar=True)(lambda ins: _saveexec(ins, _SAVEEXEC["andn2"], True))


def _cmp(ins, f, bits, signed):
    a, b = sget(ins, 0, bits), sget(ins, 1, bits)
    if signed:
        def run(w):
            w.scc = int(f(sx(a(w), bits), sx(b(w), bits)))
    else:
        def run(w):
            w.scc = int(f(a(w), b(w)))
    return run


for _c, _f in _CMP.items():
    for _t in ("i32", "u32"):
        handler(f"s_cmp_{_c}_{_t}", scalar=True)(lambda ins, f=_f, t=_t: _cmp(ins, f, 32, t == "i32"))
    handler(f"s_cmp_{_c}_u64", scalar=True)(lambda ins, f=_f: _cmp(ins, f, 64, False))


def _cmpk(ins, f, signed):
    a = sget(ins, 0)
    k = ins.ops[1].value
    k = sx(k & 0xFFFF, 16) if signed else k & 0xFFFF

    def run(w):
        x = a(w)
        w.scc = int(f(sx(x) if signed else x, k))
    return run


for _c, _f in _CMP.items():
    handler(f"s_cmpk_{_c}_i32", scalar=True)(lambda ins, f=_f: _cmpk(ins, f, True))
    handler(f"s_cmpk_{_c}_u32", scalar=True)(lambda ins, f=_f: _cmpk(ins, f, False))


@handler("s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64", scalar=True)
def _bitcmp(ins):
    bits = 64 if ins.base.endswith("64") else 32
    a, b = sget(ins, 0, bits), sget(ins, 1)
    want = 1 if "cmp1" in ins.base else 0

    def run(w):
        w.scc = int(((a(w) >> (b(w) & (bits - 1))) & 1) == want)
    return run


@handler("s_bitset0_b32", "s_bitset1_b32", "s_bitset0_b64", "s_bitset1_b64", scalar=True)
def _bitset(ins):
    bits = 64 if ins.base.endswith("64") else 32
    d, dget, b = R.sdst(ins, 0, bits), sget(ins, 0, bits), sget(ins, 1)
    one = "set1" in ins.base

    def run(w):
        bit = 1 << (b(w) & (bits - 1))
        d(w, dget(w) | bit if one else dget(w) & ~bit)
    return run


@handler("s_movk_i32", "s_cmovk_i32", "s_addk_i32", "s_mulk_i32", scalar=True)
def _simm16(ins):
    k = sx(ins.ops[1].value & 0xFFFF, 16)
    d, cur = R.sdst(ins, 0), sget(ins, 0)
    op = ins.base

    def run(w):
        if op == "s_movk_i32":
            d(w, k & MASK32)
        elif op == "s_cmovk_i32":
            if w.scc:
                d(w, k & MASK32)
        elif op == "s_addk_i32":
            r = sx(cur(w)) + k
            d(w, r & MASK32)
            w.scc = int(not -2**31 <= r < 2**31)
        else:
            d(w, (sx(cur(w)) * k) & MASK32)
    return run


# ---------------------------------------------------------------------------- program control

@handler("s_branch")
def _branch(ins):
    t = ins.target

    def run(w):
        w.pc = t
    return run


_COND = {"s_cbranch_scc0": lambda v, h: lambda w: not w.scc, "s_cbranch_scc1": lambda v, h: lambda w: w.scc,
         "s_cbranch_vccz": lambda v, h: lambda w: not (w.S[v] | w.S[h]),
         "s_cbranch_vccnz": lambda v, h: lambda w: w.S[v] | w.S[h],
         "s_cbranch_execz": lambda v, h: lambda w: not w.exec, "s_cbranch_execnz": lambda v, h: lambda w: w.exec}


def _cbranch(ins, cond):
    t = ins.target
    T = ins.prog.target
    cond = cond(T.vcc, T.vcc + T.sgprs["vcc"][1] - 1)     # VCC is one SGPR in wave32

    def run(w):
        if cond(w):
            w.pc = t
    return run


for _n, _f in _COND.items():
    handler(_n)(lambda ins, f=_f: _cbranch(ins, f))


@handler("s_endpgm")
def _endpgm(ins):
    def run(w):
        w.stop = w.done = True
    return run


@handler("s_barrier")
def _barrier(ins):
    def run(w):
        if w.race:
            race.at_barrier(w)
        w.stop = True
    return run


def _nop(ins):
    return lambda w: None


for _n in ("s_nop", "s_setprio", "s_sleep", "s_icache_inv", "s_dcache_wb", "s_dcache_inv", "s_sendmsg",
           "s_sendmsghalt", "s_ttracedata", "s_denorm_mode", "s_round_mode", "s_setreg_b32",
           "s_setreg_imm32_b32", "s_set_gpr_idx_off", "s_wakeup", "s_waitcnt_expcnt", "s_buffer_wbinvl1",
           "buffer_wbl2", "buffer_inv", "buffer_wbinvl1_vol", "buffer_wbinvl1", "s_dcache_wb_vol",
           "s_dcache_inv_vol"):
    handler(_n)(_nop)


_HWREG = re.compile(r"hwreg\((\w+)(?:,\s*(\d+),\s*(\d+))?\)")


def ib_sts2(ttmp6: int) -> int:
    """gfx1250's HW_REG_IB_STS2 cluster fields, from the cluster fields of ttmp6: bits 9:6 the
    cluster's workgroup count - 1 (0: no cluster), 24:21 this workgroup's flat id in it
    (docs/gfx1250_emulator.md §1)."""
    x, y, z = ttmp6 & 15, ttmp6 >> 4 & 15, ttmp6 >> 8 & 15
    cx, cy = (ttmp6 >> 12 & 15) + 1, (ttmp6 >> 16 & 15) + 1
    return (ttmp6 >> 24 & 15) << 6 | (x + cx * (y + cy * z)) << 21


# gfx12's 64-bit shader cycle counter as two registers: clang 22 reads it for gfx1200 as HI, LO,
# HI again and keeps LO only if HI did not change (docs/gfx1250_emulator.md §6)
_CYCLES = {"HW_REG_SHADER_CYCLES_LO": lambda c: c & MASK32, "HW_REG_SHADER_CYCLES_HI": lambda c: c >> 32 & MASK32}


@handler("s_getreg_b32", scalar=True)
def _getreg(ins):
    """HW_REG_IB_STS2 on targets with architected cluster ids (code reads its cluster fields to
    form workgroup ids); the shader cycle counter's halves (the emulator's clock); other registers
    (HW_ID and the like, read for diagnostics) read 0."""
    d = R.sdst(ins, 0)
    m = _HWREG.fullmatch(ins.ops[1].text) if len(ins.ops) > 1 else None
    off, size = (int(m.group(2)), int(m.group(3))) if m and m.group(2) else (0, 32)
    field = (1 << size) - 1
    if m and m.group(1) in _CYCLES:
        half = _CYCLES[m.group(1)]
        return lambda w: d(w, half(clock(w)) >> off & field)
    if m is None or m.group(1) != "HW_REG_IB_STS2" or not ins.prog.target.ttmp_ids:
        return lambda w: d(w, 0)
    ttmp6 = ins.prog.target.sgprs["ttmp6"][0]
    return lambda w: d(w, ib_sts2(w.S[ttmp6]) >> off & field)


@handler("s_trap")
def _trap(ins):
    def run(w):
        raise EmulatorFault("s_trap executed (kernel abort/assert)")
    return run


@handler("s_waitcnt")
def _waitcnt(ins):
    text = ins.text.split(";")[0]
    vm = lgkm = None
    if "cnt(" in text:
        for tok in text.replace("&", " ").split()[1:]:
            if tok.startswith("vmcnt("):
                vm = int(tok[6:tok.index(")")], 0)
            elif tok.startswith("lgkmcnt("):
                lgkm = int(tok[8:tok.index(")")], 0)
    elif ins.ops and ins.ops[0].kind == "const":   # raw simm16
        vm, lgkm = ins.prog.target.decode_waitcnt(ins.ops[0].value)
    return wait_closure([(i, n) for i, n in enumerate((vm, lgkm)) if n is not None])


def wait_closure(waits):
    """Closure retiring outstanding ops: waits lists (counter index, count) of the target."""
    def run(w):
        if w.race:
            for i, n in waits:
                race.waitcnt(w, i, n)
    return run


@handler("s_waitcnt_vmcnt", "s_waitcnt_lgkmcnt")
def _waitcnt_sep(ins):
    n = ins.ops[-1].value & 0xFFFF if ins.ops[-1].kind == "const" else 0
    return wait_closure([(0 if "vmcnt" in ins.base else 1, n)])


# ---------------------------------------------------------------------------- scalar memory

_ONE = np.ones(1, bool)   # scalar loads: one "lane"


def _smem_offset(ins, first):
    """Getter of the byte offset: imm, sgpr, or 'sN offset:imm'."""
    parts = [sget(ins, i) for i in range(first, len(ins.ops))]
    imm = ins.mods.get("offset", 0)
    return lambda w: sum(p(w) for p in parts) + imm


@handler("s_load_dword", "s_load_dwordx2", "s_load_dwordx3", "s_load_dwordx4", "s_load_dwordx8", "s_load_dwordx16",
         "s_buffer_load_dword", "s_buffer_load_dwordx2", "s_buffer_load_dwordx3", "s_buffer_load_dwordx4",
         "s_buffer_load_dwordx8", "s_buffer_load_dwordx16")
def _sload(ins):
    n = ins.ops[0].count
    r = ins.ops[0].index
    buf = ins.base.startswith("s_buffer")
    base = R.read_checked(ins, 1, (lambda w, i=ins.ops[1].index: w.S[i:i + 4]))
    off = _smem_offset(ins, 2)
    keys = R.reg_keys(ins, 0)

    def load(w, b, o):
        if buf:   # V# (the target's layout); out-of-range dwords read 0
            vbase, _, nrec, _, _ = w.T.vsharp(b)
            addr = vbase + (o & ~3)
            vals = w.emu.mem.load(np.array([addr], u64), _ONE, 4 * n)[0].view(u32) if o < nrec else \
                np.zeros(n, u32)
            return [int(v) if o + 4 * j < nrec else 0 for j, v in enumerate(vals)]
        addr = ((b[0] | (b[1] << 32)) + o) & ~3 & MASK64
        return w.emu.mem.load(np.array([addr], u64), _ONE, 4 * n)[0].view(u32).tolist()

    def run(w):
        try:
            vals = load(w, base(w), off(w))
        except Split:      # an address SGPR differs between the waves of the unit: one load per wave
            if w.k == 1:
                raise
            per = [load(w, base(v), off(v)) for v in scalar_views(w)]
            vals = [PerWave.of([p[j] for p in per]) for j in range(n)]
        if w.race and w.pend:
            race.check_pending(w, keys, ins, "overwrites")
        w.S[r:r + n] = vals
        race.track_load(w, ins, "lgkm", keys, "smem")
    return run


def clock(w) -> int:
    """The emulator's clock: wave-instructions the launch has issued before this one (a lockstep
    unit of k waves issues k per instruction). It has no cycles, so every time counter reads
    this: monotonic, and a wave's two reads bracketing N instructions differ by at least N + 1
    (exactly that in a launch of one wave; docs/gfx1250_emulator.md §6)."""
    return sum(w.emu.launch_execs)


@handler("s_memtime", "s_memrealtime", "s_get_shader_cycles_u64")
def _memtime(ins):
    d = R.sdst(ins, 0, 64)
    return lambda w: d(w, clock(w))


@handler("s_getpc_b64")
def _getpc(ins):
    """D = the address of the next instruction (pc.CodeAddresses: the emulator's numbering)."""
    d = R.sdst(ins, 0, 64)
    pc = ins.prog.code.of(ins.index + 1)
    return lambda w: d(w, pc)


def jump(w, code, addr):
    """Continue at code address addr; an address that is not an instruction's faults."""
    w.pc = code.index(addr, w.kernel)


@handler("s_swappc_b64")
def _swappc(ins):
    """D = the next instruction's address (as s_getpc_b64), then jump to S0 (as s_setpc_b64)."""
    d, a = R.sdst(ins, 0, 64), sget(ins, 1, 64)
    code = ins.prog.code
    pc = code.of(ins.index + 1)

    def run(w):
        target = a(w)
        d(w, pc)
        jump(w, code, target)
    return run


@handler("s_setpc_b64")
def _setpc(ins):
    a, code = sget(ins, 0, 64), ins.prog.code
    return lambda w: jump(w, code, a(w))
