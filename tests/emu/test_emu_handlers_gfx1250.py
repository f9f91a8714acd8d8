"""gfx1250 handlers added for coverage: DS and flat / global atomics, ds_append / ds_consume, PC instructions,
s_wait_asynccnt, v_tanh / bf16 transcendentals, v_pk_add_{min,max}_{i16,u16}, and the
16x16x64 fp8 / 16x16x4 f32 WMMAs. Expected values are worked out here from the ISA's rules
(inc wraps to 0 when old >= src; dec reloads src when old is 0 or above src; cmpstore / cmpswap
store src when memory equals cmp; cond_sub subtracts only without wrapping) or by numpy /
mxgemm.formats, never by the emulator."""
import math

import numpy as np
import pytest
from asm_wave import run

A = "gfx1250"
N = 32
L = np.arange(N, dtype=np.uint64)
M64 = (1 << 64) - 1


def halves(x):
    x = np.asarray(x, np.uint64)
    return (x & np.uint64(0xFFFFFFFF)).astype(np.uint32), (x >> np.uint64(32)).astype(np.uint32)


def join(lo, hi):
    return lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))


def inc(old, src):
    return 0 if old >= src else old + 1


def dec(old, src):
    return src if old == 0 or old > src else old - 1


# ---- DS atomics ------------------------------------------------------------------------------

def ds64(op, init, src, cmp=None):
    """Each lane owns the 8 bytes at 8 * lane: store init, run op (returning form), read back."""
    ins = {3: L * 8, 4: halves(init)[0], 5: halves(init)[1], 6: halves(src)[0], 7: halves(src)[1]}
    extra = ""
    if cmp is not None:
        ins.update({8: halves(cmp)[0], 9: halves(cmp)[1]})
        extra = ", v[8:9]"
    body = (f"ds_store_b64 v3, v[4:5]\n  s_wait_dscnt 0\n  ds_{op} v[10:11], v3, v[6:7]{extra}\n  s_wait_dscnt 0\n"
            f"  ds_load_b64 v[12:13], v3\n  s_wait_dscnt 0")
    out = run(A, body, ins, [10, 11, 12, 13], lds=8 * N)
    return join(out[10], out[11]), join(out[12], out[13])


EDGE64 = np.array([0, 1, 5, 6, 7, 2**32, 2**32 - 1, M64, M64 - 1, 100] * 4, np.uint64)[:N]
SRC64 = np.array([5, 5, 5, 5, 5, 2**32, 2**32, M64, M64, 0] * 4, np.uint64)[:N]


def test_ds_and_b64():
    a = np.array([0xF0F0_0000_FFFF_1234 * (i + 1) & M64 for i in range(N)], np.uint64)
    b = np.array([0x0FF0_FFFF_0F0F_FFFF ^ i for i in range(N)], np.uint64)
    old, now = ds64("and_rtn_b64", a, b)
    np.testing.assert_array_equal(old, a)
    np.testing.assert_array_equal(now, a & b)


@pytest.mark.parametrize("op,rule", [("inc_rtn_u64", inc), ("dec_rtn_u64", dec)])
def test_ds_inc_dec_u64_wrap(op, rule):
    old, now = ds64(op, EDGE64, SRC64)
    np.testing.assert_array_equal(old, EDGE64)
    np.testing.assert_array_equal(now, [rule(int(o), int(s)) for o, s in zip(EDGE64, SRC64)])
    # by hand: inc 5 (src 5) -> 0, inc 1 -> 2; dec 0 -> src, dec 6 (> 5) -> 5, dec 1 -> 0
    if op.startswith("inc"):
        assert int(now[2]) == 0 and int(now[1]) == 2 and int(now[7]) == 0 and int(now[6]) == 2**32
    else:
        assert int(now[0]) == 5 and int(now[3]) == 5 and int(now[1]) == 0 and int(now[9]) == 0


