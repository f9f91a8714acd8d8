"""gfx1250 (MI450-class, gfx12.5): gfx10+ scalar register numbering, split wait counters,
split barriers (s_barrier_signal / s_barrier_wait), workgroup ids in ttmp registers
(docs/gfx1250_emulator.md; the wave and LDS sizes are mxgemm.hardware.ARCH_LIMITS's).

Most gfx1250 instructions are gfx9 ones under gfx12 names (global_load_b32 = global_load_dword,
ds_load_b32 = ds_read_b32, s_add_co_i32 = s_add_i32, ...): the handler table maps such a
mnemonic onto the gfx9 builder, after fixing the operands that changed (v_cmpx writes only EXEC,
the implicit VCC of a dual-issue v_cndmask, the return flag of atomics). Builders of gfx12-only
instructions live in ``isa.GFX12`` (this module, ``wmma``, ``tdm``)."""
from __future__ import annotations

import re

import numpy as np

from . import float_atomics, mxcvt, race, salu, tdm, valu, vmem, wmma  # noqa: F401  (tdm, wmma fill GFX12)  # noqa: F401  (fill GFX9)
from . import regs as R
from .isa import GFX9, GFX12, Operand, RaceError, UnsupportedInstruction, f32, parse_operand, u32, u64
from .target import Target

SGPRS = {"vcc": (106, 1), "vcc_lo": (106, 1), "vcc_hi": (107, 1), "null": (124, 1), "m0": (125, 1),
         "exec": (126, 1), "exec_lo": (126, 1), "exec_hi": (127, 1),
         **{f"ttmp{i}": (108 + i, 1) for i in range(16)}}

# ASYNCcnt: the async global <-> LDS copies count on it; the emulator has no handler for them
# yet, so s_wait_asynccnt has nothing outstanding to wait for
COUNTERS = ("load", "store", "ds", "km", "tensor", "async")


def _route(counter, kind):
    """Memory class and kind -> gfx12 wait counter: vector memory splits into loads (and
    returning atomics) and stores; LDS vs scalar memory; the tensor data mover has its own."""
    if counter == "vm":
        return "store" if kind == "store" else "load"
    if counter == "lgkm":
        return "km" if kind == "smem" else "ds"
    return counter


# ---------------------------------------------------------------------------- gfx12 -> gfx9 names

_VMEM_SIZE = {"b32": "dword", "b64": "dwordx2", "b96": "dwordx3", "b128": "dwordx4", "u8": "ubyte",
              "i8": "sbyte", "u16": "ushort", "i16": "sshort", "b8": "byte", "b16": "short",
              "d16_b16": "short_d16", "d16_hi_b16": "short_d16_hi", "d16_u8": "ubyte_d16",
              "d16_hi_u8": "ubyte_d16_hi", "d16_i8": "sbyte_d16", "d16_hi_i8": "sbyte_d16_hi",
              "d16_hi_b8": "byte_d16_hi"}
_ATOMIC = {"add_u32": "add", "sub_u32": "sub", "min_i32": "smin", "max_i32": "smax", "min_u32": "umin",
           "max_u32": "umax", "and_b32": "and", "or_b32": "or", "xor_b32": "xor", "swap_b32": "swap",
           "inc_u32": "inc", "dec_u32": "dec", "add_u64": "add_x2", "swap_b64": "swap_x2",
           "max_i64": "smax_x2", "max_u64": "umax_x2", "min_i64": "smin_x2", "min_u64": "umin_x2",
           "sub_u64": "sub_x2", "and_b64": "and_x2", "or_b64": "or_x2", "xor_b64": "xor_x2", "inc_u64": "inc_x2",
           "dec_u64": "dec_x2", "cmpswap_b32": "cmpswap", "cmpswap_b64": "cmpswap_x2", "max_num_f64": "max_f64",
           "min_num_f64": "min_f64"}
