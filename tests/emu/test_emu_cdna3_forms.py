"""gfx950 forms real compilers emit that the emulator lacked (found by FlyDSL's own kernels in the
peer corpus): the CDNA3 single-block MFMAs v_mfma_f32_16x16x16_{f16,bf16}, 32x32x8_{f16,bf16},
16x16x4_f32, 32x32x2_f32 and the IEEE 754-2019 v_maximum3_f32 / v_minimum3_f32. Expected values:
numpy, with the operand layouts written out here from the CDNA3 ISA's tables (lane l holds row /
column l % M and K values (l // M) * kpl + i), not taken from the emulator."""
import numpy as np
import pytest
from asm_wave import run

N = 64
DT = {"f16": np.float16, "bf16": None, "f32": np.float32}


def bits_of(vals, ty):
    """Element bit patterns of float64 values exactly representable in ``ty``."""
    if ty == "bf16":
        return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
    return vals.astype(DT[ty]).view(np.uint16 if ty == "f16" else np.uint32).astype(np.uint32)


def lane_regs(mat, mn, k, ty):
    """uint32 [regs, 64] of an A operand [mn, k] (B: pass B^T): lane l's items are row l % mn,
    K = (l // mn) * kpl + i, packed little-endian into 32-bit registers."""
    kpl = k // (N // mn)
    lane = np.arange(N)
    items = np.stack([bits_of(mat[lane % mn, (lane // mn) * kpl + i], ty) for i in range(kpl)], 1)   # [64, kpl]
    if ty == "f32":
        return items.T
    return (items[:, 0::2] | (items[:, 1::2] << 16)).T.astype(np.uint32)


@pytest.mark.parametrize("m,k,ty", [(16, 16, "f16"), (16, 16, "bf16"), (32, 8, "f16"), (32, 8, "bf16"),
                                    (16, 4, "f32"), (32, 2, "f32")])
def test_cdna3_single_block_mfma(m, k, ty):
    rng = np.random.default_rng(m * 100 + k)
    a = rng.integers(-64, 64, (m, k)) / 8.0          # small dyadic values: every sum exact in float64
    b = rng.integers(-64, 64, (k, m)) / 8.0
    c = (rng.integers(-1000, 1000, (m, m)) / 16.0).astype(np.float32)
    ra, rb = lane_regs(a, m, k, ty), lane_regs(b.T, m, k, ty)
    nc = m * m // N
    lane = np.arange(N)
    # fp32 C / D layout (ISA 7.1.4.2): register r of lane l is D[row, l % m]
    row = [4 * (lane // 16) + r if m == 16 else (r % 4) + 8 * (r // 4) + 4 * (lane // 32) for r in range(nc)]
    creg = np.stack([c[row[r], lane % m] for r in range(nc)]).view(np.uint32)
    na, nb = len(ra), len(rb)
    va, vb, vc = 3, 3 + na, 3 + na + nb
    ins = {**{va + i: ra[i] for i in range(na)}, **{vb + i: rb[i] for i in range(nb)},
           **{vc + i: creg[i] for i in range(nc)}}
    reg = lambda r0, n: f"v{r0}" if n == 1 else f"v[{r0}:{r0 + n - 1}]"  # noqa: E731
    out = run("gfx950", f"v_mfma_f32_{m}x{m}x{k}_{ty} {reg(vc, nc)}, {reg(va, na)}, {reg(vb, nb)}, {reg(vc, nc)}\n"
                        "  s_nop 15\n  s_nop 15", ins, list(range(vc, vc + nc)))
    want = ((a @ b).astype(np.float32) + c).astype(np.float32)
    got = np.stack([out[vc + r] for r in range(nc)]).view(np.float32)
    assert np.array_equal(got, np.stack([want[row[r], lane % m] for r in range(nc)]))


def f32_bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("op", ["maximum3", "minimum3"])
def test_ieee_maximum3_minimum3(op):
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.0, 3.0], np.float32)
    rng = np.random.default_rng(7)
    a, b, c = (special[rng.integers(0, len(special), N)] for _ in range(3))
    out = run("gfx950", f"v_{op}_f32 v6, v3, v4, v5", {3: f32_bits(a), 4: f32_bits(b), 5: f32_bits(c)}, [6])
    got = out[6].view(np.float32)
    for i in range(N):
        x = [a[i], b[i], c[i]]
        if any(np.isnan(v) for v in x):
            assert np.isnan(got[i]), (i, x)
            continue
        pick = max(x) if op == "maximum3" else min(x)
        if pick == 0:         # IEEE 754-2019: -0 < +0
            zeros = [v for v in x if v == 0]
            neg = all(np.signbit(v) for v in zeros) if op == "maximum3" else any(np.signbit(v) for v in zeros)
            pick = np.float32(-0.0 if neg else 0.0)
        assert got[i].view(np.uint32) == np.float32(pick).view(np.uint32), (i, x, got[i])