def test_ds_condxchg32_rtn_b64_writes_each_half_whose_bit_31_is_set():
    """Per 32-bit half: memory takes data[30:0] when data[31] is set and keeps its value otherwise;
    the old 64 bits come back (the ISA pseudocode as restated in docs/gfx1250_emulator.md §5)."""
    rng = np.random.default_rng(9)
    init = rng.integers(0, 1 << 64, N, dtype=np.uint64)
    src = rng.integers(0, 1 << 64, N, dtype=np.uint64)
    src[:4] = [0, 0x8000_0000, 0x8000_0000_0000_0000, M64]       # neither, low only, high only, both
    old, now = ds64("condxchg32_rtn_b64", init, src)
    want = []
    for o, d in zip(init.tolist(), src.tolist()):
        lo = d & 0x7FFFFFFF if d >> 31 & 1 else o & 0xFFFFFFFF
        hi = d >> 32 & 0x7FFFFFFF if d >> 63 else o >> 32
        want.append(hi << 32 | lo)
    np.testing.assert_array_equal(old, init)
    np.testing.assert_array_equal(now, np.array(want, np.uint64))
    assert int(now[1]) == int(init[1]) & 0xFFFFFFFF_00000000 and int(now[3]) == 0x7FFFFFFF_7FFFFFFF


def test_ds_condxchg32_address_drops_bits_2_to_0():
    """An address 4 bytes into the lane's qword still exchanges the whole aligned pair."""
    body = """ds_store_b64 v3, v[4:5]
  s_wait_dscnt 0
  v_add_nc_u32 v9, 4, v3
  ds_condxchg32_rtn_b64 v[10:11], v9, v[6:7]
  s_wait_dscnt 0
  ds_load_b64 v[12:13], v3
  s_wait_dscnt 0"""
    out = run(A, body, {3: L * 8, 4: 0x1111, 5: 0x2222, 6: 0x8000_0005, 7: 0x8000_0007}, [10, 11, 12, 13], lds=8 * N)
    assert [int(out[r][0]) for r in (10, 11, 12, 13)] == [0x1111, 0x2222, 5, 7]


def test_ds_cmpstore_b64_stores_data0_when_memory_equals_data1():
    init = (L * np.uint64(0x1_0000_0001)) + np.uint64(7)
    cmp = np.where(L % 3 == 0, init, init + np.uint64(1))          # every third lane matches
    new = np.full(N, 0xAAAA_BBBB_CCCC_DDDD, np.uint64)
    old, now = ds64("cmpstore_rtn_b64", init, new, cmp)
    np.testing.assert_array_equal(old, init)
    np.testing.assert_array_equal(now, np.where(L % 3 == 0, new, init))


@pytest.mark.parametrize("op,start,src", [("inc", 0, 5), ("dec", 3, 5), ("inc", 7, 3)])
def test_ds_u32_lanes_on_one_address_apply_in_lane_order(op, start, src):
    """All lanes hit address 0: lane l sees the value after lanes 0..l-1 (returning form), and
    the non-returning form leaves the same final value."""
    body = (f"ds_store_b32 v3, v4\n  s_wait_dscnt 0\n  ds_{op}_rtn_u32 v10, v3, v5\n  s_wait_dscnt 0\n"
            f"  ds_load_b32 v11, v3\n  s_wait_dscnt 0\n  ds_store_b32 v3, v4\n  s_wait_dscnt 0\n"
            f"  ds_{op}_u32 v3, v5\n  s_wait_dscnt 0\n  ds_load_b32 v12, v3\n  s_wait_dscnt 0")
    out = run(A, body, {3: 0, 4: start, 5: src}, [10, 11, 12], lds=64)
    rule, seen, x = (inc if op == "inc" else dec), [], start
    for _ in range(N):
        seen.append(x)
        x = rule(x, src)
    np.testing.assert_array_equal(out[10], seen)
    assert int(out[11][0]) == x and int(out[12][0]) == x
    if (op, start, src) == ("inc", 0, 5):   # by hand: 0 1 2 3 4 5 0 1 ...; 32 steps end at 32 % 6
        assert list(out[10][:8]) == [0, 1, 2, 3, 4, 5, 0, 1] and x == 2


