"""gfx950 sparse MFMA (v_smfmac_*) on the emulator against an independent numpy model written from
docs/gfx950_isa.md §10: a dense 4:2-sparse A is drawn, compressed into registers by the layout
written out below (not by mxgemm.emu), and the expected D is the dense product A*B summed exactly,
rounded once to fp32, plus D (int32 forms: wrapping). The modifiers include LLVM's assembler form
(mai-gfx950.s: cbsz:3 abid:1, which reads index set 0)."""
import numpy as np
import pytest
from asm_wave import run
from mfma_model import decode, exact_sum_f32

from mxgemm.emu import UnsupportedInstruction

PAIRS = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]      # the two kept places of four, ascending
FMT = {"f16": "f16", "bf16": "bf16", "fp8": "e4m3", "bf8": "e5m2", "i8": "i8"}
# gfx950's forms, then the CDNA3 ones it keeps (half the K: the calculator's own tables)
FORMS = [(f"f32_{sh}_{t}", t, t) for sh in ("16x16x64", "32x32x32", "16x16x32", "32x32x16") for t in ("f16", "bf16")]
FORMS += [(f"f32_{sh}_{a}_{b}", a, b) for sh in ("16x16x128", "32x32x64", "16x16x64", "32x32x32")
          for a in ("fp8", "bf8") for b in ("fp8", "bf8")]
FORMS += [(f"i32_{sh}_i8", "i8", "i8") for sh in ("16x16x128", "32x32x64", "16x16x64", "32x32x32")]


def codes(rng, ty, shape):
    """Finite element codes: 16-bit from N(0, 4) values, 8-bit floats any non-NaN/Inf code, i8 any."""
    if ty in ("f16", "bf16"):
        x = rng.normal(0, 4, shape).astype(np.float32)
        return (x.astype(np.float16).view(np.uint16) if ty == "f16" else (x.view(np.uint32) >> 16)).astype(np.uint32)
    c = rng.integers(0, 256, shape).astype(np.uint32)
    if ty == "fp8":
        c[(c & 0x7F) == 0x7F] = 0x38
    elif ty == "bf8":
        c[(c & 0x7C) == 0x7C] = 0x3C
    return c


def value(ty, c):
    return c.astype(np.uint8).view(np.int8).astype(np.float64) if ty == "i8" else decode(FMT[ty], c)