_DS_PAIR = {"": "", "2addr_": "2", "2addr_stride64_": "2st64"}
_RENAME = {"s_add_co_u32": "s_add_u32", "s_add_co_ci_u32": "s_addc_u32", "s_sub_co_u32": "s_sub_u32",
           "s_sub_co_ci_u32": "s_subb_u32", "s_add_co_i32": "s_add_i32", "s_sub_co_i32": "s_sub_i32",
           "v_add_nc_u32": "v_add_u32", "v_sub_nc_u32": "v_sub_u32", "v_subrev_nc_u32": "v_subrev_u32",
           "v_add_co_ci_u32": "v_addc_co_u32", "v_sub_co_ci_u32": "v_subb_co_u32",
           "v_subrev_co_ci_u32": "v_subbrev_co_u32", "v_cls_i32": "v_ffbh_i32", "v_clz_i32_u32": "v_ffbh_u32",
           "v_ctz_i32_b32": "v_ffbl_b32", "v_mad_nc_u64_u32": "v_mad_u64_u32", "v_mad_nc_i64_i32": "v_mad_i64_i32",
           "v_bitop2_b32": "v_bitop3_b32", "ds_storexchg_rtn_b32": "ds_wrxchg_rtn_b32",
           "v_dot2acc_f32_f16": "v_dot2c_f32_f16", "s_addk_co_i32": "s_addk_i32",
           "s_get_pc_i64": "s_getpc_b64", "s_set_pc_i64": "s_setpc_b64", "s_swap_pc_i64": "s_swappc_b64",
           "global_load_addtid_b32": "global_load_dword_addtid", "global_store_addtid_b32": "global_store_dword_addtid",
           # a trap handler's return: PC = S0 (the ISA's S_RFE_B64); the emulator has no trap mode to leave
           "s_rfe_i64": "s_setpc_b64",
           # the data a cluster load broadcasts to the cluster's waves that issue it is, for each
           # of them, what a global load of its own address returns (docs/gfx1250_emulator.md §5)
           "cluster_load_b32": "global_load_dword", "cluster_load_b64": "global_load_dwordx2",
           "cluster_load_b128": "global_load_dwordx4"}
_NOT = {"and_not1": "andn2", "or_not1": "orn2", "and_not0": "andn1", "or_not0": "orn1"}


def gfx9_name(base: str) -> str:
    """The gfx9 mnemonic of the same instruction (base itself when the name did not change)."""
    if base.startswith("v_dual_"):
        base = "v_" + base[len("v_dual_"):]
    if base in _RENAME:
        return _RENAME[base]
    m = re.fullmatch(r"(global|flat|buffer|scratch)_(load|store)_(.*)", base)
    if m and m[3] in _VMEM_SIZE:
        return f"{m[1]}_{m[2]}_{_VMEM_SIZE[m[3]]}"
    m = re.fullmatch(r"(global|flat|buffer)_atomic_(.*)", base)
    if m and m[2] in _ATOMIC:
        return f"{m[1]}_atomic_{_ATOMIC[m[2]]}"
    m = re.fullmatch(r"ds_(load|store)_(2addr_stride64_|2addr_)?(.*)", base)
    if m:
        return f"ds_{'read' if m[1] == 'load' else 'write'}{_DS_PAIR[m[2] or '']}_{m[3]}"
    m = re.fullmatch(r"s_(buffer_)?load_b(\d+)", base)
    if m:
        n = int(m[2]) // 32
        return f"s_{m[1] or ''}load_dword{'x' + str(n) if n > 1 else ''}"
    m = re.fullmatch(r"s_(and_not1|or_not1|and_not0|or_not0)_(.*)", base)
    if m:
        base = f"s_{_NOT[m[1]]}_{m[2]}"
    m = re.fullmatch(r"(s_\w+_(?:saveexec|wrexec))_b32", base)   # width from the mnemonic (salu)
    if m:
        return m[1] + "_b64"
    return re.sub(r"^(v|ds)_(max|min)_num_", r"\1_\2_", base)


def _parse(text):
    return parse_operand(text, SGPRS)