def test_ds_cmpstore_b32_operand_order():
    """ds_cmpstore_b32 addr, data0, data1: data0 is the value stored, data1 the compare."""
    body = ("ds_store_b32 v3, v4\n  s_wait_dscnt 0\n  ds_cmpstore_rtn_b32 v10, v3, v5, v6\n  s_wait_dscnt 0\n"
            "  ds_load_b32 v11, v3\n  s_wait_dscnt 0")
    init = (L * 3 + 1).astype(np.uint32)
    cmp = np.where(L % 2 == 0, init, 0).astype(np.uint32)
    out = run(A, body, {3: L * 4, 4: init, 5: 0xBEEF, 6: cmp}, [10, 11], lds=4 * N)
    np.testing.assert_array_equal(out[10], init)
    np.testing.assert_array_equal(out[11], np.where(L % 2 == 0, 0xBEEF, init))


def test_ds_append_consume_count_active_lanes_once_per_wave():
    """The dword at the offset gains (append) / loses (consume) the number of active lanes; every
    active lane gets the value before, inactive lanes keep their register."""
    body = """v_mov_b32 v3, 0
  v_mov_b32 v4, 10
  ds_store_b32 v3, v4 offset:8
  s_wait_dscnt 0
  ds_append v10 offset:8
  s_wait_dscnt 0
  s_mov_b32 exec_lo, 0xff
  ds_consume v11 offset:8
  s_wait_dscnt 0
  s_mov_b32 exec_lo, -1
  ds_load_b32 v12, v3 offset:8
  s_wait_dscnt 0"""
    out = run(A, body, {11: 777}, [10, 11, 12], lds=64)
    assert set(out[10].tolist()) == {10}                               # 10 before; 10 + 32 after
    assert out[11].tolist() == [42] * 8 + [777] * 24                    # 42 before the consume of 8
    assert set(out[12].tolist()) == {34}


# ---- flat / global atomics ----------------------------------------------------------------------
# The atomics target the input rows of the test buffer (row k of lane l at s[2:3] + 4 (k N + l));
# a 64-bit slot l of the row pair (k, k + 1) is at s[2:3] + 4 k N + 8 l.

def mem_atomic(insn, init, data, width, ret=True):
    """Lane l's slot of `width` bits holds init[l]; run `insn vDST, vADDR, vDATA` (flat: a 64-bit
    address) and return (returned, memory after)."""
    rows = np.ascontiguousarray(init, np.uint64).view(np.uint32) if width == 64 else np.asarray(init, np.uint32)
    ins = {40: rows[:N], 41: rows[N:] if width == 64 else 0}
    dat = np.asarray(data, np.uint64).reshape(N, -1)          # [N, values] of `width` bits
    regs, r = [], 20
    for j in range(dat.shape[1]):
        for part in (halves(dat[:, j]) if width == 64 else (dat[:, j].astype(np.uint32),)):
            ins[r] = part
            regs.append(r)
            r += 1
    dreg = f"v[{regs[0]}:{regs[-1]}]" if len(regs) > 1 else f"v{regs[0]}"
    dst = "v[10:11]" if width == 64 else "v10"
    flat = insn.startswith("flat")
    addr = "v[30:31]" if flat else "v30"
    th = " th:TH_ATOMIC_RETURN" if ret else ""
    body = (f"v_lshlrev_b32 v30, {3 if width == 64 else 2}, v0\n"
            + ("  v_mov_b32 v31, 0\n  v_add_nc_u64 v[30:31], s[2:3], v[30:31]\n" if flat else "")
            + f"  {insn} {dst + ', ' if ret else ''}{addr}, {dreg}{'' if flat else ', s[2:3]'}{th}\n"
            + "  s_wait_loadcnt 0\n  s_wait_storecnt 0\n"
            + ("  global_load_b64 v[12:13], v30, s[2:3]" if width == 64 and not flat else
               "  global_load_b64 v[12:13], v[30:31], off" if width == 64 else
               "  global_load_b32 v12, v30, s[2:3]" if not flat else "  global_load_b32 v12, v[30:31], off")
            + "\n  s_wait_loadcnt 0")
    out = run(A, body, ins, [10, 11, 12, 13])
    if width == 64:
        return join(out[10], out[11]), join(out[12], out[13])
    return out[10], out[12]


@pytest.mark.parametrize("insn", ["global_atomic_inc_u64", "flat_atomic_inc_u64",
                                  "global_atomic_dec_u64", "flat_atomic_dec_u64"])
