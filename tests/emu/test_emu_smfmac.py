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
FORMS = ([(f"f32_{sh}_{t}", t, t) for sh in ("16x16x64", "32x32x32") for t in ("f16", "bf16")]
         + [(f"f32_{sh}_{a}_{b}", a, b) for sh in ("16x16x128", "32x32x64") for a in ("fp8", "bf8") for b in ("fp8", "bf8")]
         + [(f"i32_{sh}_i8", "i8", "i8") for sh in ("16x16x128", "32x32x64")])


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
    kpl = k * m // 64                                    # K per lane: 16 or 32
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
    index = sel << np.uint32(kpl * index_set) if kpl < 32 else sel
    if kpl < 32:                                         # the other set holds junk the form must ignore
        index |= junk & np.uint32(((1 << kpl) - 1) << (kpl * (1 - index_set)))
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
    regs = {3: index}
    regs |= {4 + r: v for r, v in enumerate(pack(a_items, bits))}           # A: v[4:7]
    regs |= {8 + r: v for r, v in enumerate(pack(b_items, bits))}           # B: v[8:15]
    regs |= {16 + r: c_bits[r] for r in range(nd)}                          # C = D: v[16:...]
    return regs, list(range(16, 16 + nd)), want


def mods_of(ta):
    """(cbsz, abid, index set read): LLVM's form first; 16-bit forms also select set 1 by ABID."""
    return [(3, 1, 0), (0, 0, 0)] + ([(0, 1, 1)] if ta in ("f16", "bf16") else [])


@pytest.mark.parametrize("form,ta,tb", FORMS, ids=[f[0] for f in FORMS])
def test_smfmac_matches_dense_model(form, ta, tb):
    for n, (cbsz, abid, index_set) in enumerate(mods_of(ta)):
        regs, outs, want = problem(form, ta, tb, index_set, seed=n + 7 * len(form))
        d = f"v[{outs[0]}:{outs[-1]}]"
        got = run("gfx950", f"v_smfmac_{form} {d}, v[4:7], v[8:15], v3 cbsz:{cbsz} abid:{abid}", regs, outs)
        np.testing.assert_array_equal(np.stack([got[r] for r in outs]), want, err_msg=f"cbsz:{cbsz} abid:{abid}")


@pytest.mark.parametrize("form,abid", [("f32_16x16x64_f16", 2), ("i32_16x16x128_i8", 1)])
def test_smfmac_index_set_past_the_register(form, abid):
    """16-bit forms have two 16-bit index sets, 8-bit forms one 32-bit set (LLVM #193541)."""
    with pytest.raises(UnsupportedInstruction, match="index set"):
        run("gfx950", f"v_smfmac_{form} v[16:19], v[4:7], v[8:15], v3 abid:{abid}", {3: 0}, [16])