def pack(items, bits):
    """Lane-major items [64, count] -> VGPRs [count*bits/32, 64], item i at bits [bits*i + bits-1 : bits*i]."""
    per = 32 // bits
    regs = np.zeros((items.shape[1] // per, 64), np.uint32)
    for i in range(items.shape[1]):
        regs[i // per] |= items[:, i].astype(np.uint32) << np.uint32(bits * (i % per))
    return regs


def d_place(m, i):
    """(register, lane offset) of D row i (docs/gfx950_isa.md §1.4); the column adds to the lane."""
    return (i % 4, 16 * (i // 4)) if m == 16 else (i % 4 + 4 * (i // 8), 32 * ((i // 4) % 2))


def problem(form, ta, tb, index_set, seed):
    """Registers and the expected D of one form: (inputs {vgpr: [64]}, D registers, expected D [nregs, 64])."""
    rng = np.random.default_rng(seed)
    m, _, k = map(int, form.split("_")[1].split("x"))
    bits = 16 if ta in ("f16", "bf16") else 8
    kpl = k * m // 64                                    # K per lane: 8, 16 or 32
    a_codes, b_codes = codes(rng, ta, (m, k)), codes(rng, tb, (k, m))
    pairs = rng.integers(0, 6, (m, k // 4))
    a = np.zeros((m, k))
    a_items = np.zeros((64, kpl // 2), np.uint32)
    sel = np.zeros(64, np.uint32)
    for lane in range(64):
        row, k0 = lane % m, kpl * (lane // m)
        for g in range(kpl // 4):
            for j, place in enumerate(PAIRS[pairs[row, (k0 // 4) + g]]):
                kk = k0 + 4 * g + place
                a_items[lane, 2 * g + j] = a_codes[row, kk]
                a[row, kk] = value(ta, a_codes[row, kk])
                sel[lane] |= np.uint32(place << (4 * g + 2 * j))
    b_items = np.stack([b_codes[kpl * (lane // m) + np.arange(kpl), lane % m] for lane in range(64)])
    b = value(tb, b_codes)
    junk = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
    used = ((1 << kpl) - 1) << (kpl * index_set)
    index = (sel << np.uint32(kpl * index_set)) | (junk & np.uint32(~used & 0xFFFFFFFF))   # junk in the other sets
    nd = m * m // 64
    if ta == "i8":
        c = rng.integers(-2 ** 31, 2 ** 31, (nd, 64)).astype(np.int64)
        p = (a @ b).astype(np.int64)
    else:
        c = rng.integers(-64, 64, (nd, 64)).astype(np.float32)
        p = np.array([[exact_sum_f32(a[i] * b[:, j]) for j in range(m)] for i in range(m)], np.float32)
    want = np.zeros((nd, 64), np.uint32)
    for i in range(m):
        r, off = d_place(m, i)
        for j in range(m):
            if ta == "i8":
                want[r, off + j] = (int(p[i, j]) + int(c[r, off + j])) & 0xFFFFFFFF
            else:
                want[r, off + j] = (p[i, j] + c[r, off + j]).astype(np.float32).view(np.uint32)
    c_bits = (c & 0xFFFFFFFF).astype(np.uint32) if ta == "i8" else c.view(np.uint32)
    a_regs, b_regs = pack(a_items, bits), pack(b_items, bits)
    regs = {3: index}
    regs |= {4 + r: v for r, v in enumerate(a_regs)}                        # A: from v4 (2 or 4 VGPRs)
    regs |= {8 + r: v for r, v in enumerate(b_regs)}                        # B: from v8 (4 or 8 VGPRs)
    regs |= {16 + r: c_bits[r] for r in range(nd)}                          # C = D: from v16
    body = f"v[16:{15 + nd}], v[4:{3 + len(a_regs)}], v[8:{7 + len(b_regs)}], v3"
    return regs, body, list(range(16, 16 + nd)), want


def mods_of(form):
    """(cbsz, abid, index set read): LLVM's form first (CBSZ set: set 0 whatever ABID says), then
    ABID selecting the first and the last of the 32 / kpl sets."""
    m, _, k = map(int, form.split("_")[1].split("x"))
    last = 32 // (k * m // 64) - 1
    return [(3, 1, 0), (0, 0, 0)] + ([(0, last, last)] if last else [])


@pytest.mark.parametrize("form,ta,tb", FORMS, ids=[f[0] for f in FORMS])
def test_smfmac_matches_dense_model(form, ta, tb):
    for n, (cbsz, abid, index_set) in enumerate(mods_of(form)):
        regs, operands, outs, want = problem(form, ta, tb, index_set, seed=n + 7 * len(form))
        got = run("gfx950", f"v_smfmac_{form} {operands} cbsz:{cbsz} abid:{abid}", regs, outs)
        np.testing.assert_array_equal(np.stack([got[r] for r in outs]), want, err_msg=f"cbsz:{cbsz} abid:{abid}")


def test_smfmac_calculator_example():
    """AMD's calculator, CDNA3 16x16x32 f16: K[2][31] is in v0{50}.[7:4] (ABID 0) and v0{50}.[31:28]
    (CBSZ 0, ABID 3). Row 2 keeps 1.0 at K 29 and 2.0 at K 31 (places 1 and 3 of group 1); B is 1.0
    at K 29 only, so D[2][j] = 1.0 exactly when those bits put the first kept value at place 1."""
    for abid, shift in ((0, 4), (3, 28)):
        sel = np.zeros(64, np.uint32)
        sel[50] = np.uint32(0b1101 << shift)                      # first kept value: place 1, second: place 3
        a = np.zeros((2, 64), np.uint32)
        a[1, 50] = 0x4000_3C00                                    # lane 50's kept values 2, 3 (group 1): 1.0, 2.0
        b = np.zeros((4, 64), np.uint32)
        b[2, 48:64] = np.uint32(0x3C00 << 16)                     # K 29: lanes 48-63, item 5 = high half of VGPR 2
        regs = {3: sel} | {4 + r: a[r] for r in range(2)} | {8 + r: b[r] for r in range(4)} | {16 + r: 0 for r in range(4)}
        got = run("gfx950", f"v_smfmac_f32_16x16x32_f16 v[16:19], v[4:5], v[8:11], v3 abid:{abid}", regs, [16, 17, 18, 19])
        d = np.stack([got[r] for r in (16, 17, 18, 19)]).view(np.float32)
        assert (d[2, :16] == 1.0).all() and np.count_nonzero(d) == 16, abid   # row 2: VGPR 2, lanes 0-15


@pytest.mark.parametrize("form,abid", [("f32_16x16x64_f16", 2), ("i32_16x16x128_i8", 1)])
def test_smfmac_index_set_past_the_register(form, abid):
    """16-bit forms have two 16-bit index sets, 8-bit forms one 32-bit set (LLVM #193541)."""
    with pytest.raises(UnsupportedInstruction, match="index set"):
        run("gfx950", f"v_smfmac_{form} v[16:19], v[4:7], v[8:15], v3 abid:{abid}", {3: 0}, [16])