def test_inc_dec_u64(insn):
    rule = inc if "inc" in insn else dec
    old, now = mem_atomic(insn, EDGE64, SRC64, 64)
    np.testing.assert_array_equal(old, EDGE64)
    np.testing.assert_array_equal(now, [rule(int(o), int(s)) for o, s in zip(EDGE64, SRC64)])


def test_flat_and_b64_without_return():
    a = np.array([(0x1234_5678_9ABC_DEF0 * (i + 3)) & M64 for i in range(N)], np.uint64)
    b = np.full(N, 0xFFFF_0000_FFFF_0000, np.uint64)
    _, now = mem_atomic("flat_atomic_and_b64", a, b, 64, ret=False)
    np.testing.assert_array_equal(now, a & b)


@pytest.mark.parametrize("width", [32, 64])
def test_flat_cmpswap_data_is_src_then_cmp(width):
    init = (L * 11 + 5).astype(np.uint64)
    cmp = np.where(L % 2 == 1, init, init + np.uint64(1))
    src = np.full(N, 0xCAFE, np.uint64) + (np.uint64(1 << 40) if width == 64 else np.uint64(0))
    old, now = mem_atomic(f"flat_atomic_cmpswap_b{width}", init, np.stack([src, cmp], 1), width)
    np.testing.assert_array_equal(old, init)
    np.testing.assert_array_equal(now, np.where(L % 2 == 1, src, init))


def test_flat_cond_sub_u32_subtracts_only_without_wrap():
    init = (L * 3).astype(np.uint32)
    sub = np.full(N, 40, np.uint32)
    old, now = mem_atomic("flat_atomic_cond_sub_u32", init, sub, 32)
    np.testing.assert_array_equal(old, init)
    np.testing.assert_array_equal(now, [o - 40 if o >= 40 else o for o in init.tolist()])


def f64_bits(x):
    return np.asarray(x, np.float64).view(np.uint64)


@pytest.mark.parametrize("insn", ["global_atomic_add_f64", "flat_atomic_add_f64", "global_atomic_max_num_f64",
                                  "global_atomic_min_num_f64", "flat_atomic_max_f64", "flat_atomic_min_f64"])
def test_f64_atomics(insn):
    a = np.array([1.5, -2.0, 0.1, np.nan, 3.0, -0.0, 1e300, 2.0 ** -1074] * 4)
    b = np.array([0.25, 5.0, 0.2, 1.0, np.nan, 0.0, 1e300, 2.0 ** -1074] * 4)
    _, now = mem_atomic(insn, f64_bits(a), f64_bits(b), 64)
    got = now.view(np.float64)
    if "add" in insn:
        ref = [x + y for x, y in zip(a.tolist(), b.tolist())]           # Python floats: IEEE RNE
    else:   # minNum / maxNum: a NaN operand gives the other one
        f = max if "max" in insn else min
        ref = [y if math.isnan(x) else x if math.isnan(y) else f(x, y) for x, y in zip(a.tolist(), b.tolist())]
    np.testing.assert_array_equal(got, ref)     # NaN positions must agree too


def test_flat_max_num_f32():
    a = np.array([1.0, -3.0, np.nan, 2.0] * 8, np.float32)
    b = np.array([2.0, -4.0, 7.0, np.nan] * 8, np.float32)
    old, now = mem_atomic("flat_atomic_max_num_f32", a.view(np.uint32), b.view(np.uint32), 32)
    np.testing.assert_array_equal(old, a.view(np.uint32))
    np.testing.assert_array_equal(now.view(np.float32), np.array([2.0, -3.0, 7.0, 2.0] * 8, np.float32))


# ---- global addtid ---------------------------------------------------------------------------