def _fix(ins, name):
    """Operand changes between the gfx12 form and the gfx9 builder's."""
    b = ins.base
    if b.startswith("v_cmpx_"):                   # gfx10+: writes EXEC only, no SGPR destination
        ins.ops.insert(0, _parse("exec_lo"))
    elif b == "v_dual_cndmask_b32":                # VOPD: the lane mask is VCC, implicitly
        ins.ops.append(_parse("vcc_lo"))
    elif b in ("v_dual_bitop2_b32", "v_bitop2_b32"):   # two sources: the third is 0
        ins.ops.append(Operand("const", value=0, text="0"))
    elif b.startswith(("v_mad_nc_", "v_mad_co_")) and len(ins.ops) == 4:   # no carry out
        ins.ops.insert(1, _parse("null"))
    th = ins.mods.get("th", "")
    if "_atomic_" in b and isinstance(th, str) and "RETURN" in th:
        ins.mods["glc"] = True
    if "byte_sel" in ins.mods:                     # v_cvt_f32_fp8 byte_sel:N -> the gfx9 op_sel
        n = ins.mods["byte_sel"]
        ins.mods["op_sel"] = [n & 1, n >> 1 & 1, 0, 0]
    ins.base = name


class Gfx12Handlers:
    """Handler lookup of gfx1250: GFX12 builders first, then GFX9 ones under the gfx9 name."""

    def builder(self, ins):
        own = GFX12.get(ins.base) or GFX12.get(ins.mnemonic)
        if own is not None:
            return own
        name = gfx9_name(ins.base)
        b = GFX9.get(name)
        if b is None:
            return None

        def build(ins):
            _fix(ins, name)
            return b(ins)
        return build


handler = GFX12.register


# ---------------------------------------------------------------------------- waits and barriers

def _waits(ins, names):
    """s_wait_<a>_<b> simm16: b (always dscnt) in bits [5:0], a in [13:8]; one counter: the value."""
    v = ins.ops[0].value if ins.ops and ins.ops[0].kind == "const" else 0
    vals = [v] if len(names) == 1 else [(v >> 8) & 0x3F, v & 0x3F]
    return [(COUNTERS.index(n), c) for n, c in zip(names, vals)]


for _c in COUNTERS:
    handler(f"s_wait_{_c}cnt")(lambda ins, c=_c: salu.wait_closure(_waits(ins, [c])))
for _a in ("load", "store"):
    handler(f"s_wait_{_a}cnt_dscnt")(lambda ins, a=_a: salu.wait_closure(_waits(ins, [a, "ds"])))


WORKGROUP_BARRIER, CLUSTER_BARRIER = -1, -3


def _barrier_id(ins, ops=None):
    """The workgroup barrier (-1) and, in cluster launches, the cluster barrier (-3) are
    modelled; named barriers raise. ops: the operands from the barrier id on (default all)."""
    ops = ins.ops if ops is None else ops
    bid = ops[0].value if ops and ops[0].kind == "const" else None
    if bid not in (WORKGROUP_BARRIER, CLUSTER_BARRIER):
        raise UnsupportedInstruction(f"barrier {ops[0].text if ops else '?'} (only the workgroup barrier -1 "
                                     f"and the cluster barrier -3 are modelled): {ins.where()}")
    return bid


def _cluster_of(w, ins):
    if w.wg.cluster is None:
        raise UnsupportedInstruction(f"cluster barrier in a launch without clusters (no .cluster_dims): "
                                     f"{ins.where()}")