def test_global_addtid_address_is_saddr_offset_plus_4_lane():
    """Address = saddr + offset + 4 * lane (LLVM's saddr syntax page for the addtid forms): the store
    under EXEC 0x55555555 lands one dword past the output row's lane-indexed dwords (offset 132), a plain
    lane-addressed load (v1 = 4 * lane) of the row sees lane l's value at l + 1, and the addtid load
    at the same offset gives each lane its own value back where it was stored."""
    x = np.random.default_rng(5).integers(1, 1 << 32, N, dtype=np.uint64).astype(np.uint32)
    body = """s_mov_b32 exec_lo, 0x55555555
  global_store_addtid_b32 v3, s[2:3] offset:132
  s_mov_b32 exec_lo, -1
  s_wait_storecnt 0
  global_load_addtid_b32 v4, s[2:3] offset:132
  global_load_b32 v5, v1, s[2:3] offset:128
  s_wait_loadcnt 0"""
    out = run(A, body, {3: x}, [4, 5])
    stored = np.where(np.arange(N) % 2 == 0, x, 0).astype(np.uint32)     # the even lanes of EXEC
    np.testing.assert_array_equal(out[5], np.concatenate([[0], stored[:-1]]).astype(np.uint32))
    np.testing.assert_array_equal(out[4][:-1], stored[:-1])   # lane 31's dword is past the row


# ---- scalar: PC, async wait ---------------------------------------------------------

def test_get_set_swap_pc_call_and_return():
    """s_get_pc_i64 gives the next instruction's address; s_swap_pc_i64 jumps to its source and
    leaves the address after itself (a call), s_set_pc_i64 jumps back (the return)."""
    body = """s_mov_b32 s11, 1
  s_mov_b32 s12, 0
  s_get_pc_i64 s[4:5]
  s_cmp_eq_u32 s12, 0
  s_cbranch_scc1 .Lmain
  s_add_co_i32 s11, s11, 10
  s_set_pc_i64 s[6:7]
.Lmain:
  s_mov_b32 s12, 1
  s_swap_pc_i64 s[6:7], s[4:5]
  s_add_co_i32 s11, s11, 100
  s_swap_pc_i64 s[6:7], s[4:5]
  v_mov_b32 v11, s11"""
    out = run(A, body, {}, [11])
    assert int(out[11][0]) == 1 + 10 + 100 + 10     # two calls, the code between them once


def test_asynccnt_wait_runs_with_nothing_outstanding():
    out = run(A, "s_wait_asynccnt 0\n  v_mov_b32 v10, 7", {}, [10])
    assert int(out[10][0]) == 7


# ---- VALU ------------------------------------------------------------------------------------

def test_tanh_f32_and_f16():
    x = np.array([0.0, -0.0, 0.5, -0.5, 1.0, 20.0, -20.0, np.inf, -np.inf, np.nan, 1e-30, 3.0] * 3, np.float32)[:N]
    out = run(A, "v_tanh_f32 v10, v3", {3: x.view(np.uint32)}, [10])
    got = out[10].view(np.float32)
    ref = np.array([math.tanh(v) if not math.isnan(v) else math.nan for v in x.tolist()], np.float32)
    np.testing.assert_array_equal(got, ref)
    assert got[5] == 1.0 and got[8] == -1.0 and np.signbit(got[1])
    h = x.astype(np.float16)
    out = run(A, "v_tanh_f16 v10, v3", {3: h.view(np.uint16).astype(np.uint32)}, [10])
    ref16 = np.array([math.tanh(v) if not math.isnan(v) else math.nan for v in h.astype(float).tolist()], np.float16)
    np.testing.assert_array_equal(out[10] & 0xFFFF, ref16.view(np.uint16))


BF = {1.0: 0x3F80, 2.0: 0x4000, 4.0: 0x4080, 8.0: 0x4100, 0.5: 0x3F00, 3.0: 0x4040, 0.25: 0x3E80}


@pytest.mark.parametrize("op,x,y", [("rcp", 2.0, 0.5), ("rcp", 4.0, 0.25), ("sqrt", 4.0, 2.0), ("rsq", 4.0, 0.5),
                                    ("log", 8.0, 3.0), ("exp", 3.0, 8.0), ("exp", 1.0, 2.0)])
def test_bf16_transcendentals_exact_cases(op, x, y):
    out = run(A, f"v_{op}_bf16 v10, v3", {3: 0xABCD0000 | BF[x]}, [10])   # the high half is ignored
    assert int(out[10][0]) == BF[y]


def test_bf16_rcp_rounds_once_to_nearest_even():
    """1/3 = 1.0101010...b * 2^-2: bf16 keeps 7 fraction bits 0101010, the rest (1010...b) is
    above half, so it rounds up: 0x3EAB."""
    out = run(A, "v_rcp_bf16 v10, v3", {3: BF[3.0]}, [10])
    assert int(out[10][0]) == 0x3EAB


@pytest.mark.parametrize("op", ["min_i16", "max_i16", "min_u16", "max_u16"])
def test_pk_add_min_max(op):
    a = np.array([1, 0x7FFF, 0xFFFF, 100] * 8, np.uint32)
    b = np.array([2, 1, 1, 0xFF9C] * 8, np.uint32)           # 0xFF9C = -100
    c = np.array([5, 0, 0x8000, 0] * 8, np.uint32)
    lo_hi = lambda v: v | (((v * 3) & 0xFFFF) << 16)   # noqa: E731  (the high halves differ)
    out = run(A, f"v_pk_add_{op} v10, v3, v4, v5", {3: lo_hi(a), 4: lo_hi(b), 5: lo_hi(c)}, [10])
    signed = op.endswith("i16")
    pick = min if op.startswith("min") else max

    def ref(x, y, z):
        s = (x + y) & 0xFFFF                                  # the add wraps
        if signed:
            sx = lambda v: v - 0x10000 if v >= 0x8000 else v  # noqa: E731
            return pick(sx(s), sx(z)) & 0xFFFF
        return pick(s, z)
    exp = [ref(int(x), int(y), int(z)) | (ref(int(x) * 3 & 0xFFFF, int(y) * 3 & 0xFFFF, int(z) * 3 & 0xFFFF) << 16)
           for x, y, z in zip(a, b, c)]
    np.testing.assert_array_equal(out[10], exp)


# ---- WMMA --------------------------------------------------------------------------------------
# Register layouts as the gfx1250 ISA's tables state them register-first (docs/gfx1250_emulator.md
# §3): lane l holds row (A) / column (B) l % 16, h = l // 16; 8-bit data: byte j of VGPR v is
# K = 32 (v // 4) + 16 h + 4 (v % 4) + j; 32-bit data: VGPR v is K = v + 2 h. D / C: VGPR r of lane
# l is row r + 8 h, column l % 16.