@handler("s_barrier_signal")
def _barrier_signal(ins):
    """Arrive at the workgroup barrier (s_barrier_wait then waits for the others); LDS writes
    not yet retired by s_wait_dscnt are not guaranteed visible after it (race.at_barrier).
    -3: this workgroup arrives at the cluster barrier (one wave signals for it)."""
    if _barrier_id(ins) == CLUSTER_BARRIER:
        def run_cluster(w):
            _cluster_of(w, ins)
            w.wg.cluster_signals += w.k
        return run_cluster

    def run(w):
        if w.signaled:
            raise RaceError("s_barrier_signal again before s_barrier_wait: barriers of the waves no longer match")
        w.signaled = True
        g = w.wg
        if w.k == 1:
            g.signals[w.wid // g.nwaves] += 1
        else:
            np.add.at(g.signals, (w.wid + np.arange(w.k)) // g.nwaves, 1)
        if w.race:
            race.at_barrier(w)
    return run


@handler("s_barrier_wait")
def _barrier_wait(ins):
    """-1: wait for the workgroup's waves; -3: for every workgroup of the cluster (wave.run_cluster)."""
    cluster = _barrier_id(ins) == CLUSTER_BARRIER

    def run(w):
        if cluster:
            _cluster_of(w, ins)
            w.cluster_wait = True
        elif not w.signaled:
            raise RaceError("s_barrier_wait without s_barrier_signal: the workgroup barrier would never complete")
        w.signaled = False
        if w.race:
            race.at_barrier(w)
        w.stop = True
    return run


# Barrier state (s_get_barrier_state, s_sendmsg_rtn MSG_RTN_GET_CLUSTER_BARRIER_STATE): the
# fields the Linux amdgpu gfx12 context-switch trap handler reads (valid bit 0, member count
# 10:4, signal count 22:16; docs/gfx1250_emulator.md §6).
_BARRIER_VALID, _BARRIER_MEMBERS, _BARRIER_SIGNALS = 0, 4, 16


def barrier_state(w, bid):
    """-1: the workgroup barrier, its members the workgroup's waves. -3: the cluster barrier,
    its members the cluster's workgroups (one wave signals for each), valid only in a cluster
    launch (the trap handler reads a clear valid bit as "not in a cluster"). A barrier completes
    when every member has signalled, so the signal count is the signals since the last
    completion: modulo the members."""
    if bid == WORKGROUP_BARRIER:
        g = w.wg
        members, signals = g.nwaves, int(g.signals[w.wid // g.nwaves])
    elif w.wg.cluster is None:
        return 0
    else:
        members, signals = len(w.wg.cluster), sum(1 for g in w.wg.cluster if g.cluster_signals)
    return 1 << _BARRIER_VALID | members << _BARRIER_MEMBERS | signals % members << _BARRIER_SIGNALS


@handler("s_get_barrier_state", per_wave=True)
def _get_barrier_state(ins):
    bid = _barrier_id(ins, ins.ops[1:])
    d = R.sdst(ins, 0)
    return lambda w: d(w, barrier_state(w, bid))


# s_sendmsg_rtn message ids (LLVM's SIDefines.h ID_RTN_*; the assembler encodes these numbers)
MSG_RTN = {"MSG_RTN_GET_DOORBELL": 128, "MSG_RTN_GET_DDID": 129, "MSG_RTN_GET_TMA": 130,
           "MSG_RTN_GET_REALTIME": 131, "MSG_RTN_SAVE_WAVE": 132, "MSG_RTN_GET_TBA": 133,
           "MSG_RTN_GET_TBA_TO_PC": 134, "MSG_RTN_GET_SE_AID_ID": 135, "MSG_RTN_GET_CLUSTER_BARRIER_STATE": 136}
_MSG = re.compile(r"sendmsg\((\w+)(?:\s*,[^)]*)?\)")


@handler("s_sendmsg_rtn_b32", "s_sendmsg_rtn_b64", per_wave=True)
def _sendmsg_rtn(ins):
    """Messages with a meaning in the emulator: the realtime counter (its clock, salu.clock)
    and the cluster barrier's state; the others (doorbell, dispatch, trap base addresses, wave
    save, SE / AID ids) name hardware the emulator does not have, so they raise."""
    op = ins.ops[1]
    m = _MSG.fullmatch(op.text.replace(" ", ""))
    if m:                        # sendmsg(NAME) or sendmsg(number, ...)
        msg = int(m.group(1)) if m.group(1).isdigit() else MSG_RTN.get(m.group(1))
    else:
        msg = op.value if op.kind == "const" else None
    names = {v: k for k, v in MSG_RTN.items()}
    if msg == MSG_RTN["MSG_RTN_GET_REALTIME"]:
        f = salu.clock
    elif msg == MSG_RTN["MSG_RTN_GET_CLUSTER_BARRIER_STATE"]:
        def f(w):
            return barrier_state(w, CLUSTER_BARRIER)
    else:
        raise UnsupportedInstruction(f"{ins.base} message {names.get(msg, op.text)}: only MSG_RTN_GET_REALTIME and "
                                     f"MSG_RTN_GET_CLUSTER_BARRIER_STATE have a meaning in the emulator: {ins.where()}")
    d = R.sdst(ins, 0, 64 if ins.base.endswith("b64") else 32)
    mask = (1 << (64 if ins.base.endswith("b64") else 32)) - 1
    return lambda w: d(w, f(w) & mask)


@handler("s_add_pc_i64")
def _add_pc(ins):
    """PC = the next instruction's address + S0, a signed byte displacement: LLVM's long branch
    (SIInstrInfo::insertIndirectBranch) encodes the target minus the label after s_add_pc_i64.
    The kernel's code addresses are then its encodings', and a displacement over its labels and
    .set symbols is a constant by now (pc.code_addresses)."""
    if ins.ops[0].kind not in ("s", "const"):
        raise UnsupportedInstruction(f"s_add_pc_i64 displacement {ins.ops[0].text!r} is not an SGPR pair, a "
                                     f"constant or an expression over the kernel's labels: {ins.where()}")
    off, code = salu.sget(ins, 0, 64), ins.prog.code
    nxt = code.of(ins.index + 1)
    return lambda w: salu.jump(w, code, (nxt + salu.sx(off(w), 64)) & salu.MASK64)


def _block(ins, store):
    """global_load_block / global_store_block: the 32 VGPRs from the data operand, lane address +
    4 i for VGPR i, only the VGPRs whose M0 bit is set (docs/gfx1250_emulator.md §5)."""
    data = 1 if store else 0
    r, n = R.vidx(ins, ins.ops[data]), ins.ops[data].count
    addr = vmem._gaddr(ins, 1 - data, 2, 4)
    keys = R.reg_keys(ins, data)
    m0 = ins.prog.target.m0

    def run(w):
        bits = w.S[m0]
        sel = [i for i in range(n) if bits >> i & 1]
        if not sel:
            return
        mine = tuple(keys[i] for i in sel)
        if w.race and not w.pend.keys().isdisjoint(mine):
            race.check_pending(w, mine, ins, "reads" if store else "overwrites")
        a = addr(w)
        for i in sel:
            at = a + u64(4 * i)
            if store:
                w.emu.mem.store(at, w.mask, np.ascontiguousarray(w.V[r + i], u32).view(np.uint8).reshape(-1, 4))
            else:
                np.copyto(w.V[r + i], w.emu.mem.load(at, w.mask, 4).view(u32)[:, 0], where=w.mask)
        if store:
            race.track_load(w, ins, "vm", (), "store")
        else:
            race.track_load(w, ins, "vm", mine)
    return run


@handler("global_load_block", per_wave=True)
def _load_block(ins):
    """global_load_block vdst (32 VGPRs), vaddr, saddr: VGPR vdst + i of a lane takes the dword at
    its address + 4 i when bit i of M0 is set, and keeps its value (no memory read) when it is
    clear."""
    return _block(ins, store=False)


@handler("global_store_block", per_wave=True)
def _store_block(ins):
    """global_store_block vaddr, vsrc (32 VGPRs), saddr: the dword at a lane's address + 4 i takes
    VGPR vsrc + i when bit i of M0 is set; a clear bit writes nothing, and the next VGPR still goes
    4 bytes further."""
    return _block(ins, store=True)


# issue hints, cache controls and counters the emulator has nothing to model for (operands are
# read at issue, so s_wait_xcnt -- "address and data sent" -- never has anything to wait for;
# s_monitor_sleep, like s_sleep, only delays the wave, and a wave's delay changes no result here)
for _n in ("s_delay_alu", "s_clause", "s_wait_alu", "s_wait_xcnt", "s_wait_expcnt", "s_wait_samplecnt",
           "s_wait_bvhcnt", "s_set_vgpr_msb", "global_prefetch_b8", "s_prefetch_data", "s_prefetch_inst",
           "s_monitor_sleep", "global_inv", "global_wb", "global_wbinv", "s_wait_idle", "s_setprio_inc_wg"):
    handler(_n)(lambda ins: (lambda w: None))


# ---------------------------------------------------------------------------- new ALU instructions

@handler("v_mad_u32")
def _mad_u32(ins):
    return valu.build_valu(ins, "u32", "u32 u32 u32", lambda a, b, c: (np.asarray(a, u64) * b + c).astype(u32))


for _n, _f in {"v_add_nc_u64": lambda a, b: a + b, "v_sub_nc_u64": lambda a, b: a - b,
               "v_mul_u64": lambda a, b: a * b}.items():
    handler(_n)(lambda ins, f=_f: valu.build_valu(ins, "u64", "u64 u64", f))

_SF = {"s_add_f32": lambda a, b: a + b, "s_sub_f32": lambda a, b: a - b, "s_mul_f32": lambda a, b: a * b,
       "s_max_num_f32": np.fmax, "s_min_num_f32": np.fmin}


def _f32(x):
    return np.uint32(x).view(f32)


def _bits(x):
    return int(np.float32(x).view(u32))


for _n, _f in _SF.items():
    handler(_n)(lambda ins, f=_f: _sfloat(ins, lambda a, b: _bits(f(_f32(a), _f32(b)))))
handler("s_fmac_f32")(lambda ins: _sfloat(ins, lambda a, b, d: _bits(valu.fma32(_f32(a), _f32(b), _f32(d))), True))
_SCVT = {"s_cvt_f32_u32": lambda a: _bits(np.float32(a)), "s_cvt_f32_i32": lambda a: _bits(np.float32(salu.sx(a))),
         "s_cvt_u32_f32": lambda a: int(valu._cvt_i(_f32(a), u32, 0, 2**32 - 1)),
         "s_cvt_i32_f32": lambda a: int(valu._cvt_i(_f32(a), np.int32, -2**31, 2**31 - 1)) & 0xFFFFFFFF}
for _n, _f in _SCVT.items():
    handler(_n)(lambda ins, f=_f: _sfloat(ins, f))


def _sfloat(ins, f, acc=False):
    """SALU float op (gfx11.5+): unsigned 32-bit operand bits in, result bits out."""
    srcs = [salu.sget(ins, i) for i in range(1, len(ins.ops))] + ([salu.sget(ins, 0)] if acc else [])
    d = R.sdst(ins, 0)
    with np.errstate(all="ignore"):
        return lambda w: d(w, f(*[g(w) for g in srcs]))


_VS = {"v_s_rcp_f32": lambda a: np.float32(1) / a, "v_s_sqrt_f32": np.sqrt,
       "v_s_rsq_f32": lambda a: np.float32(1) / np.sqrt(a), "v_s_exp_f32": np.exp2, "v_s_log_f32": np.log2}
for _n, _f in _VS.items():
    handler(_n)(lambda ins, f=_f: _sfloat(ins, lambda a: _bits(f(_f32(a)))))


# Transcendentals. The ISA promises about 1 ULP for these (not a correctly rounded result), so
# the hardware's bits are not specified exactly; the emulator's choice: the float64 function of
# the exact input, rounded once (RNE) to the result type. bf16 results, like the gfx9 16-bit ops
# the emulator maps gfx12 ones onto, write the low half and zero the high half.
_TRANS = {"tanh": np.tanh, "rcp": lambda x: 1.0 / x, "sqrt": np.sqrt, "rsq": lambda x: 1.0 / np.sqrt(x),
          "log": np.log2, "exp": np.exp2}


def _trans(f, t):
    def run(x):
        with np.errstate(all="ignore"):
            return np.asarray(f(np.asarray(x, np.float64))).astype(t)
    return run


def _trans_bf16(f):
    def run(bits):
        with np.errstate(all="ignore"):
            return mxcvt.bf16_round(f(mxcvt.bf16_value(bits))).astype(np.uint16)
    return run


handler("v_tanh_f32")(lambda ins: valu.build_valu(ins, "f32", "f32", _trans(np.tanh, np.float32)))
handler("v_tanh_f16")(lambda ins: valu.build_valu(ins, "f16", "f16", _trans(np.tanh, np.float16)))
for _n, _f in _TRANS.items():
    handler(f"v_{_n}_bf16")(lambda ins, f=_f: valu.build_valu(ins, "u16", "bf16", _trans_bf16(f)))


@handler("v_pk_add_min_i16", "v_pk_add_max_i16", "v_pk_add_min_u16", "v_pk_add_max_u16")
def _pk_add_minmax(ins):
    """Per 16-bit half: min / max(S0 + S1, S2). The add wraps; with clamp it saturates to the
    type's range (the emulator's reading of the clamp bit, as for v_pk_add_i16; not checked
    against hardware)."""
    ty = ins.base[-3:]
    lo, hi = (-2**15, 2**15 - 1) if ty == "i16" else (0, 2**16 - 1)
    t = np.int16 if ty == "i16" else np.uint16
    pick = np.minimum if "_min_" in ins.base else np.maximum
    clamp = bool(ins.mods.pop("clamp", False))

    def fn(a, b, c):
        s = np.asarray(a, np.int64) + np.asarray(b, np.int64)
        s = np.clip(s, lo, hi) if clamp else s
        return pick(s.astype(t), np.asarray(c, t))
    return valu._build_pk(ins, ty, 3, fn)


@handler("s_add_nc_u64", "s_sub_nc_u64")
def _s64(ins):
    a, b, d = salu.sget(ins, 1, 64), salu.sget(ins, 2, 64), R.sdst(ins, 0, 64)
    sub = "sub" in ins.base
    return lambda w: d(w, (a(w) - b(w) if sub else a(w) + b(w)) & salu.MASK64)


def vsharp(s):
    """gfx12 V#: base [56:0], num_records [101:57] (bytes for raw buffers), stride [121:108]
    (docs/gfx1250_emulator.md §2). Thread-id add and swizzle are not modelled (0)."""
    lo, hi = s[0] | s[1] << 32, s[2] | s[3] << 32
    return lo & ((1 << 57) - 1), (hi >> 44) & 0x3FFF, ((lo >> 57) | (hi << 7)) & ((1 << 45) - 1), 0, 0


@handler("v_permlane16_b32", "v_permlanex16_b32", per_wave=True)
def _permlane16(ins):
    """Lane l of each row of 16 reads lane sel[l % 16] of its own row (permlane16) or of the other
    row of its 32-lane half (permlanex16); sel: sixteen 4-bit selects in {src1, src2} (lanes 0-7,
    8-15). op_sel:[fi, bound_ctrl]: fi reads disabled lanes too, bound_ctrl writes 0 instead
    of keeping the old value [RDNA ISA V_PERMLANE16_B32]."""
    x, s1, s2 = R.src(ins, 1, "u32"), salu.sget(ins, 2), salu.sget(ins, 3)
    old, put = R.src(ins, 0, "u32"), R.dst(ins, 0, "u32")
    fi, bc = (ins.mods.get("op_sel", [0, 0]) + [0, 0])[:2]
    cross = ins.base == "v_permlanex16_b32"
    lane = ins.prog.target.lane

    def run(w):
        sel = np.array([(s1(w) | s2(w) << 32) >> (4 * k) & 15 for k in range(16)])
        src = ((lane & ~15) ^ (16 if cross else 0)) + sel[lane & 15]
        v = np.broadcast_to(x(w), (w.n,))[src]
        ok = np.ones(w.n, bool) if fi else w.mask[src]
        put(w, np.where(ok, v, u32(0) if bc else np.broadcast_to(old(w), (w.n,))))
    return run


TARGET = Target("gfx1250", sgprs=SGPRS, counters=COUNTERS, route=_route,
                handlers=Gfx12Handlers(), vsharp=vsharp, ttmp_ids=True)