def wmma_regs(mat, bits):
    """[16, K] matrix (row = M for A, N for B) -> uint32 registers [nregs, 32] by the ISA table."""
    k = mat.shape[1]
    nregs = 16 * k * bits // 32 // 32
    regs = np.zeros((nregs, N), np.uint32)
    for l in range(N):
        h, row = l // 16, l % 16
        for v in range(nregs):
            if bits == 32:
                regs[v, l] = mat[row, v + 2 * h]
            elif bits == 16:    # half j of VGPR v is K = 16 (v // 4) + 8 h + 2 (v % 4) + j
                regs[v, l] = sum(int(mat[row, 16 * (v // 4) + 8 * h + 2 * (v % 4) + j]) << (16 * j) for j in range(2))
            else:
                regs[v, l] = sum(int(mat[row, 32 * (v // 4) + 16 * h + 4 * (v % 4) + j]) << (8 * j) for j in range(4))
    return regs


def d_regs(d):
    return np.array([[d[r + 8 * (l // 16), l % 16] for l in range(N)] for r in range(8)])


def run_wmma(insn, a_regs, b_regs, c, nc=8, nd=8):
    """c: [16, 16] uint32 fp32 bits, or (nc = 4) bf16 bits; returns D [16, 16] as fp32 bits, or
    (nd = 4) bf16 bits. 16-bit C / D: element i of a lane (row i + 8 h) is half i % 2 of VGPR i // 2."""
    na, nb = len(a_regs), len(b_regs)
    ins = {40 + i: a_regs[i] for i in range(na)}
    ins.update({50 + i: b_regs[i] for i in range(nb)})
    cr = d_regs(c)
    cr = cr if nc == 8 else cr[0::2] | (cr[1::2] << 16)
    ins.update({60 + r: cr[r] for r in range(nc)})
    body = f"{insn} v[70:{69 + nd}], v[40:{39 + na}], v[50:{49 + nb}], v[60:{59 + nc}]"
    out = run(A, body, ins, list(range(70, 70 + nd)))
    el = np.array([out[70 + r] for r in range(nd)], np.uint32)
    if nd == 4:
        el = np.stack([el & 0xFFFF, el >> 16], 1).reshape(8, N)
    d = np.zeros((16, 16), np.uint32)
    for r in range(8):
        for l in range(N):
            d[r + 8 * (l // 16), l % 16] = el[r][l]
    return d


@pytest.mark.parametrize("fa,fb", [("fp8", "fp8"), ("bf8", "fp8"), ("fp8", "bf8"), ("bf8", "bf8")])
def test_wmma_16x16x64_fp8(fa, fb):
    import torch

    from mxgemm import formats
    fmt = {"fp8": "e4m3", "bf8": "e5m2"}
    rng = np.random.default_rng(5)

    def codes(f):   # finite codes only
        c = rng.integers(0, 256, (16, 64)).astype(np.uint8)
        ok = np.isfinite(formats.decode(torch.from_numpy(c), fmt[f]).numpy())
        return np.where(ok, c, 0x38).astype(np.uint8)
    ca, cb = codes(fa), codes(fb)                              # A [M, K], B^T [N, K]
    va = formats.decode(torch.from_numpy(ca), fmt[fa]).double().numpy()
    vb = formats.decode(torch.from_numpy(cb), fmt[fb]).double().numpy()
    c = rng.normal(0, 4, (16, 16)).astype(np.float32)
    got = run_wmma(f"v_wmma_f32_16x16x64_{fa}_{fb}", wmma_regs(ca, 8), wmma_regs(cb, 8), c.view(np.uint32)).view(np.float32)
    # fp8 products span < 2^42, so the float64 sum is exact; one rounding to f32, then + C
    ref = ((va @ vb.T).astype(np.float32) + c).astype(np.float32)
    np.testing.assert_array_equal(got, ref)


def test_wmma_16x16x4_f32():
    rng = np.random.default_rng(6)
    a = (rng.integers(-2**12, 2**12, (16, 4)) / 64).astype(np.float32)
    b = (rng.integers(-2**12, 2**12, (16, 4)) / 32).astype(np.float32)       # B^T [N, K]
    c = rng.normal(0, 1, (16, 16)).astype(np.float32)
    got = run_wmma("v_wmma_f32_16x16x4_f32", wmma_regs(a.view(np.uint32), 32), wmma_regs(b.view(np.uint32), 32),
                   c.view(np.uint32)).view(np.float32)
    ref = ((a.astype(np.float64) @ b.T.astype(np.float64)).astype(np.float32) + c).astype(np.float32)
    np.testing.assert_array_equal(got, ref)
    assert not np.array_equal(got, ((a.astype(np.float64) @ b.astype(np.float64).T[[1, 0, 3, 2]])
                                    .astype(np.float32) + c))   # the K order of B matters to the test


@pytest.mark.parametrize("form", ["bf16", "bf16f32"])
def test_wmma_bf16_results(form):
    """The emulator's numerics for bf16 D (not documented): the fp32 form's result rounded once
    more to bf16 (RNE); the bf16 form's C is bf16, widened exactly."""
    import torch

    from mxgemm import formats
    rng = np.random.default_rng(7)
    a = torch.from_numpy(rng.integers(-512, 512, (16, 32)) / 64).to(torch.bfloat16)
    b = torch.from_numpy(rng.integers(-512, 512, (16, 32)) / 32).to(torch.bfloat16)    # B^T [N, K]
    c32 = torch.from_numpy(rng.normal(0, 50, (16, 16))).float()
    c = c32.to(torch.bfloat16).float() if form == "bf16" else c32
    bits = lambda t: t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)   # noqa: E731
    c_in = bits(c.to(torch.bfloat16)) if form == "bf16" else c.numpy().view(np.uint32)
    got = run_wmma(f"v_wmma_{form}_16x16x32_bf16", wmma_regs(bits(a), 16), wmma_regs(bits(b), 16), c_in,
                   nc=4 if form == "bf16" else 8, nd=4)
    exact = a.double().numpy() @ b.double().numpy().T                      # bf16 products: exact sums
    f32 = (exact.astype(np.float32) + c.numpy()).astype(np.float32)
    np.testing.assert_array_equal(got, formats.bf16_bits(torch.from_numpy(f32)).numpy())
